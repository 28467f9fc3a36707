// JVP and HVP through every public op, one row per op (ops/*.hpp; every struct of LibraryOps recorded
// by some row, a missing one named), and the fault control of the op
// tables' second-order columns.
//
// The op tables (test_ops, test_elementwise, test_reductions, test_broadcasting, test_shape_ops,
// test_transformer_ops, test_models_ops, test_fused_attention) run every row through
// tapegrad_testing.hpp's check_op_second_order: one direction, the JVP on the op's output Y and the
// HVP on J = Σ Y ∘ G. This file adds, for every public op (dropout_with_mask included, which no table
// row drives), the checks of check/second_order.hpp on the op recorded on a Tape<double> (the
// recorded tape's re-runs at 50 digits and in the duals, check/recorded.hpp), with their default
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
#include "support.hpp"

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::probe;
using tapegrad::testing::random_tensor;
using tapegrad::testing::scalar_of;

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

// The JVP check on op's output and the HVP checks on its two probes, leaves drawn from `rng`: the op
// recorded once on a Tape<double> and the tape checked as recorded (check/recorded.hpp: re-run at
// 50 digits and in the duals through the ops' siblings, compiled in the library), so each row's
// lambda is compiled at double only; the checks, directions and thresholds are check_jvp's and
// check_hvp's own.
template <std::size_t N, class Op>
Figures second_order_of(Op op, const std::array<Leaf, N>& specs, std::mt19937_64& rng) {
    std::array<Tensor<double>, N> values;
    for (std::size_t l = 0; l < N; ++l) values[l] = draw(specs[l], rng);
    Tape<double> tape;
    const Var<double> Y = testing::record_op(op, tape, values);
    std::set<std::string> ops;
    for (std::uint32_t i = 0; i <= Y.index(); ++i) ops.emplace(tape.info(i).op);
    const Var<double> J = probe(Y), J_quadratic = quadratic_probe(Y);
    return {check_jvp(tape, Y), check_hvp(tape, J), check_hvp(tape, J_quadratic), std::move(ops)};
}

struct Row {
    std::string op;         // the public function
    std::string table_row;  // the op-table row that drives it through check_op's second-order columns
    std::function<Figures(std::mt19937_64&)> run;
};

template <class Op, class... Leaves>
Row row(std::string op, std::string table_row, Op f, Leaves... leaves) {
    return {std::move(op), std::move(table_row),
            [f, specs = std::array<Leaf, sizeof...(Leaves)>{leaves...}](std::mt19937_64& rng) {
                return second_order_of(f, specs, rng);
            }};
}

template <class V>
V constant_like(const V& X, const Tensor<double>& value) {
    return X.tape().constant(tensor_cast<scalar_of<V>>(value));
}

const Tensor<double> causal4 = Tensor<double>::matrix({{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 1}});
const Tensor<double> keep23 = Tensor<double>::matrix({{1, 0, 1}, {1, 1, 0}});
const std::vector<std::size_t> rows_picked{2, 0, 2, 1}, targets{1, 3, 0, 2, 2, 1};

