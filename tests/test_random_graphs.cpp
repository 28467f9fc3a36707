// Random-graph testing: a seeded generator composes random chains and DAGs of every public op
// (ops/*.hpp: one rule per op in tests/op_rules.hpp, 45 today) on random compatible shapes, each
// op with its argument constraints: inputs at least 0.3 for log and sqrt and at least 0.5 for
// reciprocal, a divisor and a fractional or negative power; broadcastable shapes for add, sub, mul
// and div; axes in range for the reductions, concat, slice and permute; valid indices for
// embedding and cross-entropy; a fixed keep-mask (or a generator seeded in the graph) for dropout.
// Values are shared and reused (x·x, a + a, one value feeding several ops). Each value carries an
// interval holding it (computed by interval arithmetic from the leaves' domains), which is what
// the constraints are checked on and what keeps every value within ±10 (so the checker's
// derivation, |J'''| ≤ 1e3, holds). Kinks (abs, relu, clamp at a bound, max at a tie) are avoided:
// the generator looks at the input's values and refuses one within 1e-6 of a kink (see
// op_rules.hpp's kink_distance). Should the checker still classify a coordinate as at a kink
// (check/report.hpp), that graph gets no second-order check (those checks assume smooth points).
// Every value no later step uses is an output: Y is that value, or the outputs flattened and
// concatenated, and J = probe(Y) = Σ Y ∘ G.
//
// Every graph goes through the full 50-digit checker; every third graph (seed ≡ 0 mod 3) without a
// kink also through the JVP check on Y and the HVP check on J (check/second_order.hpp, default
// options: the same 50-digit thresholds as tests/test_second_order.cpp). The run prints how often
// each op was drawn; from 300 graphs, every public function must have been drawn and every op
// struct of LibraryOps (ops/all.hpp) recorded on those tapes (a missing one is named).
//
// CI runs 500 graphs (under 6 s for the whole file in Release on the 2-core host, 2026-12-03, 45
// rules). More, or other seeds (5,000 at seed 270000: 0 failures, every op drawn at least 251
// times, JVP and HVP on 1,667, worst 50-digit error 2.3e-26, 36.5 s there):
//     TAPEGRAD_RANDOM_GRAPHS=5000 TAPEGRAD_RANDOM_SEED=270000 ./build/tests/test_random_graphs --log_level=message
// A failing graph is printed as its tape ("n5 = matmul(x0, n4) [2x3]; ...", each op's settings as
// it declares them) with its seed,
// so it can be replayed alone with TAPEGRAD_RANDOM_GRAPHS=1 TAPEGRAD_RANDOM_SEED=<seed>.
// Fault control: sigmoid with a wrong VJP substituted in graphs that draw sigmoid must be rejected.
#define BOOST_TEST_MODULE random_graphs
#include "op_rules.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace tapegrad;
using namespace tapegrad::testing::rules;

namespace {

// sigmoid whose VJP drops the factor (1 − Y): dA = G ∘ Y (the random graphs' fault control).
struct SigmoidWithWrongVjp : Sigmoid {
    static constexpr std::string_view name = "sigmoid with dA = G·Y";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * at.out[k];
    }
};

// The sigmoid rule recording the wrong VJP in its place (Graph<BrokenSigmoid>).
struct BrokenSigmoid : SigmoidRule {
    template <class V>
    static V record(const Operands<V>& x) {
        return x[0].tape().template record<SigmoidWithWrongVjp>({x[0]});
    }
};

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// The first-order check of a recipe's graph, the leaves as a C array (the checker's signature).
CheckReport check_first_order(const Recipe& recipe, const std::array<NamedTensor, leaf_count>& l, bool broken = false) {
    const NamedTensor leaves[] = {l[0], l[1], l[2]};
    return broken ? check_gradients(Graph<BrokenSigmoid>{&recipe}, leaves) : check_gradients(Graph<>{&recipe}, leaves);
}

}  // namespace

namespace {

// What the graphs so far have shown: the figures the run prints and asserts on.
struct Tally {
    std::map<std::string_view, std::size_t> op_uses;  // per rule, the steps that drew it
    std::set<std::string> recorded;                   // the op structs the recorded tapes hold
    std::size_t shared = 0, failed = 0, coordinates = 0, with_kinks = 0, second_order = 0, steps = 0;
    double worst_mp = 0, worst_double = 0, worst_jvp = 0, worst_hvp = 0;

