// JVP and HVP through every public op, one row per op derived from its rule in tests/op_rules.hpp
// (a random graph whose last step is the op; every struct of LibraryOps recorded by some row, a
// missing one named), and the fault control of the op tables' second-order columns.
//
// The op tables (test_ops, test_elementwise, test_reductions, test_broadcasting, test_shape_ops,
// test_transformer_ops, test_models_ops, test_fused_attention) run every row through
// tapegrad_testing.hpp's check_op_second_order: one direction, the JVP on the op's output Y and the
// HVP on J = Σ Y ∘ G. This file adds, for every public op (dropout_with_mask included, which no
// table row drives), on a graph drawn by the op's rule, the checks of check/second_order.hpp on
// that graph recorded on a Tape<double> (the recorded tape's re-runs at 50 digits and in the duals,
// check/recorded.hpp), with their default
// options (three directions, 50-digit and double dual tapes, the thresholds test_second_order uses:
// 1e-25 on the 50-digit mixed error, 1e-9 on the double one), and the HVP on two losses: the tables'
// probe J = Σ Y ∘ G, and the quadratic probe J = Σ (Y ∘ Y) ∘ G, whose upstream gradient 2·Y ∘ G
// moves with the leaves, so an op's VJP that drops the tangent of G (which Σ Y ∘ G holds constant)
// is caught too. (Neither alone suffices: for Y = √A, Y ∘ Y = A cancels the op from the quadratic
// probe.) Each row's worst JVP and HVP errors are printed as one table at the end.
//
// Fault control: an op (Y = √A) whose forward calls a test-local root with exact overloads for
// double and mp50 but a wrong tangent for Dual<T> (1/√a instead of 1/(2√a), the kind of
// slip layer norm's dual sqrt could make). The first-order checks (the checker and the seeded VJP
// of the op tables) pass it; the tables' second-order column and this file's rows reject it.
#define BOOST_TEST_MODULE second_order_ops
#include "op_rules.hpp"

#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::probe;
using tapegrad::testing::random_tensor;
using tapegrad::testing::scalar_of;
namespace rules = tapegrad::testing::rules;

namespace {

// ---- the fault control: √ with a wrong tangent ----

double root(double x) { return std::sqrt(x); }
mp50 root(const mp50& x) { return mp50(sqrt(x)); }
// Wrong: the tangent of √a is t/(2√a); this gives t/√a. Values are exact.
template <class T>
Dual<T> root(const Dual<T>& x) {
    const T r = root(x.value());
    return Dual<T>(r, T(x.tangent() / r));
}

// Y = √A (A > 0) through `root`; VJP dA = G / (2Y), exact in every real type.
struct RootWithWrongTangent {
    static constexpr std::string_view name = "sqrt with a wrong dual tangent";
    using Settings = NoSettings;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = root(A[k]);
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] / (T(2) * at.out[k]);
    }
};
const bool fault_registered = register_siblings<RootWithWrongTangent>();

template <class V>
V wrong_tangent_root(const V& A) {
    return A.tape().template record<RootWithWrongTangent>({A});
}

// ---- the rows ----

enum class Domain {
    reals,           // [−1, 1]
    away_from_zero,  // ±[0.2, 1]: away from the kinks of abs, relu and max's ties at 0
    positive,        // [0.5, 1.5]: log, sqrt, a divisor, fractional powers
};

struct Leaf {
    Shape shape;
    Domain domain = Domain::reals;
};

Tensor<double> draw(const Leaf& leaf, std::mt19937_64& rng) {
    Tensor<double> t = random_tensor(leaf.shape, rng);
    for (double& x : t.data()) {
        if (leaf.domain == Domain::away_from_zero) x = (x < 0 ? -1 : 1) * (0.2 + 0.8 * std::abs(x));
        if (leaf.domain == Domain::positive) x = 1 + 0.5 * x;
    }
    return t;
}

// J = Σ (Y ∘ Y) ∘ G: the HVP's loss (see the top of the file).
template <class V>
V quadratic_probe(const V& Y) {
    return probe(mul(Y, Y));
}

struct Figures {
    SecondOrderReport jvp, hvp, hvp_quadratic;
    std::set<std::string> ops;  // the op structs recorded for Y (not its probes): the row's coverage
};

// The JVP check on Y and the HVP checks on its two probes, Y recorded once on a Tape<double> and the
// tape checked as recorded (check/recorded.hpp: re-run at 50 digits and in the duals through the
// ops' siblings, compiled in the library), so each row is compiled at double only; the checks,
// directions and thresholds are check_jvp's and check_hvp's own.
Figures second_order_of(Tape<double>& tape, const Var<double>& Y) {
    std::set<std::string> ops;
    for (std::uint32_t i = 0; i <= Y.index(); ++i) ops.emplace(tape.info(i).op);
    const Var<double> J = probe(Y), J_quadratic = quadratic_probe(Y);
    return {check_jvp(tape, Y), check_hvp(tape, J), check_hvp(tape, J_quadratic), std::move(ops)};
}