// One row per public op; kept one op per line, as the op tables are.
// clang-format off
const std::vector<Row> rows = {
    row("add", "test_broadcasting: add, row [1,n] with matrix [m,n] (and 9 more patterns); test_ops: add",
        [](auto in) { return add(in[0], in[1]); }, Leaf{{2, 3}}, Leaf{{1, 3}}),
    row("sub", "test_broadcasting: sub, both stretched [m,1] with [1,n] (and 9 more)",
        [](auto in) { return sub(in[0], in[1]); }, Leaf{{2, 1}}, Leaf{{1, 3}}),
    row("mul", "test_broadcasting: mul, missing leading [n] with [b,m,n] (and 9 more); test_ops: mul",
        [](auto in) { return mul(in[0], in[1]); }, Leaf{{3}}, Leaf{{2, 2, 3}}),
    row("div", "test_broadcasting: div, matrix [m,n] with column [m,1] (and 9 more)",
        [](auto in) { return div(in[0], in[1]); }, Leaf{{2, 3}}, Leaf{{2, 1}, Domain::positive}),
    row("add_bias", "test_transformer_ops: add_bias",
        [](auto in) { return add_bias(in[0], in[1]); }, Leaf{{2, 2, 3}}, Leaf{{3}}),
    row("neg", "test_broadcasting: neg", [](auto in) { return neg(in[0]); }, Leaf{{2, 3}}),
    row("shift", "test_broadcasting: shift", [](auto in) { return shift(in[0], scalar_of<decltype(in[0])>(0.7)); }, Leaf{{2, 3}}),
    row("scale", "test_ops: scale", [](auto in) { return scale(in[0], scalar_of<decltype(in[0])>(-0.37)); }, Leaf{{2, 3}}),
    row("reciprocal", "test_broadcasting: reciprocal", [](auto in) { return reciprocal(in[0]); }, Leaf{{2, 3}, Domain::positive}),
    row("exp", "test_elementwise: exp", [](auto in) { return exp(in[0]); }, Leaf{{2, 3}}),
    row("log", "test_elementwise: log", [](auto in) { return log(in[0]); }, Leaf{{2, 3}, Domain::positive}),
    row("sqrt", "test_elementwise: sqrt", [](auto in) { return sqrt(in[0]); }, Leaf{{2, 3}, Domain::positive}),
    row("tanh", "test_elementwise: tanh", [](auto in) { return tanh(in[0]); }, Leaf{{2, 3}}),
    row("sigmoid", "test_elementwise: sigmoid", [](auto in) { return sigmoid(in[0]); }, Leaf{{2, 3}}),
    row("abs", "test_elementwise: abs", [](auto in) { return abs(in[0]); }, Leaf{{2, 3}, Domain::away_from_zero}),
    row("pow", "test_elementwise: pow 3, pow -2, pow 1/3, pow -1.5",
        [](auto in) { return mul(pow(in[0], scalar_of<decltype(in[0])>(-1.5)), pow(in[0], scalar_of<decltype(in[0])>(3))); },
        Leaf{{2, 3}, Domain::positive}),
    row("clamp", "test_elementwise: clamp [-0.5, 0.75], inside and outside",
        [](auto in) {
            using T = scalar_of<decltype(in[0])>;
            return clamp(in[0], T(-0.5), T(0.75));
        }, Leaf{{2, 3}}),
    row("relu", "test_transformer_ops: relu", [](auto in) { return relu(in[0]); }, Leaf{{2, 3}, Domain::away_from_zero}),
    row("gelu", "test_transformer_ops: gelu tanh, gelu erf",
        [](auto in) { return add(gelu(in[0]), gelu(in[0], GeluForm::erf)); }, Leaf{{2, 3}}),
    row("matmul", "test_ops: matmul, matmul batched, matmul shared B",
        [](auto in) { return matmul(in[0], in[1]); }, Leaf{{2, 2, 3}}, Leaf{{3, 2}}),
    row("transpose", "test_ops: transpose", [](auto in) { return transpose(in[0]); }, Leaf{{2, 2, 3}}),
    row("softmax", "test_ops: softmax", [](auto in) { return softmax(in[0]); }, Leaf{{2, 3, 4}}),
    row("mask", "test_ops: mask (JVP column only: -inf output), mask then softmax (JVP and HVP)",
        [](auto in) { return softmax(mask(in[0], constant_like(in[0], causal4))); }, Leaf{{2, 4, 4}}),
    row("log_softmax", "test_transformer_ops: log_softmax, log_softmax batched",
        [](auto in) { return log_softmax(in[0]); }, Leaf{{2, 3, 4}}),
    row("layer_norm", "test_transformer_ops: layer_norm, layer_norm batched, layer_norm eps=0.5",
        [](auto in) { return layer_norm(in[0], in[1], in[2]); }, Leaf{{3, 4}}, Leaf{{4}, Domain::positive}, Leaf{{4}}),
    row("fused_attention", "test_fused_attention: fused_table (check_op)",
        [](auto in) { return fused_attention(in[0], in[1], in[2], true, 1); }, Leaf{{2, 2, 3}}, Leaf{{2, 3, 3}},
        Leaf{{2, 3, 2}}),
    row("sum", "test_ops: sum", [](auto in) { return sum(in[0]); }, Leaf{{2, 3}}),
    row("sum_axis", "test_reductions: sum rank R axis A [keepdims] (20 rows)",
        [](auto in) { return sum(in[0], -2, true); }, Leaf{{2, 3, 2}}),
    row("mean", "test_reductions: mean rank R axis A [keepdims] (20 rows)",
        [](auto in) { return mean(in[0], 0); }, Leaf{{2, 3, 2}}),
    row("max", "test_reductions: max rank R axis A [keepdims] (20 rows)",
        [](auto in) { return max(in[0], 1); }, Leaf{{2, 3, 2}}),
    row("logsumexp", "test_reductions: logsumexp rank R axis A [keepdims] (20 rows)",
        [](auto in) { return logsumexp(in[0], -1); }, Leaf{{2, 3, 2}}),
    row("reshape", "test_shape_ops: reshape 1 -> 4 (and 6 more)",
        [](auto in) { return reshape(in[0], Shape{3, 1, 2, 2}); }, Leaf{{2, 6}}),
    row("concat", "test_shape_ops: concat 2 rank 1 (and 13 more)",
        [](auto in) { return concat({in[0], in[1], in[0]}, 1); }, Leaf{{2, 2, 3}}, Leaf{{2, 1, 3}}),
    row("slice", "test_shape_ops: slice rank 1 middle (and 10 more)",
        [](auto in) { return slice(in[0], -1, 1, 3); }, Leaf{{2, 2, 4}}),
    row("permute", "test_shape_ops: permute (0) (and 12 more)",
        [](auto in) { return permute(in[0], {2, 0, 1}); }, Leaf{{2, 3, 2}}),
    row("dropout", "test_models_ops: dropout p=0.3, dropout p=0",
        [](auto in) {
            std::mt19937_64 generator(99);  // the same keep-mask on every tape
            return dropout(in[0], 0.3, generator);
        },
        Leaf{{2, 2, 3}}),
    row("dropout_with_mask", "(none before this file: every_op_graph, first order only)",
        [](auto in) { return dropout_with_mask(in[0], constant_like(in[0], keep23), 0.4); }, Leaf{{2, 3}}),
    row("embedding", "test_models_ops: embedding, embedding batched, embedding rows of a batch",
        [](auto in) { return embedding(in[0], std::span<const std::size_t>(rows_picked), 2); }, Leaf{{3, 3}}),
    row("cross_entropy", "test_models_ops: cross_entropy, cross_entropy batched",
        [](auto in) { return cross_entropy(in[0], std::span<const std::size_t>(targets)); }, Leaf{{2, 3, 4}}),
    row("split_heads", "test_models_ops: split_heads, split_heads rank 2",
        [](auto in) { return split_heads(in[0], 2); }, Leaf{{2, 3, 4}}),
    row("merge_heads", "test_models_ops: merge_heads, merge_heads rank 3",
        [](auto in) { return merge_heads(in[0]); }, Leaf{{2, 2, 3, 2}}),
};
// clang-format on

}  // namespace