    Tally() {
        for (const std::string_view name : Rules::names) op_uses[name] = 0;
    }
    std::size_t fewest_uses() const {
        std::size_t fewest = std::numeric_limits<std::size_t>::max();
        for (const auto& [name, n] : op_uses) fewest = std::min(fewest, n);
        return fewest;
    }
    std::string uses_text() const {
        std::string ops;
        for (const auto& [name, n] : op_uses) ops += fmt::format(" {} {},", name, n);
        return ops;
    }
};

void count_steps(const Recipe& recipe, Tally& tally) {
    tally.steps += recipe.steps.size();
    std::vector<std::size_t> uses(recipe.shapes.size());
    for (const Step& step : recipe.steps) {
        ++tally.op_uses[Rules::names[step.rule]];
        for (const std::size_t v : step.in)
            if (v != none) ++uses[v];
    }
    if (std::any_of(uses.begin(), uses.end(), [](std::size_t u) { return u > 1; })) ++tally.shared;
}

// The JVP check on Y and the HVP check on J of a recipe recorded once on a Tape<double> and checked
// as recorded (check/recorded.hpp: the re-runs at 50 digits and in the duals go through the ops'
// siblings in the library), so the recipe's interpreter is compiled at double and 50 digits only.
// Their summaries are appended to `summaries`; true when both pass.
bool second_order_passes(const Recipe& recipe, Tally& tally, std::string& summaries) {
    ++tally.second_order;
    Tape<double> tape;
    const Var<double> Y = Graph<>{&recipe, true}(leaves_on(tape, leaves_of(recipe)));
    for (std::uint32_t i = 0; i <= Y.index(); ++i) tally.recorded.emplace(tape.info(i).op);
    const SecondOrderReport jvp = check_jvp(tape, Y);
    const SecondOrderReport hvp = check_hvp(tape, testing::probe(Y));
    tally.worst_jvp = std::max(tally.worst_jvp, jvp.max_error_mp);
    tally.worst_hvp = std::max(tally.worst_hvp, hvp.max_error_mp);
    summaries += fmt::format("\n{}\n{}", jvp.summary(), hvp.summary());
    return jvp.passed && hvp.passed;
}

// One graph through the 50-digit checker (and, one seed in three without a kink, the second-order
// checks); a failure is reported with the recipe.
void check_one(const Recipe& recipe, Tally& tally) {
    count_steps(recipe, tally);
    const std::array<NamedTensor, leaf_count> l = leaves_of(recipe);
    const NamedTensor leaves[] = {l[0], l[1], l[2]};
    CheckReport report;
    try {
        report = check_gradients(Graph<>{&recipe}, leaves);
    } catch (const std::exception& e) {  // the generator built a graph an op refuses: its bug
        ++tally.failed;
        BOOST_ERROR(describe(recipe) << "\nrefused: " << e.what());
        return;
    }
    tally.coordinates += report.coordinates;
    tally.worst_mp = std::max(tally.worst_mp, report.max_error_mp);
    tally.worst_double = std::max(tally.worst_double, report.max_error_double);
    if (report.kinks > 0) ++tally.with_kinks;
    bool passed = report.passed;
    std::string summaries = report.summary();
    if (recipe.seed % 3 == 0 && report.kinks == 0) passed = second_order_passes(recipe, tally, summaries) && passed;
    if (!passed) {
        ++tally.failed;
        BOOST_ERROR(describe(recipe) << "\n" << summaries);
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_graphs_pass_the_50_digit_checker) {
    const std::uint64_t count = env_or("TAPEGRAD_RANDOM_GRAPHS", 500);
    const std::uint64_t first_seed = env_or("TAPEGRAD_RANDOM_SEED", 1000);
    tapegrad::set_threads(1);  // the graphs are tiny; threads would cost more than they save
    const auto start = std::chrono::steady_clock::now();
    Tally t;
    for (std::uint64_t g = 0; g < count; ++g) check_one(draw(first_seed + g), t);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE(fmt::format(
        "{} random graphs (seeds {}..{}) in {:.1f} s, {} steps, {} with a value used more than once, {} with a "
        "coordinate at a kink; {} failed; {} derivatives; worst error 50-digit {:.3g}, double {:.3g}; JVP and HVP "
        "on {} graphs ({:.1f}%), worst 50-digit JVP {:.3g}, HVP {:.3g}; each op drawn at least {} times; ops:{}",
        count, first_seed, first_seed + count - 1, seconds, t.steps, t.shared, t.with_kinks, t.failed, t.coordinates,
        t.worst_mp, t.worst_double, t.second_order,
        100.0 * static_cast<double>(t.second_order) / static_cast<double>(count), t.worst_jvp, t.worst_hvp,
        t.fewest_uses(), t.uses_text()));
    BOOST_TEST(t.failed == 0u);
    // The generator must actually produce shared values, every op and second-order checks, or the
    // test proves little.
    if (count >= 300) {
        BOOST_TEST(t.shared >= count / 4);
        BOOST_TEST(t.fewest_uses() >= 1u, "an op was never drawn:" << t.uses_text());
        const std::string missing = testing::missing_names(testing::library_op_names(), t.recorded);
        BOOST_TEST(missing.empty(), "op structs of LibraryOps (ops/all.hpp) that no recorded random graph holds "
                                    "(a rule missing from tests/op_rules.hpp): " << missing);
        BOOST_TEST(5 * t.second_order >= count);
    }
}

// The leaves' gradients of a recipe's J on a double tape (with the wrong sigmoid VJP, `broken`).
std::vector<Tensor<double>> gradients_of(const Recipe& recipe, const std::array<NamedTensor, leaf_count>& leaves,
                                         bool broken) {
    Tape<double> tape;
    const std::array<Var<double>, leaf_count> vars = leaves_on(tape, leaves);
    tape.backward(broken ? Graph<BrokenSigmoid>{&recipe}(vars) : Graph<>{&recipe}(vars));
    std::vector<Tensor<double>> gradients;
    for (const Var<double>& v : vars) gradients.push_back(v.grad());
    return gradients;
}

// Fault control: sigmoid's VJP replaced by one that drops the factor (1 − Y), in random graphs whose
// last step is sigmoid (so the probe's random G reaches it on every entry). Wherever the wrong VJP
// changes the leaves' gradients the checker must reject the graph, and the correct graph must pass.
// (Where sigmoid's input does not move with the leaves, log_softmax of rows of one or x − x, the
// gradients are the same and no check could tell; such graphs are counted, not asserted on.)
BOOST_AUTO_TEST_CASE(a_random_graph_op_with_a_wrong_vjp_is_rejected) {
    tapegrad::set_threads(1);
    std::size_t rejected = 0, observable = 0, graphs = 0;
    for (std::uint64_t seed = 50000; seed < 50030; ++seed) {
        const Recipe recipe = draw(seed, rule_named("sigmoid"));
        if (!recipe.uses(rule_named("sigmoid"))) continue;
        ++graphs;
        const std::array<NamedTensor, leaf_count> leaves = leaves_of(recipe);
        const bool changes = gradients_of(recipe, leaves, false) != gradients_of(recipe, leaves, true);
        const CheckReport correct = check_first_order(recipe, leaves);
        const CheckReport broken = check_first_order(recipe, leaves, true);
        BOOST_TEST(correct.passed, describe(recipe) << "\n" << correct.summary());
        if (changes) {
            ++observable;
            BOOST_TEST(!broken.passed, "the wrong sigmoid VJP passed in " << describe(recipe) << "\n"
                                                                          << broken.summary());
        }
        if (!broken.passed) ++rejected;
    }
    BOOST_TEST_MESSAGE("sigmoid with dA = G·Y: rejected in " << rejected << " of " << graphs << " random graphs, "
                                                             << observable << " of which it changes the gradients");
    BOOST_TEST(observable >= 20u);
    BOOST_TEST(rejected == observable);
}

// A sample of the random graphs recorded on a Tape<double> by running the recipe once, checked as
// recorded (check/recorded.hpp): the verdicts and coordinates of the generic-lambda check above.
BOOST_AUTO_TEST_CASE(recorded_random_graphs_check_like_the_generic_lambda) {
    const std::uint64_t count = env_or("TAPEGRAD_RANDOM_RECORDED_GRAPHS", 40);
    tapegrad::set_threads(1);
    for (std::uint64_t g = 0; g < count; ++g) {
        const Recipe recipe = draw(7000 + g);
        const std::array<NamedTensor, leaf_count> l = leaves_of(recipe);
        const NamedTensor leaves[] = {l[0], l[1], l[2]};
        Tape<double> tape;
        const Var<double> J = Graph<>{&recipe}(leaves_on(tape, l));
        BOOST_TEST_CONTEXT(describe(recipe)) {
            testing::expect_same_report(check_gradients(tape, J), check_gradients(Graph<>{&recipe}, leaves));
        }
    }
}