// Whether a recipe's last step exercises its op: its first operand holds at least two entries, and
// the op's output moves with the leaves (J = Σ out ∘ G has a nonzero gradient). This refuses the
// rows a random graph can hide an op in: sub(n, n), layer_norm over rows of one entry (whose output
// is its bias), attention over a constant.
bool exercised(const rules::Recipe& recipe) {
    const rules::Step& last = recipe.steps.back();
    if (recipe.shapes[last.in[0]].size() < 2) return false;
    Tape<double> tape;
    const auto leaves = rules::leaves_on(tape, rules::leaves_of(recipe));
    tape.backward(probe(rules::Graph<>{&recipe, true, recipe.shapes.size() - 1}(leaves)));
    return std::any_of(leaves.begin(), leaves.end(), [](const Var<double>& leaf) {
        const Tensor<double> g = leaf.grad();
        return std::any_of(g.data().begin(), g.data().end(), [](double x) { return x != 0; });
    });
}

// The row of a public op: a random graph (tests/op_rules.hpp) whose last step is the op's rule and
// exercises it, so the op is applied at the top with its operands and settings drawn as its rule
// says. Of the first 20 such seeds from 3000 + 1000·rule on, the one whose op reads the most
// entries (attention over more than one key, a reduction over more than one lane).
rules::Recipe row_of(std::size_t rule) {
    std::optional<rules::Recipe> best;
    std::size_t best_entries = 0, found = 0;
    for (std::uint64_t seed = 3000 + 1000 * rule; seed < 4000 + 1000 * rule && found < 20; ++seed) {
        rules::Recipe recipe = rules::draw(seed, rule);
        if (recipe.steps.back().rule != rule || !exercised(recipe)) continue;
        ++found;
        std::size_t entries = 0;
        for (const std::size_t v : recipe.steps.back().in)
            if (v != rules::none) entries += recipe.shapes[v].size();
        if (entries > best_entries) best = std::move(recipe), best_entries = entries;
    }
    if (!best) throw std::logic_error(fmt::format("no graph ending in {} from 1000 seeds", rules::Rules::names[rule]));
    return *best;
}

}  // namespace

// One row per rule of tests/op_rules.hpp, so per public op: a new op's rule gives it its row here.
BOOST_AUTO_TEST_CASE(every_public_op_passes_the_jvp_and_hvp_checks) {
    std::set<std::string> covered;
    std::string table =
        "op | graph | worst JVP 50-digit (double) | worst HVP on Σ Y∘G 50-digit (double) | worst HVP on Σ Y²∘G "
        "50-digit (double)\n";
    double worst_jvp = 0, worst_hvp = 0;
    for (std::size_t rule = 0; rule < rules::Rules::size; ++rule) {
        const std::string_view op = rules::Rules::names[rule];
        const rules::Recipe recipe = row_of(rule);
        BOOST_TEST_CONTEXT(op << ": " << rules::describe(recipe)) {
            Tape<double> tape;
            const Var<double> Y = rules::Graph<>{&recipe, true}(rules::leaves_on(tape, rules::leaves_of(recipe)));
            const Figures f = second_order_of(tape, Y);
            covered.insert(f.ops.begin(), f.ops.end());
            // The thresholds are the checks' defaults (check/second_order.hpp), as in test_second_order.
            for (const SecondOrderReport* report : {&f.jvp, &f.hvp, &f.hvp_quadratic}) {
                BOOST_TEST(report->passed, report->summary());
                BOOST_TEST(report->max_error_mp <= 1e-25);
                BOOST_TEST(report->compared > 0u);
            }
            worst_jvp = std::max(worst_jvp, f.jvp.max_error_mp);
            worst_hvp = std::max({worst_hvp, f.hvp.max_error_mp, f.hvp_quadratic.max_error_mp});
            table += fmt::format("{} | seed {}, {} steps | {:.2g} ({:.2g}) | {:.2g} ({:.2g}) | {:.2g} ({:.2g})\n", op,
                                 recipe.seed, recipe.steps.size(), f.jvp.max_error_mp, f.jvp.max_error_double,
                                 f.hvp.max_error_mp, f.hvp.max_error_double, f.hvp_quadratic.max_error_mp,
                                 f.hvp_quadratic.max_error_double);
        }
    }
    BOOST_TEST_MESSAGE(table << "worst over every op: JVP " << worst_jvp << ", HVP " << worst_hvp);
    // Every op struct of the library (LibraryOps, ops/all.hpp) is recorded by some row.
    const std::string missing = testing::missing_names(testing::library_op_names(), covered);
    BOOST_TEST(missing.empty(), "ops of LibraryOps without a row here (a rule missing from tests/op_rules.hpp): "
                                    << missing);
}

