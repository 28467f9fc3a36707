// NumPy broadcasting in the elementwise binary ops (add, sub, mul, div: ops/broadcast.hpp), the
// constant ops (shift, neg, reciprocal) and the operators on Var<T> (ops/operators.hpp):
//   (a) the 50-digit op table, with every broadcast pattern (row, column, scalar against rank 4,
//       both operands stretched, missing leading dimensions) for every binary op and operator;
//   (b) seeded random shape pairs, every binary op through the checker (TAPEGRAD_BROADCAST_CASES,
//       TAPEGRAD_BROADCAST_SEED set the count and seed; 2000 cases by default, a few seconds);
//   (c) fault controls: a broadcast add that forgets to sum over the stretched axis, and one that
//       sums over the wrong axis, are both rejected;
//   (d) errors: shapes that do not broadcast, division by zero, non-finite constants;
//   (e) operators record exactly the ops of the named calls.
#define BOOST_TEST_MODULE broadcasting
#include "support.hpp"

#include "ops/broadcast.hpp"
#include "ops/div.hpp"
#include "ops/neg.hpp"
#include "ops/operators.hpp"
#include "ops/reciprocal.hpp"
#include "ops/shift.hpp"
#include "ops/sub.hpp"

#include <chrono>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <system_error>
#include <typeinfo>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::scalar_of;

