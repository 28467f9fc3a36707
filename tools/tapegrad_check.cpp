// tapegrad-check: the 50-digit gradient check of a named built-in model at a chosen size, or of a
// saved tape (io/tape_file.hpp: the tape a program recorded and saved, --tape FILE), in one
// process or, built with MPI (TAPEGRAD_WITH_MPI), spread over the ranks of `mpirun -np N`
// unchanged (check/distributed.hpp). Rank 0 prints progress to stderr and the report to stdout.
// --save-tape FILE writes a model's recorded tape instead of checking it; --certify certifies the
// gradient in 50-digit intervals instead (check/certify.hpp, built where MPFI is). See
// `tapegrad-check --help`.
#include "models/retrieval.hpp"
#include "tapegrad.hpp"
#include "tools/options.hpp"

#if TAPEGRAD_WITH_CERTIFY
#include "check/certify.hpp"
#endif

#if TAPEGRAD_WITH_MPI
#include "check/distributed.hpp"

#include <boost/mpi/environment.hpp>
#endif

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace {

namespace po = boost::program_options;
using namespace tapegrad;

constexpr int exit_ok = 0, exit_error = 1, exit_usage = cli::exit_usage, exit_check_failed = 3;

constexpr std::string_view description = R"(tapegrad-check: the 50-digit gradient check of a built-in model or a saved tape.

Models (leaves in brackets; J is the scalar checked):
  attention   single-head attention softmax(Q K^T / sqrt(D)) V, Q = X W_Q, K = X W_K, V = X W_V
              [X (T x D), W_Q, W_K, W_V (D x D)], J = sum(O * O)
  multihead   causal multi-head attention with output projection, Y = merge_heads(O_h) W_O
              [X (T x D), W_Q, W_K, W_V, W_O (D x D)], J = sum(Y * Y)
  retrieval   the retrieval model of models/retrieval.hpp on a batch of sequences of T tokens
              [E, P, W_Q, W_K, W_V, W_O, W_U], J = cross-entropy of the answers
Values are drawn from --seed (uniform, weights scaled by sqrt(3/D)); the checker uses the same seed.

--tape FILE checks a saved tape instead (a Tape<double> or Tape<float> a program saved with
tapegrad::save_tape, io/tape_file.hpp): its leaves that need a gradient are checked, J is its
output. A tape that holds a user's ops (saved as "user:<name>") needs them: --ops LIBRARY loads a
shared library whose extern "C" tapegrad_register_ops() registers them (autodiff/registry.hpp).
--save-tape FILE writes the chosen model's tape (recorded in double) and checks nothing.

--certify certifies the gradient instead of checking it (check/certify.hpp): the model's tape
(recorded in double) or the saved tape is re-run in 50-digit intervals, and each gradient element
is certified (its VJP and its exact derivative provably within the bound printed), WRONG (provably
apart), or undecided at a kink (the node named); so is each branch of a leaf with several consumers.
No step, no tolerance; one interval pass per element, in one process. Exit status 3 when an element
is wrong.

Full mode compares every coordinate of every leaf (and every branch of a leaf with several
consumers); fast mode compares random directions and falls back to full when one disagrees.
Under `mpirun -np N` (when built with MPI) the finite differences are shared among the ranks,
balanced by their replay cost, and the report is the one a single process prints for the same
seed. Progress (derivatives done, estimated time left) goes to stderr on rank 0.

Exit status: 0 the check passed; 1 error; 2 bad command line; 3 the check failed.

Options)";

struct Settings {
    std::string model = "multihead";
    std::size_t tokens = 8, width = 16, heads = 2, batch = 2;
    bool fast = false, quiet = false, loads = false, plan = false, certify = false;
    std::size_t directions = 3;
    std::uint64_t seed = CheckOptions{}.seed;
    unsigned threads = 0;
    std::string tape;       // --tape: check this saved tape, not a model
    std::string save_tape;  // --save-tape: write the model's tape, check nothing
    std::vector<std::string> ops;  // --ops: shared libraries of a user's ops the saved tape holds
};

// A tensor of uniform values in [−a, a), from the portable draw of models/retrieval.hpp.
Tensor<double> uniform(const Shape& shape, double a, std::mt19937_64& generator) {
    Tensor<double> t(shape);
    for (double& x : t.data()) x = draw_uniform(generator, a);
    return t;
}