BOOST_AUTO_TEST_CASE(every_public_op_passes_the_jvp_and_hvp_checks) {
    std::mt19937_64 rng(2027);
    std::set<std::string> covered;
    std::string table =
        "op | op-table row with the JVP/HVP columns | worst JVP 50-digit (double) | worst HVP on Σ Y∘G "
        "50-digit (double) | worst HVP on Σ Y²∘G 50-digit (double)\n";
    double worst_jvp = 0, worst_hvp = 0;
    for (const Row& r : rows) {
        BOOST_TEST_CONTEXT(r.op) {
            const Figures f = r.run(rng);
            covered.insert(f.ops.begin(), f.ops.end());
            // The thresholds are the checks' defaults (check/second_order.hpp), as in test_second_order.
            for (const SecondOrderReport* report : {&f.jvp, &f.hvp, &f.hvp_quadratic}) {
                BOOST_TEST(report->passed, report->summary());
                BOOST_TEST(report->max_error_mp <= 1e-25);
                BOOST_TEST(report->compared > 0u);
            }
            worst_jvp = std::max(worst_jvp, f.jvp.max_error_mp);
            worst_hvp = std::max({worst_hvp, f.hvp.max_error_mp, f.hvp_quadratic.max_error_mp});
            table += fmt::format("{} | {} | {:.2g} ({:.2g}) | {:.2g} ({:.2g}) | {:.2g} ({:.2g})\n", r.op, r.table_row,
                                 f.jvp.max_error_mp, f.jvp.max_error_double, f.hvp.max_error_mp, f.hvp.max_error_double,
                                 f.hvp_quadratic.max_error_mp, f.hvp_quadratic.max_error_double);
        }
    }
    BOOST_TEST_MESSAGE(table << "worst over every op: JVP " << worst_jvp << ", HVP " << worst_hvp);
    // Every op struct of the library (LibraryOps, ops/all.hpp) is recorded by some row.
    const std::string missing = testing::missing_names(testing::library_op_names(), covered);
    BOOST_TEST(missing.empty(), "ops of LibraryOps without a row here: " << missing);
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

// This file's rows reject it too: its JVP and its HVP on Σ Y ∘ G each fail. (On Σ (Y ∘ Y) ∘ G = Σ A ∘ G
// the op cancels out, as noted at the top.)
BOOST_AUTO_TEST_CASE(a_wrong_dual_rule_is_rejected_by_this_files_rows) {
    std::mt19937_64 rng(32), same(32);
    const Figures wrong = second_order_of([](auto in) { return wrong_tangent_root(in[0]); },
                                          std::array{Leaf{{3, 4}, Domain::positive}}, rng);
    const Figures right =
        second_order_of([](auto in) { return sqrt(in[0]); }, std::array{Leaf{{3, 4}, Domain::positive}}, same);
    BOOST_TEST(right.jvp.passed, right.jvp.summary());
    BOOST_TEST(right.hvp.passed, right.hvp.summary());
    BOOST_TEST(right.hvp_quadratic.passed, right.hvp_quadratic.summary());
    BOOST_TEST(!wrong.jvp.passed);
    BOOST_TEST(!wrong.hvp.passed);
    BOOST_TEST_MESSAGE("wrong dual sqrt:\n  " << wrong.jvp.summary() << "\n  " << wrong.hvp.summary());
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