namespace {

// ---- leaves for a divisor ----

// A divisor near 0 makes the third derivative of the probe J = Σ_k G_k·A_k/B_k large: each term
// contributes −6·G·A/B⁴ to ∂³J/∂B³. The checker's central difference at its larger step h = 1e-14
// has truncation error h²·|J'''|/6 ≈ 1.7e-29·|J'''| (check/report.hpp), which must stay below the
// 1e-25 threshold with margin. Moving every value of a (−1, 1) draw one unit away from 0 gives
// |B| ≥ 1, so with |G|, |A| < 1 each term is at most 6; a stretched divisor element is read by at
// most 4⁴ = 256 outputs in these tests, so |J'''| ≤ 1536 and the truncation error ≤ 2.6e-26.
Tensor<double> away_from_zero(Tensor<double> values) {
    for (double& x : values.data()) x += x < 0 ? -1.0 : 1.0;
    return values;
}

// check_op with the last leaf a divisor (kept away from 0, see above).
template <class Op, class... Shapes>
CheckReport check_op_dividing(Op op, std::mt19937_64& rng, const Shapes&... shapes) {
    std::array<Tensor<double>, sizeof...(Shapes)> values{testing::random_tensor(shapes, rng)...};
    values.back() = away_from_zero(values.back());
    return testing::check_op_on(op, rng, values);
}

// ---- (a) the op table ----

// The operand shapes of one broadcast pattern, from an op-table row's dimensions.
struct ShapeCase {
    std::string name;
    std::function<std::array<Shape, 2>(const OpDims&)> shapes;
};

const std::vector<ShapeCase> shape_cases = {
    {"same shape", [](const OpDims& d) { return std::array{Shape{d.m, d.n}, Shape{d.m, d.n}}; }},
    {"row [1,n] with matrix [m,n]", [](const OpDims& d) { return std::array{Shape{1, d.n}, Shape{d.m, d.n}}; }},
    {"matrix [m,n] with row [1,n]", [](const OpDims& d) { return std::array{Shape{d.m, d.n}, Shape{1, d.n}}; }},
    {"column [m,1] with matrix [m,n]", [](const OpDims& d) { return std::array{Shape{d.m, 1}, Shape{d.m, d.n}}; }},
    {"matrix [m,n] with column [m,1]", [](const OpDims& d) { return std::array{Shape{d.m, d.n}, Shape{d.m, 1}}; }},
    {"scalar [] with rank 4", [](const OpDims& d) { return std::array{Shape{}, Shape{d.batch, d.m, d.k, d.n}}; }},
    {"rank 4 with scalar []", [](const OpDims& d) { return std::array{Shape{d.batch, d.m, d.k, d.n}, Shape{}}; }},
    {"both stretched [m,1] with [1,n]", [](const OpDims& d) { return std::array{Shape{d.m, 1}, Shape{1, d.n}}; }},
    {"missing leading [n] with [b,m,n]", [](const OpDims& d) { return std::array{Shape{d.n}, Shape{d.batch, d.m, d.n}}; }},
    {"[b,m,n] with missing leading [m,1]", [](const OpDims& d) { return std::array{Shape{d.batch, d.m, d.n}, Shape{d.m, 1}}; }},
};

// One table row per (binary op, broadcast pattern). `dividing`: the second operand is a divisor.
template <class Op>
void add_binary_rows(std::vector<OpCase>& table, const std::string& name, Op op, bool dividing) {
    for (const ShapeCase& c : shape_cases) {
        table.push_back({name + ", " + c.name, [op, dividing, shapes = c.shapes](const OpDims& d, auto& rng) {
                             const auto [a, b] = shapes(d);
                             return dividing ? check_op_dividing(op, rng, a, b) : check_op(op, rng, a, b);
                         }});
    }
}

std::vector<OpCase> binary_table() {
    std::vector<OpCase> table;
    add_binary_rows(table, "add", [](auto in) { return add(in[0], in[1]); }, false);
    add_binary_rows(table, "sub", [](auto in) { return sub(in[0], in[1]); }, false);
    add_binary_rows(table, "mul", [](auto in) { return mul(in[0], in[1]); }, false);
    add_binary_rows(table, "div", [](auto in) { return div(in[0], in[1]); }, true);
    add_binary_rows(table, "a + b", [](auto in) { return in[0] + in[1]; }, false);
    add_binary_rows(table, "a - b", [](auto in) { return in[0] - in[1]; }, false);
    add_binary_rows(table, "a * b", [](auto in) { return in[0] * in[1]; }, false);
    add_binary_rows(table, "a / b", [](auto in) { return in[0] / in[1]; }, true);
    return table;
}

// The one-operand ops and the operators with a constant, on a batch of matrices.
const std::vector<OpCase> constant_table = {
    {"shift", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return shift(in[0], scalar_of<decltype(in[0])>(0.7)); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"shift by 1/3 in T", [](const OpDims& d, auto& rng) { return check_op([](auto in) { using T = scalar_of<decltype(in[0])>; return shift(in[0], T(1) / T(3)); }, rng, Shape{d.m, d.n}); }},
    {"neg", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return neg(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"reciprocal", [](const OpDims& d, auto& rng) { return check_op_dividing([](auto in) { return reciprocal(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"-a", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return -in[0]; }, rng, Shape{d.m, d.n}); }},
    {"a * 2.0", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return in[0] * 2.0; }, rng, Shape{d.m, d.n}); }},
    {"2.0 * a", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return 2.0 * in[0]; }, rng, Shape{d.m, d.n}); }},
    {"a * c, c a T", [](const OpDims& d, auto& rng) { return check_op([](auto in) { using T = scalar_of<decltype(in[0])>; return in[0] * (T(1) / T(7)); }, rng, Shape{d.m, d.n}); }},
    {"c * a, c an int", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return 3 * in[0]; }, rng, Shape{d.m, d.n}); }},
    {"a / 3.0", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return in[0] / 3.0; }, rng, Shape{d.m, d.n}); }},
    {"a + 1.5", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return in[0] + 1.5; }, rng, Shape{d.m, d.n}); }},
    {"1.5 + a", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return 1.5 + in[0]; }, rng, Shape{d.m, d.n}); }},
    {"a - 1.5", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return in[0] - 1.5; }, rng, Shape{d.m, d.n}); }},
    {"1.0 - a", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return 1.0 - in[0]; }, rng, Shape{d.m, d.n}); }},
    {"2.0 / a", [](const OpDims& d, auto& rng) { return check_op_dividing([](auto in) { return 2.0 / in[0]; }, rng, Shape{d.m, d.n}); }},
    {"(a*b + c) / (a + 2.0) - b, broadcast", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return (in[0] * in[1] + in[2]) / (in[0] + 2.0) - in[1]; }, rng, Shape{d.m, d.n}, Shape{1, d.n}, Shape{d.m, 1}); }},
};