// What a progress line counts: each rank's share of the derivatives and the whole (the check), or
// the elements done (a certification, in one process).
enum class ProgressCount { by_rank, by_element };

// Progress lines on stderr, at most one every two seconds per stage (and the last one).
std::function<void(const CheckProgress&)> progress_printer(ProgressCount count) {
    auto last = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
    return [last, count](const CheckProgress& p) {
        const auto now = std::chrono::steady_clock::now();
        if (p.done != p.mine && now - *last < std::chrono::seconds(2)) return;
        *last = now;
        const double left = p.seconds / static_cast<double>(p.done) * static_cast<double>(p.mine - p.done);
        if (count == ProgressCount::by_rank) {
            fmt::print(stderr,
                       "{}: {} of {} derivatives on this rank ({} on all ranks), {:.1f} s, about {:.0f} s left\n",
                       p.stage, p.done, p.mine, p.all, p.seconds, left);
        } else {
            fmt::print(stderr, "{}: {} of {} derivatives, {:.1f} s, about {:.0f} s left\n", p.stage, p.done, p.all,
                       p.seconds, left);
        }
    };
}

// One process, or every rank of the MPI world.
struct Processes {
#if TAPEGRAD_WITH_MPI
    boost::mpi::communicator world;
    int rank() const { return world.rank(); }
    int size() const { return world.size(); }
#else
    int rank() const { return 0; }
    int size() const { return 1; }
#endif

    // Refuses `what` under mpirun with more than one rank: it is not shared among ranks.
    void require_one(std::string_view what) const {
        if (size() > 1) {
            throw usage_error(fmt::format(
                "{} runs in one process, not shared among ranks: run it without mpirun (this run has {} ranks)",
                what, size()));
        }
    }

    // The check of `checked`: a graph and its leaves, or a recorded (loaded) tape and its J, every
    // rank holding the same.
    template <class... Checked>
    CheckReport check(const CheckOptions& options, bool print_loads, const Checked&... checked) {
#if TAPEGRAD_WITH_MPI
        std::vector<RankLoad> loads;
        CheckReport report = check_gradients(checked..., options, world, &loads);
        if (print_loads && rank() == 0) print(loads);
        return report;
#else
        (void)print_loads;
        return check_gradients(checked..., options);
#endif
    }

#if TAPEGRAD_WITH_MPI
    static void print(const std::vector<RankLoad>& loads) {
        double total = 0, slowest = 0, total_cpu = 0, slowest_cpu = 0;
        for (std::size_t r = 0; r < loads.size(); ++r) {
            fmt::print(stderr, "rank {}: {} derivatives, estimated cost {:.4g}, {:.3f} s, {:.3f} s of CPU\n", r,
                       loads[r].derivatives, loads[r].cost, loads[r].seconds, loads[r].cpu_seconds);
            total += loads[r].seconds;
            slowest = std::max(slowest, loads[r].seconds);
            total_cpu += loads[r].cpu_seconds;
            slowest_cpu = std::max(slowest_cpu, loads[r].cpu_seconds);
        }
        const double ranks = static_cast<double>(loads.size());
        fmt::print(stderr, "ranks: {}, mean {:.3f} s, slowest {:.3f} s ({:+.1f}% of the mean); CPU: mean {:.3f} s, "
                   "slowest {:.3f} s ({:+.1f}%)\n", loads.size(), total / ranks, slowest,
                   100.0 * (slowest / (total / ranks) - 1.0), total_cpu / ranks, slowest_cpu,
                   100.0 * (slowest_cpu / (total_cpu / ranks) - 1.0));
    }
#endif
};

// --plan: what a full check would take, without taking it (plan_check, check/gradcheck.hpp): the
// derivatives by leaf and branch, their estimated replay cost (what the ranks' shares balance) and
// the measured CPU time of a few of each, which predict the whole check's time on one thread (the
// model in docs/performance.md).
template <std::size_t N, class Graph>
void print_plan(Graph& graph, const NamedTensor (&leaves)[N]) {
    const CheckPlan plan = plan_check(graph, leaves);
    for (const CheckPlan::Group& g : plan.groups) {
        fmt::print("  {} coordinates of {}{}: {:.3g} ms of CPU each (measured, {} samples), estimated cost {:.4g} each\n",
                   g.derivatives, g.leaf, g.branch ? " (one branch)" : "", 1e3 * g.cpu_seconds_each, g.samples,
                   g.cost / static_cast<double>(g.derivatives));
    }
    fmt::print("plan: {} derivatives (coordinates and branches), estimated replay cost {:.4g}, predicted CPU time on "
               "one thread {:.4g} s; {} bytes of differences exchanged in all (6 50-digit numbers each)\n",
               plan.derivatives(), plan.cost(), plan.predicted_cpu_seconds(), plan.derivatives() * 6 * 38);
}

