// tapegrad-audit: the precision audit (check/audit.hpp) of a saved tape (io/tape_file.hpp: a
// Tape<float> or Tape<double> some program recorded and saved, --tape FILE) or of a built-in float32
// attention block at a chosen size: which node loses the digits of the gradients, ranked, with each
// leaf's gradient error, as a table on stdout and optionally JSON and a coloured DOT picture.
// --storage bfloat16 / float16 asks what the same graph would lose kept in 16 bits. See --help.
#include "autodiff/registry.hpp"  // load_ops (--ops)
#include "tapegrad_record.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <cstdio>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace po = boost::program_options;
using namespace tapegrad;

constexpr int exit_ok = 0, exit_error = 1, exit_usage = cli::exit_usage;

constexpr std::string_view description =
    R"(tapegrad-audit: which node of a float32 (or double) graph loses the digits of its gradients.

The graph is re-run at 50 digits on the same leaves and constants (the truth). Each node is
ranked by the digits it loses itself: its op evaluated in the tape's precision on exact inputs,
forward and VJP. Each leaf's gradient error is given with the node that contributes most to it.

Graphs:
  --tape FILE   a saved tape (tapegrad::save_tape), audited at its own precision; one that
                holds a user's ops needs --ops LIBRARY (its tapegrad_register_ops registers them)
  (default)     the attention block, recorded in float32 from --seed:
                H = layer_norm(X), O = causal attention(H W_Q, H W_K, H W_V),
                R = X + gelu(O W_O), J = sum of each row's logsumexp(R)
                [X (T x D), gain, bias (D), W_Q, W_K, W_V (D x d), W_O (d x D)]

--storage bfloat16 or float16 keeps every value and gradient in that format, each op computing
in the tape's precision: what the graph would lose in 16-bit training.

--products bfloat16 records the block with bfloat16 products (Tape::set_product_precision: every
matmul reads bfloat16 and accumulates in float32, as torch.autocast): the audit then measures the
actual bfloat16 run, each leaf's error beside the error predicted for it without 50 digits.

Exit status: 0 done; 1 error; 2 bad command line.

Options)";

struct Settings {
    std::size_t tokens = 64, width = 64, head_width = 64, rows = 20;
    std::uint64_t seed = 1;
    unsigned threads = 1;
    std::string tape, storage = "recorded", products = "tape", json, dot;
    std::vector<std::string> ops;  // --ops: shared libraries of a user's ops the saved tape holds
    bool quiet = false;
};

Storage storage_of(const std::string& name) {
    const std::optional<Storage> storage = storage_named(name);
    if (!storage) throw po::error(fmt::format("--storage '{}': recorded, bfloat16 or float16", name));
    return *storage;
}

Tensor<float> uniform(const Shape& shape, double low, double high, std::mt19937_64& generator) {
    std::uniform_real_distribution<double> draw(low, high);
    Tensor<float> t(shape);
    for (float& x : t.data()) x = static_cast<float>(draw(generator));
    return t;
}

template <Scalar S>
void report(const Settings& s, const Tape<S>& tape, const Var<S>& J) {
    AuditOptions options;
    options.storage = storage_of(s.storage);
    options.progress = !s.quiet;
    const PrecisionAudit audit = audit_precision(tape, J, options);
    fmt::print("{}", audit.table(s.rows));
    if (!s.json.empty()) write_file_atomically(s.json, audit.json(), "tapegrad-audit");
    if (!s.dot.empty()) write_file_atomically(s.dot, audit.dot(), "tapegrad-audit");
}

void audit_block(const Settings& s) {
    std::mt19937_64 generator(s.seed);
    const double a = std::sqrt(3.0 / static_cast<double>(s.width));
    Tape<float> tape;
    tape.set_product_precision(s.products == "bfloat16" ? ProductPrecision::bfloat16 : ProductPrecision::tape);
    const auto X = tape.leaf(uniform(Shape{s.tokens, s.width}, -1, 1, generator), "X");
    const auto gain = tape.leaf(uniform(Shape{s.width}, 0.5, 1.5, generator), "gain");
    const auto bias = tape.leaf(uniform(Shape{s.width}, -0.5, 0.5, generator), "bias");
    const Shape projection{s.width, s.head_width};
    const auto W_Q = tape.leaf(uniform(projection, -a, a, generator), "W_Q");
    const auto W_K = tape.leaf(uniform(projection, -a, a, generator), "W_K");
    const auto W_V = tape.leaf(uniform(projection, -a, a, generator), "W_V");
    const auto W_O = tape.leaf(uniform(Shape{s.head_width, s.width}, -a, a, generator), "W_O");
    const Var<float> O = causal_attention(layer_norm(X, gain, bias), W_Q, W_K, W_V).O;
    const Var<float> J = sum(logsumexp(add(X, gelu(matmul(O, W_O))), 1));
    if (!s.quiet)
        fmt::print(stderr, "attention block T = {}, D = {}, d = {}, products {}: {} nodes\n", s.tokens, s.width,
                   s.head_width, s.products, tape.size());
    report(s, tape, J);
}