// ---- (b) random shape pairs ----

// A pair of shapes that broadcast: a result of rank 0..4 with dimensions 1..3; each operand has
// rank 0..(result rank) (missing leading dimensions) and, on each of its axes, the result's
// dimension or 1 (stretched), so either side, both or neither is stretched on each axis.
std::array<Shape, 2> random_shape_pair(std::mt19937_64& rng) {
    std::uniform_int_distribution<std::size_t> rank_of(0, max_rank), dim_of(1, 3);
    std::bernoulli_distribution stretched(0.5);
    const std::size_t rank = rank_of(rng);
    std::array<std::size_t, max_rank> result{};
    for (std::size_t axis = 0; axis < rank; ++axis) result[axis] = dim_of(rng);
    std::array<Shape, 2> pair;
    for (Shape& operand : pair) {
        const std::size_t operand_rank = std::uniform_int_distribution<std::size_t>(0, rank)(rng);
        std::array<std::size_t, max_rank> dims{};
        for (std::size_t axis = 0; axis < operand_rank; ++axis) {
            const std::size_t full = result[rank - operand_rank + axis];
            dims[axis] = stretched(rng) ? 1 : full;
        }
        operand = Shape(std::span<const std::size_t>(dims.data(), operand_rank));
    }
    return pair;
}

// A number from the environment, or `fallback` when it is unset; a malformed value fails the test.
std::uint64_t setting(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    std::uint64_t value = 0;
    const std::string_view view(text);
    const auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
    if (error != std::errc{} || end != view.data() + view.size()) {
        BOOST_FAIL(name << "=" << text << " is not a non-negative integer");
    }
    return value;
}

struct BinaryOp {
    std::string name;
    std::function<CheckReport(const NamedTensor (&)[2])> check;
};

template <class Op>
BinaryOp checked(std::string name, Op op) {
    return {std::move(name), [op](const NamedTensor (&leaves)[2]) {
                return check_gradients([&](auto in) { return testing::probe(op(in[0], in[1])); }, leaves);
            }};
}

const std::vector<BinaryOp> binary_ops = {
    checked("add", [](auto a, auto b) { return add(a, b); }),
    checked("sub", [](auto a, auto b) { return sub(a, b); }),
    checked("mul", [](auto a, auto b) { return mul(a, b); }),
    checked("div", [](auto a, auto b) { return div(a, b); }),
};

// ---- (c) fault controls ----

// add whose VJP forgets to sum over the stretched axes: a stretched input keeps only the first
// slice of G that reads it (G_0j for a row [1, n] added to [m, n]), instead of Σ_i G_ij.
struct AddKeepingFirstSlice : Add {
    static constexpr std::string_view name = "add keeping the first slice of G";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        std::vector<char> seen(grad.size(), 0);
        BroadcastLayout(at.G.shape(), at.in[0]->shape(), at.in[1]->shape())
            .for_each([&](std::size_t k, std::size_t ia, std::size_t ib) {
                const std::size_t i = which == 0 ? ia : ib;
                if (!seen[i]) grad[i] = at.G[k];
                seen[i] = 1;
            });
    }
};

// add whose VJP sums over the wrong axis: a column [n, 1] added to a square [n, n] gets the sums of
// G's columns, Σ_j G_ji, instead of its rows, Σ_j G_ij (both have the column's shape when square).
struct AddSummingWrongAxis : Add {
    static constexpr std::string_view name = "add summing over the wrong axis";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        if (grad.shape() == at.G.shape()) {
            std::copy(at.G.data().begin(), at.G.data().end(), grad.data().begin());
            return;
        }
        const std::size_t n = at.G.cols();
        for (std::size_t i = 0; i < n; ++i) {
            grad[i] = T(0);
            for (std::size_t j = 0; j < n; ++j) grad[i] += at.G(j, i);
        }
    }
};

template <class Op>
CheckReport check_faulty_add(const Shape& a, const Shape& b) {
    std::mt19937_64 rng(31);
    return check_gradients(
        [](auto in) { return testing::probe(in[0].tape().template record<Op>({in[0], in[1]})); },
        {{"a", testing::random_tensor(a, rng)}, {"b", testing::random_tensor(b, rng)}});
}