CheckOptions options_of(const Settings& s) {
    CheckOptions options;
    options.mode = s.fast ? CheckOptions::Mode::fast : CheckOptions::Mode::full;
    options.directions = s.directions;
    options.seed = s.seed;
    if (!s.quiet) options.progress = progress_printer(ProgressCount::by_rank);
    return options;
}

// The model recorded on `tape` by ordinary code, its leaves named; returns J.
template <std::size_t N, class Graph>
Var<double> record_model(Tape<double>& tape, Graph& graph, const NamedTensor (&leaves)[N]) {
    std::array<Var<double>, N> vars;
    for (std::size_t i = 0; i < N; ++i) vars[i] = tape.leaf(leaves[i].value, leaves[i].name);
    return graph(vars);
}

// --save-tape: the model's recorded tape, saved.
template <std::size_t N, class Graph>
void save_model_tape(const Settings& s, Graph& graph, const NamedTensor (&leaves)[N]) {
    Tape<double> tape;
    const Var<double> J = record_model(tape, graph, leaves);
    save_tape(s.save_tape, tape, J);
    fmt::print("saved the {} model's tape ({} nodes, J = {}) to {}\n", s.model, tape.size(), J.value()[0], s.save_tape);
}

// What one run reports: a finite-difference check's report, or a certification's (--certify);
// nothing after --plan (which only prints what the check would take) and --save-tape.
#if TAPEGRAD_WITH_CERTIFY
using Outcome = std::variant<std::monostate, CheckReport, CertificationReport>;
#else
using Outcome = std::variant<std::monostate, CheckReport>;
#endif

#if TAPEGRAD_WITH_CERTIFY
// --certify: a recorded tape certified in one process, with the check's progress lines.
template <Scalar S>
Outcome certify_tape(const Processes& processes, const Settings& s, const Tape<S>& tape, const Var<S>& J) {
    processes.require_one("--certify");
    CertifyOptions options;
    if (!s.quiet) options.progress = progress_printer(ProgressCount::by_element);
    return certify_gradients(tape, J, options);
}
#endif

// The check of one model.
template <std::size_t N, class Graph>
Outcome check_model(Processes& processes, const Settings& s, Graph graph, const NamedTensor (&leaves)[N]) {
#if TAPEGRAD_WITH_CERTIFY
    if (s.certify) {
        Tape<double> tape;
        const Var<double> J = record_model(tape, graph, leaves);
        return certify_tape(processes, s, tape, J);
    }
#endif
    if (s.plan) {
        if (processes.rank() == 0) print_plan(graph, leaves);
        return {};
    }
    if (!s.save_tape.empty()) {
        if (processes.rank() == 0) save_model_tape(s, graph, leaves);
        return {};
    }
    return processes.check(options_of(s), s.loads, graph, leaves);
}

// --tape: the user's ops loaded (--ops), then the saved tape loaded (on every rank) into a tape of
// its scalar type and checked.
template <Scalar S>
Outcome check_loaded(Processes& processes, const Settings& s) {
    Tape<S> tape;
    const Var<S> J = load_tape(s.tape, tape);
    if (!s.quiet && processes.rank() == 0) {
        fmt::print(stderr, "loaded {} ({} nodes, J = {})\n", s.tape, tape.size(), to_double(J.value()[0]));
    }
#if TAPEGRAD_WITH_CERTIFY
    if (s.certify) return certify_tape(processes, s, tape, J);
#endif
    return processes.check(options_of(s), s.loads, tape, J);
}

Outcome check_saved_tape(Processes& processes, const Settings& s) {
    for (const std::string& library : s.ops) {
        const std::vector<std::string> names = load_ops(library);
        if (processes.rank() == 0 && !s.quiet) fmt::print(stderr, "loaded from {}: {}\n", library, fmt::join(names, ", "));
    }
    return tape_file_scalar(s.tape) == TapeFileScalar::float32 ? check_loaded<float>(processes, s)
                                                               : check_loaded<double>(processes, s);
}