// --ops: the user's ops a saved tape holds, registered before the file is read.
void load_user_ops(const Settings& s) {
    for (const std::string& library : s.ops) {
        const std::vector<std::string> names = load_ops(library);
        if (!s.quiet) fmt::print(stderr, "loaded from {}: {}\n", library, fmt::join(names, ", "));
    }
}

template <Scalar S>
void audit_saved(const Settings& s) {
    Tape<S> tape;
    const Var<S> J = load_tape(s.tape, tape);
    if (!s.quiet) fmt::print(stderr, "loaded {} ({} nodes)\n", s.tape, tape.size());
    report(s, tape, J);
}

std::optional<Settings> parse(int argc, char** argv) {
    Settings s;
    po::options_description options{std::string(description)};
    using cli::integer;
    constexpr std::size_t one = 1;
    options.add_options()("help,h", "this text")("tape", po::value(&s.tape), "audit this saved tape")(
        "tokens,T", integer(&s.tokens, one)->default_value(s.tokens), "the block's sequence length T")(
        "width,D", integer(&s.width, one)->default_value(s.width), "the block's width D")(
        "head-width,d", integer(&s.head_width, one)->default_value(s.head_width), "the block's projection width d")(
        "seed", integer(&s.seed, std::uint64_t{0})->default_value(s.seed), "the block's values")(
        "storage", po::value(&s.storage)->default_value(s.storage), "recorded, bfloat16 or float16")(
        "products", po::value(&s.products)->default_value(s.products), "the block's products: tape (float32) or bfloat16")(
        "rows", integer(&s.rows, one)->default_value(s.rows), "nodes shown in the ranked table")(
        "json", po::value(&s.json), "write the whole audit as JSON to this file")(
        "dot", po::value(&s.dot), "write the tape's picture coloured by local error (Graphviz DOT) to this file")(
        "threads", integer(&s.threads, 0u, cli::max_threads)->default_value(s.threads), "threads (0: one per core)")(
        "quiet,q", po::bool_switch(&s.quiet), "no progress on stderr")(
        "ops", po::value(&s.ops)->composing(),
        "load a user's ops from this shared library before loading --tape (repeatable; autodiff/registry.hpp, load_ops)");
    po::variables_map values;
    po::store(cli::options_only(argc, argv, options, "tapegrad-audit"), values);
    if (values.count("help")) {
        fmt::print("{}\n", fmt::streamed(options));
        return std::nullopt;
    }
    po::notify(values);
    (void)storage_of(s.storage);
    if (s.products != "tape" && s.products != "bfloat16") {
        throw po::error(fmt::format("--products '{}': tape or bfloat16", s.products));
    }
    if (!s.ops.empty() && s.tape.empty()) throw po::error("--ops loads the user's ops a saved tape holds: use it with --tape");
    if (!s.tape.empty()) {
        for (const char* block_option : {"tokens", "width", "head-width", "seed", "products"}) {
            if (!values[block_option].defaulted()) {
                throw po::error(fmt::format("--{} describes the built-in block; --tape audits the saved tape as it is",
                                            block_option));
            }
        }
    }
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    std::optional<Settings> settings;
    try {
        settings = parse(argc, argv);
    } catch (const std::exception& e) {
        fmt::print(stderr, "tapegrad-audit: {} (see --help)\n", e.what());
        return exit_usage;
    }
    if (!settings) return exit_ok;
    try {
        set_threads(settings->threads);
        load_user_ops(*settings);
        if (settings->tape.empty()) {
            audit_block(*settings);
        } else if (tape_file_scalar(settings->tape) == TapeFileScalar::float32) {
            audit_saved<float>(*settings);
        } else {
            audit_saved<double>(*settings);
        }
        return exit_ok;
    } catch (const std::exception& e) {
        fmt::print(stderr, "tapegrad-audit: {}\n", e.what());
        return exit_error;
    }
}