// ---- (d) errors ----

using testing::ErrorKind;
using Misuse = testing::Misuse<std::function<void(Tape<double>&, Var<double> a, Var<double> b)>>;  // a [2x3], b [3x4]

Tensor<double> filled(const Shape& shape, double value = 0.5) { return Tensor<double>(shape, value); }

Tensor<double> with_zero_at(const Shape& shape, std::size_t flat) {
    Tensor<double> t = filled(shape);
    t[flat] = 0.0;
    return t;
}

const double inf = std::numeric_limits<double>::infinity();

const std::vector<Misuse> misuses = {
    {"add shapes", ErrorKind::shape, [](auto&, auto a, auto b) { add(a, b); }, {"add", "shapes differ", "do not broadcast", "[2x3]", "[3x4]"}},
    {"sub shapes", ErrorKind::shape, [](auto&, auto a, auto b) { sub(a, b); }, {"sub", "shapes differ", "do not broadcast", "[2x3]", "[3x4]"}},
    {"mul shapes", ErrorKind::shape, [](auto&, auto a, auto b) { mul(a, b); }, {"mul", "shapes differ", "do not broadcast", "[2x3]", "[3x4]"}},
    {"div shapes", ErrorKind::shape, [](auto&, auto a, auto b) { div(a, b); }, {"div", "shapes differ", "do not broadcast", "[2x3]", "[3x4]"}},
    {"a + b shapes", ErrorKind::shape, [](auto&, auto a, auto b) { (void)(a + b); }, {"add", "shapes differ", "[2x3]", "[3x4]"}},
    {"a - b shapes", ErrorKind::shape, [](auto&, auto a, auto b) { (void)(a - b); }, {"sub", "shapes differ", "[2x3]", "[3x4]"}},
    {"a * b shapes", ErrorKind::shape, [](auto&, auto a, auto b) { (void)(a * b); }, {"mul", "shapes differ", "[2x3]", "[3x4]"}},
    {"a / b shapes", ErrorKind::shape, [](auto&, auto a, auto b) { (void)(a / b); }, {"div", "shapes differ", "[2x3]", "[3x4]"}},
    {"leading clash", ErrorKind::shape, [](auto& t, auto, auto) { add(t.leaf(filled({2, 1, 3})), t.leaf(filled({4, 2, 3}))); }, {"add", "do not broadcast", "[2x1x3]", "[4x2x3]", "dimension 2 of the first and 4 of the second"}},
    {"vector against rows", ErrorKind::shape, [](auto& t, auto a, auto) { mul(t.leaf(filled({2})), a); }, {"mul", "do not broadcast", "[2]", "[2x3]"}},
    {"sub empty", ErrorKind::shape, [](auto& t, auto a, auto) { sub(a, t.leaf(filled({0, 3}))); }, {"sub", "empty", "second argument", "[0x3]"}},
    {"div empty", ErrorKind::shape, [](auto& t, auto a, auto) { div(t.leaf(filled({2, 0})), a); }, {"div", "empty", "first argument", "[2x0]"}},
    {"neg empty", ErrorKind::shape, [](auto& t, auto, auto) { neg(t.leaf(filled({0}))); }, {"neg", "empty", "[0]"}},
    {"shift empty", ErrorKind::shape, [](auto& t, auto, auto) { shift(t.leaf(filled({0})), 1.0); }, {"shift", "empty", "[0]"}},
    {"reciprocal empty", ErrorKind::shape, [](auto& t, auto, auto) { reciprocal(t.leaf(filled({0}))); }, {"reciprocal", "empty", "[0]"}},
    {"div by zero", ErrorKind::value, [](auto& t, auto a, auto) { div(a, t.leaf(with_zero_at({2, 3}, 5))); }, {"div", "division by zero", "(1, 2)", "[2x3]"}},
    {"div by a broadcast zero", ErrorKind::value, [](auto& t, auto a, auto) { div(a, t.leaf(with_zero_at({1, 3}, 1))); }, {"div", "division by zero", "(0, 1)", "[1x3]"}},
    {"a / b by zero", ErrorKind::value, [](auto& t, auto a, auto) { (void)(a / t.leaf(with_zero_at({2, 3}, 0))); }, {"div", "division by zero", "(0, 0)"}},
    {"reciprocal of zero", ErrorKind::value, [](auto& t, auto, auto) { reciprocal(t.leaf(with_zero_at({2, 2}, 1))); }, {"reciprocal", "division by zero", "(0, 1)"}},
    {"c / a by zero", ErrorKind::value, [](auto& t, auto, auto) { (void)(2.0 / t.leaf(with_zero_at({3}, 2))); }, {"reciprocal", "division by zero", "(2)"}},
    {"a / 0", ErrorKind::value, [](auto&, auto a, auto) { (void)(a / 0.0); }, {"operator/", "division by zero"}},
    {"a / inf", ErrorKind::value, [](auto&, auto a, auto) { (void)(a / inf); }, {"operator/", "inf", "not finite"}},
    {"shift by inf", ErrorKind::value, [](auto&, auto a, auto) { shift(a, inf); }, {"shift", "inf", "not finite"}},
    {"a + inf", ErrorKind::value, [](auto&, auto a, auto) { (void)(a + inf); }, {"shift", "inf", "not finite"}},
    {"inf - a", ErrorKind::value, [](auto&, auto a, auto) { (void)(inf - a); }, {"operator-", "inf", "not finite"}},
    {"inf / a", ErrorKind::value, [](auto&, auto a, auto) { (void)(inf / a); }, {"operator/", "inf", "not finite"}},
    {"a * inf", ErrorKind::value, [](auto&, auto a, auto) { (void)(a * inf); }, {"scale", "inf", "not finite"}},
};