Outcome check_attention(Processes& processes, const Settings& s, bool multihead) {
    std::mt19937_64 generator(s.seed);
    const double a = std::sqrt(3.0 / static_cast<double>(s.width));
    const Shape weight{s.width, s.width};
    const Tensor<double> X = uniform(Shape{s.tokens, s.width}, 1.0, generator);
    const Tensor<double> W_Q = uniform(weight, a, generator), W_K = uniform(weight, a, generator),
                         W_V = uniform(weight, a, generator);
    if (!multihead) {
        const NamedTensor leaves[] = {{"X", X}, {"W_Q", W_Q}, {"W_K", W_K}, {"W_V", W_V}};
        return check_model(processes, s, [](auto in) {
            const auto O = attention(in[0], in[1], in[2], in[3]).O;
            return sum(O * O);
        }, leaves);
    }
    const NamedTensor leaves[] = {{"X", X}, {"W_Q", W_Q}, {"W_K", W_K}, {"W_V", W_V}, {"W_O", uniform(weight, a, generator)}};
    MultiHeadOptions options;
    options.heads = s.heads;
    return check_model(processes, s, [&](auto in) {
        using T = typename decltype(in)::value_type::scalar_type;
        const auto Y = multihead_attention(in[0], MultiHeadWeights<T>{in[1], in[2], in[3], in[4]}, options).Y;
        return sum(Y * Y);
    }, leaves);
}

Outcome check_retrieval(Processes& processes, const Settings& s) {
    if (s.tokens < 2) throw value_error("tapegrad-check: the retrieval model needs --tokens of at least 2");
    RetrievalConfig config;
    config.pairs = s.tokens - 1;
    config.keys = std::max(config.keys, config.pairs);
    config.width = s.width;
    config.heads = s.heads;
    config.seed = s.seed;
    std::mt19937_64 generator(s.seed);
    const RetrievalBatch batch = make_retrieval_batch(config, s.batch, generator);
    const RetrievalParameters p = RetrievalParameters::initial(config);
    const NamedTensor leaves[] = {{"E", p.E},     {"P", p.P},     {"W_Q", p.W_Q}, {"W_K", p.W_K},
                                  {"W_V", p.W_V}, {"W_O", p.W_O}, {"W_U", p.W_U}};
    return check_model(processes, s, [&](auto in) {
        using T = typename decltype(in)::value_type::scalar_type;
        return retrieval_loss(RetrievalVars<T>{in[0], in[1], in[2], in[3], in[4], in[5], in[6]}, batch, config.heads);
    }, leaves);
}

// Refuses a check that cannot fit in this machine's memory, before anything is allocated. A lower
// bound: the T×T scores S and weights A of every head and sequence, on the 50-digit tape and on
// the double tape (the check holds more: the other nodes, gradients, the replays' workspaces).
void require_memory_for(const Settings& s) {
    const double heads = s.model == "attention" ? 1.0 : static_cast<double>(s.heads);
    const double sequences = s.model == "retrieval" ? static_cast<double>(s.batch) : 1.0;
    const double tokens = static_cast<double>(s.tokens);
    const double scores = sequences * heads * tokens * tokens;
    cli::require_memory(scores * 2 * (sizeof(mp50) + sizeof(double)),
                        "the T x T scores and weights of the 50-digit and double tapes",
                        fmt::format("--model {} --tokens {}{}", s.model, s.tokens,
                                    s.model == "retrieval" ? fmt::format(" --batch {}", s.batch) : ""));
}