// The op tables' columns (tapegrad_testing.hpp) on one recorded tape: the checker and the seeded
// VJP pass the wrong dual tangent (they see only reals), check_op_second_order rejects it, and all
// three pass the library's sqrt on the same values.
BOOST_AUTO_TEST_CASE(a_wrong_dual_rule_passes_first_order_and_fails_the_second_order_column) {
    BOOST_TEST(fault_registered);
    std::mt19937_64 rng(31);
    const std::array<Tensor<double>, 1> values{draw(Leaf{{3, 4}, Domain::positive}, rng)};
    const auto columns = [&](auto op) {
        Tape<double> tape;
        const Var<double> Y = testing::record_op(op, tape, values);
        const Var<double> J = probe(Y);
        std::mt19937_64 same(5);
        const CheckReport checker = check_gradients(tape, J);
        const CheckReport seeded = testing::check_seeded_on_tape(tape, Y, values, same);
        const CheckReport second = testing::check_op_second_order(tape, Y, J, same);
        return std::array{checker, seeded, second};
    };
    const auto right = columns([](auto in) { return sqrt(in[0]); });
    const auto wrong = columns([](auto in) { return wrong_tangent_root(in[0]); });
    for (const CheckReport& r : right) BOOST_TEST(testing::passed(r));
    BOOST_TEST(testing::passed(wrong[0]));  // the 50-digit checker
    BOOST_TEST(testing::passed(wrong[1]));  // the seeded VJP
    BOOST_TEST(testing::rejected(wrong[2]));
    BOOST_TEST(wrong[2].max_error_mp > 1e-3);  // a wrong rule misses by O(1), not by rounding
    // check_op, which runs all three, fails it as a whole.
    std::mt19937_64 again(31);
    BOOST_TEST(
        testing::rejected(testing::check_op_on([](auto in) { return wrong_tangent_root(in[0]); }, again, values)));
}

// The sqrt rule recording the wrong dual tangent in its place (rules::Graph<WrongRootRule>).
struct WrongRootRule : rules::SqrtRule {
    template <class V>
    static V record(const rules::Operands<V>& x) {
        return wrong_tangent_root(x[0]);
    }
};

// This file's rows reject it too: the row of sqrt, its graph drawn by the rule as above, with the
// wrong root in sqrt's place fails its JVP check and its HVP check on Σ Y ∘ G. (Where sqrt's
// output meets Σ (Y ∘ Y) ∘ G directly the op can cancel out, as noted at the top.)
BOOST_AUTO_TEST_CASE(a_wrong_dual_rule_is_rejected_by_this_files_rows) {
    const rules::Recipe recipe = row_of(rules::rule_named("sqrt"));
    const auto figures = [&recipe](auto graph) {
        Tape<double> tape;
        const Var<double> Y = graph(rules::leaves_on(tape, rules::leaves_of(recipe)));
        return second_order_of(tape, Y);
    };
    const Figures right = figures(rules::Graph<>{&recipe, true});
    const Figures wrong = figures(rules::Graph<WrongRootRule>{&recipe, true});
    BOOST_TEST(right.jvp.passed, right.jvp.summary());
    BOOST_TEST(right.hvp.passed, right.hvp.summary());
    BOOST_TEST(right.hvp_quadratic.passed, right.hvp_quadratic.summary());
    BOOST_TEST(!wrong.jvp.passed);
    BOOST_TEST(!wrong.hvp.passed);
    BOOST_TEST_MESSAGE("wrong dual sqrt in " << rules::describe(recipe) << ":\n  " << wrong.jvp.summary() << "\n  "
                                             << wrong.hvp.summary());
}

// The quadratic probe's point: an op whose VJP is exact at first order and in H·v along a constant
// upstream, but which drops the tangent of its upstream G (dA = value(G)·…). J = Σ Y ∘ G gives G no
// tangent, so the HVP check of the op tables passes it; J = Σ (Y ∘ Y) ∘ G does not.
struct ExpDroppingUpstreamTangent : Exp {
    static constexpr std::string_view name = "exp whose VJP drops G's tangent";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) {
            if constexpr (is_dual_v<T>)
                dA[k] = T(at.G[k].value()) * at.out[k];
            else
                dA[k] = at.G[k] * at.out[k];
        }
    }
};

BOOST_AUTO_TEST_CASE(the_quadratic_probe_catches_a_vjp_that_drops_the_upstream_tangent) {
    std::mt19937_64 rng(33);
    const NamedTensor leaves[] = {{"A", draw(Leaf{{2, 3}}, rng)}};
    const auto faulty = [](auto in) { return in[0].tape().template record<ExpDroppingUpstreamTangent>({in[0]}); };
    BOOST_TEST(check_gradients([&](auto in) { return probe(faulty(in)); }, leaves).passed);
    BOOST_TEST(check_hvp([&](auto in) { return probe(faulty(in)); }, leaves).passed);  // linear probe: blind
    const SecondOrderReport quadratic = check_hvp([&](auto in) { return quadratic_probe(faulty(in)); }, leaves);
    BOOST_TEST(!quadratic.passed);
    BOOST_TEST(check_hvp([](auto in) { return quadratic_probe(exp(in[0])); }, leaves).passed);
}