// ---- (e) operators against named calls ----

// The op names of a tape's nodes, in order.
template <Scalar T>
std::vector<std::string> op_names(const Tape<T>& tape) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < tape.size(); ++i) names.emplace_back(tape.info(i).op);
    return names;
}

// One operator form, the named calls it must record, and the op names expected after the leaf.
struct Spelling {
    std::string text;
    std::function<Var<mp50>(Var<mp50>)> with_operator;
    std::function<Var<mp50>(Var<mp50>)> with_names;
    std::vector<std::string> ops;
};

const std::vector<Spelling> spellings = {
    {"-a", [](auto a) { return -a; }, [](auto a) { return neg(a); }, {"neg"}},
    {"a + 1.5", [](auto a) { return a + 1.5; }, [](auto a) { return shift(a, mp50(1.5)); }, {"shift"}},
    {"1.5 + a", [](auto a) { return 1.5 + a; }, [](auto a) { return shift(a, mp50(1.5)); }, {"shift"}},
    {"a - 1.5", [](auto a) { return a - 1.5; }, [](auto a) { return shift(a, mp50(-1.5)); }, {"shift"}},
    {"1.5 - a", [](auto a) { return 1.5 - a; }, [](auto a) { return shift(neg(a), mp50(1.5)); }, {"neg", "shift"}},
    {"a * 2.0", [](auto a) { return a * 2.0; }, [](auto a) { return scale(a, mp50(2)); }, {"scale"}},
    {"2.0 * a", [](auto a) { return 2.0 * a; }, [](auto a) { return scale(a, mp50(2)); }, {"scale"}},
    {"mp50(2) * a", [](auto a) { return mp50(2) * a; }, [](auto a) { return scale(a, mp50(2)); }, {"scale"}},
    {"a / 3.0", [](auto a) { return a / 3.0; }, [](auto a) { return scale(a, mp50(1) / mp50(3)); }, {"scale"}},
    {"3.0 / a", [](auto a) { return 3.0 / a; }, [](auto a) { return scale(reciprocal(a), mp50(3)); }, {"reciprocal", "scale"}},
    {"a + a", [](auto a) { return a + a; }, [](auto a) { return add(a, a); }, {"add"}},
    {"a - a", [](auto a) { return a - a; }, [](auto a) { return sub(a, a); }, {"sub"}},
    {"a * a", [](auto a) { return a * a; }, [](auto a) { return mul(a, a); }, {"mul"}},
    {"a / a", [](auto a) { return a / a; }, [](auto a) { return div(a, a); }, {"div"}},
};

}  // namespace