// The settings from the command line; nullopt after --help.
std::optional<Settings> parse(int argc, char** argv) {
    Settings s;
    po::options_description options{std::string(description)};
    using cli::integer;
    constexpr std::size_t one = 1;
    options.add_options()("help,h", "this text")(
        "model", po::value(&s.model)->default_value(s.model), "attention, multihead or retrieval")(
        "tokens,T", integer(&s.tokens, one)->default_value(s.tokens), "sequence length T")(
        "width,D", integer(&s.width, one)->default_value(s.width), "model width D")(
        "heads,H", integer(&s.heads, one)->default_value(s.heads), "heads (multihead, retrieval)")(
        "batch,B", integer(&s.batch, one)->default_value(s.batch), "sequences in the batch (retrieval)")(
        "fast", po::bool_switch(&s.fast), "fast mode: random directions, full check only when one disagrees")(
        "directions", integer(&s.directions, one)->default_value(s.directions), "directions in fast mode")(
        "seed", integer(&s.seed, std::uint64_t{0})->default_value(s.seed), "values and directions")(
        "threads", integer(&s.threads, 0u, cli::max_threads)->default_value(s.threads), "threads per process (0: one per core)")(
        "quiet,q", po::bool_switch(&s.quiet), "no progress on stderr")(
        "loads", po::bool_switch(&s.loads), "each rank's share and time on stderr (with MPI)")(
        "plan", po::bool_switch(&s.plan), "print the derivatives a full check takes and their estimated cost; check nothing")(
        "certify", po::bool_switch(&s.certify), "certify the gradient in 50-digit intervals instead of checking it (one process)")(
        "tape", po::value(&s.tape), "check this saved tape instead of a model")(
        "save-tape", po::value(&s.save_tape), "write the model's recorded tape to this file; check nothing")(
        "ops", po::value(&s.ops)->composing(),
        "load a user's ops from this shared library before loading --tape (repeatable; autodiff/registry.hpp, load_ops)");
    po::variables_map values;
    po::store(cli::options_only(argc, argv, options, "tapegrad-check"), values);
    if (values.count("help")) {
        fmt::print("{}\n", fmt::streamed(options));
        return std::nullopt;
    }
    po::notify(values);
    if (s.certify) {
#if !TAPEGRAD_WITH_CERTIFY
        throw po::error("--certify: this tapegrad-check was built without certified gradients (MPFI, libmpfi-dev)");
#endif
        for (const char* check_option : {"fast", "directions", "loads", "plan", "save-tape"}) {
            if (values.count(check_option) && !values[check_option].defaulted()) {
                throw po::error(fmt::format("--{} belongs to the finite-difference check; --certify certifies every "
                                            "element in intervals", check_option));
            }
        }
    }
    if (!s.tape.empty()) {
        for (const char* model_option : {"model", "tokens", "width", "heads", "batch", "plan", "save-tape"}) {
            if (values.count(model_option) && !values[model_option].defaulted()) {
                throw po::error(fmt::format("--{} describes a built-in model; --tape checks the saved tape as it is",
                                            model_option));
            }
        }
        return s;
    }
    if (!s.ops.empty()) throw po::error("--ops loads the user's ops a saved tape holds: use it with --tape");
    if (!s.save_tape.empty() && s.plan) throw po::error("--plan and --save-tape: choose one");
    if (s.model != "attention" && s.model != "multihead" && s.model != "retrieval") {
        throw po::error(fmt::format("unknown --model '{}' (attention, multihead or retrieval)", s.model));
    }
    if (s.width % s.heads != 0) {
        throw po::error(fmt::format("--width must be a multiple of --heads (D {}, heads {})", s.width, s.heads));
    }
    require_memory_for(s);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
#if TAPEGRAD_WITH_MPI
    const boost::mpi::environment environment(argc, argv);
#endif
    std::optional<Settings> settings;
    try {
        settings = parse(argc, argv);
    } catch (const std::exception& e) {
        fmt::print(stderr, "tapegrad-check: {} (see --help)\n", e.what());
        return exit_usage;
    }
    if (!settings) return exit_ok;
    Processes processes;
    try {
        set_threads(settings->threads);
        const Outcome outcome =
            !settings->tape.empty()           ? check_saved_tape(processes, *settings)
            : settings->model == "retrieval" ? check_retrieval(processes, *settings)
                                              : check_attention(processes, *settings, settings->model == "multihead");
        return std::visit(
            [&](const auto& report) {
                using Report = std::decay_t<decltype(report)>;
                if constexpr (std::is_same_v<Report, std::monostate>) {
                    return exit_ok;  // --plan, --save-tape
                } else {
                    if (processes.rank() == 0) fmt::print("{}\n", report.summary());
                    if constexpr (std::is_same_v<Report, CheckReport>) {
                        return report.passed ? exit_ok : exit_check_failed;
                    } else {
                        return report.passed() ? exit_ok : exit_check_failed;
                    }
                }
            },
            outcome);
    } catch (const std::exception& e) {
        fmt::print(stderr, "tapegrad-check: {}\n", e.what());
        return exit_error;
    }
}