// ---- the layout itself ----

BOOST_AUTO_TEST_CASE(broadcast_shapes_follow_numpy) {
    struct Row {
        Shape a, b;
        std::optional<Shape> expected;
    };
    const std::vector<Row> rows = {
        {{2, 3}, {2, 3}, Shape{2, 3}},        {{2, 3}, {1, 3}, Shape{2, 3}},
        {{3, 1}, {1, 4}, Shape{3, 4}},        {{}, {2, 2, 2, 2}, Shape{2, 2, 2, 2}},
        {{4}, {2, 3, 4}, Shape{2, 3, 4}},     {{2, 1}, {3}, Shape{2, 3}},
        {{1, 1}, {}, Shape{1, 1}},            {{5, 1, 3, 1}, {4, 1, 2}, Shape{5, 4, 3, 2}},
        {{2, 3}, {3, 4}, std::nullopt},       {{2}, {3}, std::nullopt},
        {{2, 1, 3}, {4, 2, 3}, std::nullopt},
    };
    for (const Row& r : rows) {
        const std::optional<Shape> got = try_broadcast_shape(r.a, r.b);
        BOOST_TEST_CONTEXT(r.a.to_string() << " with " << r.b.to_string()) {
            BOOST_TEST(got.has_value() == r.expected.has_value());
            if (got && r.expected) BOOST_TEST(got->to_string() == r.expected->to_string());
        }
    }
}

BOOST_AUTO_TEST_CASE(the_layout_maps_each_output_element_to_its_sources) {
    // a [2x1x3] with b [4x1] -> [2x4x3]: output (i, j, l) reads a(i, 0, l) and b(j, 0).
    const Shape a{2, 1, 3}, b{4, 1}, out{2, 4, 3};
    const BroadcastLayout layout(out, a, b);
    std::size_t visited = 0;
    layout.for_each([&](std::size_t k, std::size_t ia, std::size_t ib) {
        const std::size_t i = k / 12, j = k / 3 % 4, l = k % 3;
        BOOST_TEST(ia == i * 3 + l);
        BOOST_TEST(ib == j);
        BOOST_TEST(layout.source(0, k) == ia);
        BOOST_TEST(layout.source(1, k) == ib);
        BOOST_TEST(k == visited++);
    });
    BOOST_TEST(visited == out.size());
}

BOOST_AUTO_TEST_CASE(a_bias_row_is_added_to_every_row_and_its_gradient_sums_the_rows) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2, 3}, {4, 5, 6}}), "X");
    const Var<double> bias = tape.leaf(Tensor<double>::matrix({{10, 20, 30}}), "bias");
    const Var<double> Y = X + bias;
    BOOST_TEST(Y.value() == Tensor<double>::matrix({{11, 22, 33}, {14, 25, 36}}));
    tape.backward(Y, Tensor<double>::matrix({{1, 2, 3}, {4, 5, 6}}));
    BOOST_TEST(bias.grad() == Tensor<double>::matrix({{5, 7, 9}}));  // G summed over the stretched rows
    BOOST_TEST(X.grad() == Tensor<double>::matrix({{1, 2, 3}, {4, 5, 6}}));
}

// ---- (a) ----

BOOST_AUTO_TEST_CASE(every_binary_op_and_operator_passes_the_50_digit_checker_on_every_broadcast_pattern) {
    testing::check_op_table(binary_table(), 2026, 4);
}

BOOST_AUTO_TEST_CASE(the_constant_ops_and_operators_pass_the_50_digit_checker) {
    testing::check_op_table(constant_table, 1130, 4);
}

// ---- (b) ----

BOOST_AUTO_TEST_CASE(random_broadcast_shape_pairs_pass_the_50_digit_checker) {
    const std::uint64_t cases = setting("TAPEGRAD_BROADCAST_CASES", 2000);
    const std::uint64_t seed = setting("TAPEGRAD_BROADCAST_SEED", 20261130);
    std::mt19937_64 rng(seed);
    std::size_t derivatives = 0, failures = 0, failed_checks = 0, one_stretched = 0, both_stretched = 0;
    double worst_mp = 0, worst_double = 0;
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t c = 0; c < cases; ++c) {
        const auto [a, b] = random_shape_pair(rng);
        const Shape result = broadcast_shape("random pair", a, b);
        const bool a_stretched = !(a == result), b_stretched = !(b == result);
        one_stretched += a_stretched != b_stretched;
        both_stretched += a_stretched && b_stretched;
        // One pair of leaves for every op; b is div's divisor, so it is kept away from 0.
        const NamedTensor leaves[2] = {{"a", testing::random_tensor(a, rng)},
                                       {"b", away_from_zero(testing::random_tensor(b, rng))}};
        for (const BinaryOp& op : binary_ops) {
            const CheckReport report = op.check(leaves);
            derivatives += report.coordinates;
            failures += report.failures;
            failed_checks += report.passed ? 0 : 1;
            worst_mp = std::max(worst_mp, report.max_error_mp);
            worst_double = std::max(worst_double, report.max_error_double);
            BOOST_TEST(report.passed, "case " << c << ": " << op.name << " " << a.to_string() << " with "
                                              << b.to_string() << ": " << report.summary());
            BOOST_TEST(report.max_error_mp <= 1e-25);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    BOOST_TEST_MESSAGE(fmt::format(
        "random broadcasting: seed {} cases {} ({} binary ops each; one operand stretched in {}, both in {}) "
        "derivatives {} failures {} (failed checks {}) worst 50-digit error {:.3g} worst double error {:.3g} "
        "seconds {:.1f}",
        seed, cases, binary_ops.size(), one_stretched, both_stretched, derivatives, failures, failed_checks, worst_mp,
        worst_double, seconds));
    BOOST_TEST(derivatives > 0u);
}

// ---- (c) ----

BOOST_AUTO_TEST_CASE(a_broadcast_add_that_forgets_to_sum_is_rejected) {
    const Shape row{1, 3}, matrix{4, 3};
    BOOST_TEST(check_faulty_add<Add>(row, matrix).passed);  // the real op on the same leaves
    const CheckReport report = check_faulty_add<AddKeepingFirstSlice>(row, matrix);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.failures > 0u);
    BOOST_REQUIRE(!report.worst.empty());
    BOOST_TEST(report.worst.front().leaf == "a");  // the stretched row; the matrix's dB = G is right
}

BOOST_AUTO_TEST_CASE(a_broadcast_add_that_sums_over_the_wrong_axis_is_rejected) {
    const Shape column{3, 1}, square{3, 3};
    BOOST_TEST(check_faulty_add<Add>(column, square).passed);
    const CheckReport report = check_faulty_add<AddSummingWrongAxis>(column, square);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.failures > 0u);
    BOOST_REQUIRE(!report.worst.empty());
    BOOST_TEST(report.worst.front().leaf == "a");
}

// ---- (d) ----

BOOST_AUTO_TEST_CASE(every_misuse_raises_a_named_error_and_records_nothing) {
    for (const Misuse& m : misuses) {
        Tape<double> tape;
        const Var<double> a = tape.leaf(filled({2, 3}), "a");
        const Var<double> b = tape.leaf(filled({3, 4}), "b");
        testing::expect_named_error(m, [&] { m.act(tape, a, b); });
        // The act's own leaves are on the tape; the refused op (or operator) left no node.
        std::size_t leaves = 0;
        for (std::size_t i = 0; i < tape.size(); ++i) leaves += tape.info(i).op == "leaf";
        BOOST_TEST(leaves == tape.size(), m.what << ": the refused op left nodes on the tape");
    }
}

// ---- (e) ----

BOOST_AUTO_TEST_CASE(operators_record_the_same_ops_as_the_named_calls) {
    std::mt19937_64 rng(5);
    const Tensor<double> A = testing::random_tensor({2, 3}, rng), B = testing::random_tensor({1, 3}, rng),
                         C = testing::random_tensor({2, 1}, rng);
    Tape<double> written, named;
    const auto leaves = [&](Tape<double>& tape) {
        return std::array{tape.leaf(A, "a"), tape.leaf(B, "b"), tape.leaf(C, "c")};
    };
    const auto [a1, b1, c1] = leaves(written);
    const auto [a2, b2, c2] = leaves(named);
    const Var<double> Y1 = a1 * b1 + c1;
    const Var<double> Y2 = add(mul(a2, b2), c2);
    BOOST_TEST(op_names(written) == op_names(named), boost::test_tools::per_element());
    BOOST_TEST(op_names(written) == (std::vector<std::string>{"leaf", "leaf", "leaf", "mul", "add"}),
               boost::test_tools::per_element());
    for (std::size_t i = 0; i < written.size(); ++i) {
        const NodeInfo x = written.info(i), y = named.info(i);
        BOOST_TEST(std::vector(x.inputs.begin(), x.inputs.end()) == std::vector(y.inputs.begin(), y.inputs.end()),
                   boost::test_tools::per_element());
    }
    BOOST_TEST(Y1.value() == Y2.value());
    written.backward(sum(Y1));
    named.backward(sum(Y2));
    BOOST_TEST(a1.grad() == a2.grad());
    BOOST_TEST(b1.grad() == b2.grad());
    BOOST_TEST(c1.grad() == c2.grad());
}

BOOST_AUTO_TEST_CASE(each_operator_records_its_documented_ops) {
    std::mt19937_64 rng(9);
    const Tensor<mp50> X = tensor_cast<mp50>(away_from_zero(testing::random_tensor({2, 3}, rng)));
    for (const Spelling& s : spellings) {
        BOOST_TEST_CONTEXT(s.text) {
            Tape<mp50> written, named;
            const Var<mp50> a1 = written.leaf(X, "a"), a2 = named.leaf(X, "a");
            const Var<mp50> Y1 = s.with_operator(a1);
            const Var<mp50> Y2 = s.with_names(a2);
            std::vector<std::string> expected{"leaf"};
            expected.insert(expected.end(), s.ops.begin(), s.ops.end());
            BOOST_TEST(op_names(written) == expected, boost::test_tools::per_element());
            BOOST_TEST(op_names(named) == expected, boost::test_tools::per_element());
            BOOST_TEST(Y1.value() == Y2.value());  // the same ops on the same constants, to the last digit
            written.backward(sum(Y1));
            named.backward(sum(Y2));
            BOOST_TEST(a1.grad() == a2.grad());
        }
    }
}

BOOST_AUTO_TEST_CASE(a_constant_divisor_is_inverted_in_the_tapes_own_precision) {
    Tape<mp50> tape;
    const Var<mp50> a = tape.leaf(Tensor<mp50>(Shape{2}, mp50(1)), "a");
    const Var<mp50> third = a / 3.0;
    BOOST_TEST(third.value()[0] == mp50(1) / mp50(3));              // 50 digits of 1/3
    BOOST_TEST(third.value()[0] != mp50(1.0 / 3.0));                 // not the double 1/3
}

BOOST_AUTO_TEST_CASE(the_checker_names_the_same_branches_for_operators_and_named_calls) {
    const NamedTensor leaves[] = {{"x", Tensor<double>::matrix({{0.3, -0.8}, {1.1, 0.4}})}};
    const CheckReport written = check_gradients([](auto in) { return sum(in[0] * in[0] + in[0]); }, leaves);
    const CheckReport named = check_gradients([](auto in) { return sum(add(mul(in[0], in[0]), in[0])); }, leaves);
    BOOST_TEST(written.passed);
    BOOST_TEST(named.passed);
    BOOST_REQUIRE(written.branches.size() == named.branches.size());
    BOOST_TEST(written.branches.size() == 3u);  // x feeds mul twice and add once
    for (std::size_t i = 0; i < written.branches.size(); ++i) {
        BOOST_TEST(written.branches[i].consumer == named.branches[i].consumer);
    }
}
