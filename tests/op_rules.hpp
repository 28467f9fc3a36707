// One rule per public op: how a random graph draws it (its operands' shapes and value intervals,
// its settings) and how it records it. From this one list the tests derive the random graphs
// (test_random_graphs), the second-order row of every op (test_second_order_ops) and the graph of
// every op that the re-run and the saved tapes are proven on (every_op_graph: test_rerun,
// test_tape_file). A new public op gets one rule here, appended to `Rules`; each of those tests
// names an op struct of LibraryOps (ops/all.hpp) that no rule records.
//
// A rule is a struct with `name` (the public function it draws), `draw(Drawing&)` (false when the
// op cannot be applied to the values drawn so far) and `record(const Operands<V>&)` (the op on a
// tape of any scalar type: double, mp50 and the duals, for the checks). The constraints, fixed here:
// inputs of log and sqrt ≥ 0.3, of 1/x, a divisor and a fractional or negative power ≥ 0.5;
// broadcastable shapes; axes in range; valid indices; every value within ±10, computed by interval
// arithmetic from the leaves' domains, so the checker's derivation (|J'''| ≤ 1e3) holds; kinks
// (abs, relu, clamp at a bound, max at a tie) avoided by looking at the input's values
// (kink_distance). Every value no later step uses is an output: Y is that value, or the outputs
// flattened and concatenated, and J = probe(Y) = Σ Y ∘ G.
#pragma once

#include "support.hpp"

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace tapegrad::testing::rules {

constexpr std::size_t leaf_count = 3;

// Magnitudes within ±10 and inputs of log and sqrt ≥ 0.3, of 1/x ≥ 0.5 keep third derivatives of
// one op within 2/0.3³ ≈ 74 (log) and 6/0.5⁴ = 96 (1/x); a value of at most 48 elements keeps the
// 50-digit checker's cost per graph small.
constexpr double magnitude_cap = 10;
constexpr double root_margin = 0.3;     // log, sqrt
constexpr double divisor_margin = 0.5;  // reciprocal, div's divisor, pow with p < 0 or fractional
constexpr std::size_t element_cap = 48;
constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

// Kinks: an input of abs, relu or clamp must be at least `kink_distance` from each kink, and the
// largest entry of each lane of max ahead of the second by as much. Even an input that sits at a
// kink only because an identity holds (relu(x − x)) is refused: the checker's branch stage moves
// one consumer's copy of a leaf alone, which breaks the identity, and there the function can be C¹
// but not C² (relu(h)²), which central differences see as an O(h) error and the kink test (a jump
// in the first derivative) does not classify. 1e-6 is eight decades above the steps.
constexpr double kink_distance = 1e-6;

// An interval holding a value's every entry.
struct Range {
    double lo = 0, hi = 0;
    double magnitude() const { return std::max(std::abs(lo), std::abs(hi)); }
};

// One step of a recipe: rule `rule` applied to earlier values (leaves are 0..leaf_count-1), with
// its settings drawn.
struct Step {
    std::size_t rule = 0;
    std::vector<std::size_t> in;  // operand values (layer_norm's gain and bias: `none` for a constant)
    double c = 0, d = 0;          // scale and shift constants, pow's exponent, clamp's bounds, dropout's p
    int axis = 0;
    bool flag = false;              // keepdims, causal, GELU's erf form
    std::size_t n = 0, m = 0;       // heads, query offset, slice range, embedding sequences
    std::size_t window = 0;         // fused attention's sliding window
    std::vector<std::size_t> list;  // permute's axes, reshape's dims, embedding's indices, targets
    Tensor<double> first, second;   // mask's pattern, dropout's keep-mask, constant gain and bias
    std::uint64_t seed = 0;         // dropout's generator
};

struct Recipe {
    std::uint64_t seed = 0;
    std::array<Shape, leaf_count> leaf_shapes;
    std::array<bool, leaf_count> leaf_positive{};  // drawn from [0.5, 1.5] instead of [−1, 1]
    std::vector<Step> steps;
    std::vector<Shape> shapes;  // of every value: leaves, then one per step
    std::vector<Range> ranges;

    // Values no step uses (leaves excepted): the graph's outputs.
    std::vector<std::size_t> outputs() const {
        std::vector<bool> used(shapes.size(), false);
        for (const Step& s : steps)
            for (const std::size_t v : s.in)
                if (v != none) used[v] = true;
        std::vector<std::size_t> out;
        for (std::size_t v = leaf_count; v < shapes.size(); ++v)
            if (!used[v]) out.push_back(v);
        return out;
    }

    bool uses(std::size_t rule) const {
        return std::any_of(steps.begin(), steps.end(), [rule](const Step& s) { return s.rule == rule; });
    }
};

inline Shape shape_of(const std::vector<std::size_t>& dims) { return Shape(std::span<const std::size_t>(dims)); }
inline std::vector<std::size_t> dims_of(const Shape& s) { return {s.dims().begin(), s.dims().end()}; }

// The leaves of a recipe, drawn from its seed: [−1, 1], or [0.5, 1.5] for a positive leaf.
inline std::array<NamedTensor, leaf_count> leaves_of(const Recipe& recipe) {
    std::mt19937_64 rng(recipe.seed);
    std::array<NamedTensor, leaf_count> leaves;
    for (std::size_t l = 0; l < leaf_count; ++l) {
        Tensor<double> t = random_tensor(recipe.leaf_shapes[l], rng, recipe.leaf_positive[l] ? 0.5 : 1.0);
        if (recipe.leaf_positive[l])
            for (double& x : t.data()) x += 1.0;
        leaves[l] = {fmt::format("x{}", l), std::move(t)};
    }
    return leaves;
}

// What a rule's draw sees: the recipe so far, the generator, and the step it fills (operands,
// settings, the result's shape and interval).
struct Drawing {
    Recipe& r;
    std::mt19937_64& rng;
    Step step;
    Shape out;
    Range range;

    std::size_t uniform(std::size_t lo, std::size_t hi) {
        return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
    }
    double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
    const Shape& shape(std::size_t v) const { return r.shapes[v]; }
    const Range& range_of(std::size_t v) const { return r.ranges[v]; }

    // The latest candidate with probability 2/3 (graphs grow deep), else any (they grow wide).
    std::size_t pick(const std::vector<std::size_t>& candidates) {
        if (candidates.empty()) return none;
        return uniform(0, 2) != 0 ? candidates.back() : candidates[uniform(0, candidates.size() - 1)];
    }
    template <class Accepts>
    std::vector<std::size_t> values_where(Accepts accepts) const {
        std::vector<std::size_t> found;
        for (std::size_t v = 0; v < r.shapes.size(); ++v)
            if (accepts(r.shapes[v], r.ranges[v])) found.push_back(v);
        return found;
    }
    // The op's only operand (or first): picked among the accepted values; the result's shape is
    // taken to be the operand's until the rule says otherwise. `none` when no value is accepted.
    template <class Accepts>
    std::size_t unary(Accepts accepts) {
        const std::size_t a = pick(values_where(accepts));
        if (a == none) return none;
        step.in = {a};
        out = r.shapes[a];
        return a;
    }
    std::size_t unary() {
        return unary([](const Shape&, const Range&) { return true; });
    }
    std::size_t unary_of_rank_at_least(std::size_t k) {
        return unary([k](const Shape& s, const Range&) { return s.rank() >= k; });
    }
    // An axis in range, given from the front or, half the time, from the back (negative).
    int signed_axis(std::size_t axis, std::size_t rank) {
        return static_cast<int>(axis) - (uniform(0, 1) == 1 ? static_cast<int>(rank) : 0);
    }
    // A value as the graph computes it in double, for the constraints intervals cannot give
    // (defined after Graph).
    Tensor<double> value_now(std::size_t v) const;
};

// What a rule's record sees: the values computed so far, its step.
template <class V>
struct Operands {
    const std::vector<V>& values;
    const Step& step;

    using T = scalar_of<V>;
    const V& operator[](std::size_t i) const { return values[step.in[i]]; }
    V constant(const Tensor<double>& t) const { return values[0].tape().constant(tensor_cast<T>(t)); }
    // The operand, or the step's constant where the rule drew one instead (in = none).
    V or_constant(std::size_t i, const Tensor<double>& t) const {
        return step.in[i] == none ? constant(t) : (*this)[i];
    }
};

inline bool away_from(const Tensor<double>& x, std::initializer_list<double> kinks) {
    for (const double v : x.data())
        for (const double k : kinks)
            if (std::abs(v - k) < kink_distance) return false;
    return true;
}

inline bool untied(const Tensor<double>& x, std::size_t axis) {
    const std::span<const std::size_t> dims = x.shape().dims();
    std::size_t inner = 1;
    for (std::size_t i = axis + 1; i < dims.size(); ++i) inner *= dims[i];
    const std::size_t n = dims[axis], outer = x.size() / (n * inner);
    for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t i = 0; i < inner; ++i) {
            double first = -std::numeric_limits<double>::infinity(), second = first;
            for (std::size_t j = 0; j < n; ++j) {
                const double v = x[(o * n + j) * inner + i];
                if (v > first)
                    second = first, first = v;
                else if (v > second)
                    second = v;
            }
            if (n > 1 && first - second < kink_distance) return false;
        }
    return true;
}

inline Range product_range(const Range& x, const Range& y) {
    const std::array p{x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi};
    return {*std::min_element(p.begin(), p.end()), *std::max_element(p.begin(), p.end())};
}

// An increasing function's image of the interval.
template <class F>
Range image(const Range& x, F f) {
    return {f(x.lo), f(x.hi)};
}

// A rule whose op has settings also gives `settings_sample(const SettingsLeaves&)`: the op recorded
// on these leaves with every setting away from its default (axes other than 0, keepdims true, the
// erf form, a causal fused attention with a query offset, its own tiles, a window and ALiBi, an
// embedding of sequences, ...). test_tape_file saves and loads them all and changes each saved
// setting in the file, so every op's settings round-trip with no row of their own elsewhere.
struct SettingsLeaves {
    Var<double> X;     // [2x4] in [0.5, 1.5): inside clamp's bounds, pow's domain, positive rows
    Var<double> E;     // [5x4] an embedding table
    Var<double> gain;  // [4]
    Var<double> bias;  // [4]
    Var<double> keep;  // [2x4] a 0/1 constant keep-mask
};

// ---- the rules: elementwise binary ops (broadcasting) ----

// The partner of a broadcasting op: any value whose shape broadcasts with a's (a divisor ≥ 0.5).
inline bool draw_broadcasting(Drawing& d, bool divisor) {
    const std::size_t a = d.unary();
    std::vector<std::size_t> partners;
    for (std::size_t v = 0; v < d.r.shapes.size(); ++v) {
        if (!try_broadcast_shape(d.shape(a), d.shape(v))) continue;
        if (divisor && d.range_of(v).lo < divisor_margin) continue;
        partners.push_back(v);
    }
    const std::size_t b = d.pick(partners);
    if (b == none) return false;
    d.step.in = {a, b};
    d.out = *try_broadcast_shape(d.shape(a), d.shape(b));
    return true;
}

struct AddRule {
    static constexpr std::string_view name = "add";
    static bool draw(Drawing& d) {
        if (!draw_broadcasting(d, false)) return false;
        const Range &x = d.range_of(d.step.in[0]), &y = d.range_of(d.step.in[1]);
        d.range = {x.lo + y.lo, x.hi + y.hi};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return add(x[0], x[1]); }
};

struct SubRule {
    static constexpr std::string_view name = "sub";
    static bool draw(Drawing& d) {
        if (!draw_broadcasting(d, false)) return false;
        const Range &x = d.range_of(d.step.in[0]), &y = d.range_of(d.step.in[1]);
        d.range = {x.lo - y.hi, x.hi - y.lo};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return sub(x[0], x[1]); }
};

struct MulRule {
    static constexpr std::string_view name = "mul";
    static bool draw(Drawing& d) {
        if (!draw_broadcasting(d, false)) return false;
        d.range = product_range(d.range_of(d.step.in[0]), d.range_of(d.step.in[1]));
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return mul(x[0], x[1]); }
};

struct DivRule {
    static constexpr std::string_view name = "div";
    static bool draw(Drawing& d) {
        if (!draw_broadcasting(d, true)) return false;
        const Range& y = d.range_of(d.step.in[1]);
        d.range = product_range(d.range_of(d.step.in[0]), Range{1 / y.hi, 1 / y.lo});
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return div(x[0], x[1]); }
};

// ---- a vector along the last axis: add_bias, layer_norm ----

// A partner [D] when one exists (three times in four), else a constant drawn in [lo, hi].
inline Range vector_or_constant(Drawing& d, std::size_t D, Tensor<double>& constant, double lo, double hi) {
    const auto vectors = d.values_where([D](const Shape& s, const Range&) { return s == Shape{D}; });
    const std::size_t v = vectors.empty() || d.uniform(0, 3) == 0 ? none : vectors[d.uniform(0, vectors.size() - 1)];
    if (v == none) {
        constant = Tensor<double>(Shape{D});
        for (double& x : constant.data()) x = d.real(lo, hi);
    }
    d.step.in.push_back(v);
    return v == none ? Range{lo, hi} : d.range_of(v);
}

struct AddBiasRule {
    static constexpr std::string_view name = "add_bias";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(2);
        if (a == none) return false;
        const Range b = vector_or_constant(d, d.shape(a).cols(), d.step.first, -1, 1);
        d.range = {d.range_of(a).lo + b.lo, d.range_of(a).hi + b.hi};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return add_bias(x[0], x.or_constant(1, x.step.first)); }
};

// Rows of width D ≥ 2 must be spread (standard deviation ≥ 0.1): the normaliser 1/σ makes the k-th
// derivative grow as σ^−k, and near σ = 0 (up to ε = 1e-5) the third derivative would pass the 1e3
// the checker's steps are derived for.
inline bool rows_spread(const Tensor<double>& X, std::size_t D) {
    for (std::size_t row = 0; row < X.size() / D; ++row) {
        double mean = 0, squares = 0;
        for (std::size_t j = 0; j < D; ++j) mean += X[row * D + j] / static_cast<double>(D);
        for (std::size_t j = 0; j < D; ++j) squares += (X[row * D + j] - mean) * (X[row * D + j] - mean);
        if (std::sqrt(squares / static_cast<double>(D)) < 0.1) return false;
    }
    return true;
}

struct LayerNormRule {
    static constexpr std::string_view name = "layer_norm";
    static Var<double> settings_sample(const SettingsLeaves& l) { return layer_norm(l.X, l.gain, l.bias, LayerNormSettings{1e-3}); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const std::size_t D = d.shape(a).cols();
        if (D >= 2 && !rows_spread(d.value_now(a), D)) return false;
        // Each normalised entry is at most √D in magnitude.
        const Range g = vector_or_constant(d, D, d.step.first, 0.5, 1.5);
        const Range b = vector_or_constant(d, D, d.step.second, -1, 1);
        const double spread = g.magnitude() * std::sqrt(static_cast<double>(D));
        d.range = {b.lo - spread, b.hi + spread};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) {
        return layer_norm(x[0], x.or_constant(1, x.step.first), x.or_constant(2, x.step.second));
    }
};

// ---- elementwise unary ops ----

struct NegRule {
    static constexpr std::string_view name = "neg";
    static bool draw(Drawing& d) {
        const Range& x = d.range_of(d.unary());
        d.range = {-x.hi, -x.lo};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return neg(x[0]); }
};

struct ShiftRule {
    static constexpr std::string_view name = "shift";
    static Var<double> settings_sample(const SettingsLeaves& l) { return shift(l.X, 0.125); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        d.step.c = d.real(-1, 1);
        d.range = {d.range_of(a).lo + d.step.c, d.range_of(a).hi + d.step.c};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return shift(x[0], scalar_of<V>(x.step.c)); }
};

struct ScaleRule {
    static constexpr std::string_view name = "scale";
    static Var<double> settings_sample(const SettingsLeaves& l) { return scale(l.X, 0.75); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        d.step.c = d.real(-2, 2);
        d.range = product_range(d.range_of(a), Range{d.step.c, d.step.c});
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return scale(x[0], scalar_of<V>(x.step.c)); }
};

// An operand whose every entry is at least `margin`: its interval, or null when there is none.
inline const Range* positive_operand(Drawing& d, double margin) {
    const std::size_t a = d.unary([margin](const Shape&, const Range& x) { return x.lo >= margin; });
    return a == none ? nullptr : &d.range_of(a);
}

struct ReciprocalRule {
    static constexpr std::string_view name = "reciprocal";
    static bool draw(Drawing& d) {
        const Range* x = positive_operand(d, divisor_margin);
        if (x == nullptr) return false;
        d.range = {1 / x->hi, 1 / x->lo};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return reciprocal(x[0]); }
};

struct ExpRule {
    static constexpr std::string_view name = "exp";
    static bool draw(Drawing& d) {
        d.range = image(d.range_of(d.unary()), [](double v) { return std::exp(v); });
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return exp(x[0]); }
};

struct LogRule {
    static constexpr std::string_view name = "log";
    static bool draw(Drawing& d) {
        const Range* x = positive_operand(d, root_margin);
        if (x == nullptr) return false;
        d.range = image(*x, [](double v) { return std::log(v); });
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return log(x[0]); }
};

// ln(1 + a): 1 + a ≥ 0.5, as a divisor's, keeps the k-th derivative (k−1)!/(1 + a)^k within 16 at k = 3.
struct Log1pRule {
    static constexpr std::string_view name = "log1p";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary([](const Shape&, const Range& x) { return x.lo >= divisor_margin - 1; });
        if (a == none) return false;
        d.range = image(d.range_of(a), [](double v) { return std::log1p(v); });
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return log1p(x[0]); }
};

struct SqrtRule {
    static constexpr std::string_view name = "sqrt";
    static bool draw(Drawing& d) {
        const Range* x = positive_operand(d, root_margin);
        if (x == nullptr) return false;
        d.range = image(*x, [](double v) { return std::sqrt(v); });
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return sqrt(x[0]); }
};

struct TanhRule {
    static constexpr std::string_view name = "tanh";
    static bool draw(Drawing& d) {
        d.range = image(d.range_of(d.unary()), [](double v) { return std::tanh(v); });
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return tanh(x[0]); }
};

struct SigmoidRule {
    static constexpr std::string_view name = "sigmoid";
    static bool draw(Drawing& d) {
        d.range = image(d.range_of(d.unary()), [](double v) { return 1 / (1 + std::exp(-v)); });
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return sigmoid(x[0]); }
};

struct AbsRule {
    static constexpr std::string_view name = "abs";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        const Range& x = d.range_of(a);
        d.range = {x.lo >= 0 ? x.lo : x.hi <= 0 ? -x.hi : 0.0, x.magnitude()};
        return away_from(d.value_now(a), {0.0});
    }
    template <class V>
    static V record(const Operands<V>& x) { return abs(x[0]); }
};

struct PowRule {
    static constexpr std::string_view name = "pow";
    static Var<double> settings_sample(const SettingsLeaves& l) { return pow(l.X, 1.5); }
    static bool draw(Drawing& d) {
        const Range& x = d.range_of(d.unary());
        // Integer powers for any sign; fractional and negative ones for inputs ≥ divisor_margin.
        static constexpr std::array integer{2.0, 3.0};
        static constexpr std::array positive_only{-1.0, -0.5, 0.5, 1.5, 2.5};
        d.step.c = x.lo >= divisor_margin && d.uniform(0, 1) == 1
                       ? positive_only[d.uniform(0, positive_only.size() - 1)]
                       : integer[d.uniform(0, integer.size() - 1)];
        const double p = d.step.c;
        if (x.lo >= 0)
            d.range = {std::min(std::pow(x.lo, p), std::pow(x.hi, p)), std::max(std::pow(x.lo, p), std::pow(x.hi, p))};
        else if (p == 2)
            d.range = {x.hi <= 0 ? x.hi * x.hi : 0.0, x.magnitude() * x.magnitude()};
        else
            d.range = {std::pow(x.lo, 3), std::pow(x.hi, 3)};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return pow(x[0], scalar_of<V>(x.step.c)); }
};

struct ClampRule {
    static constexpr std::string_view name = "clamp";
    static Var<double> settings_sample(const SettingsLeaves& l) { return clamp(l.X, 0.25, 2.0); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        d.step.c = d.real(-1, 0.5);
        d.step.d = d.step.c + d.real(0.25, 1.5);
        d.range = image(d.range_of(a), [&d](double v) { return std::clamp(v, d.step.c, d.step.d); });
        return away_from(d.value_now(a), {d.step.c, d.step.d});
    }
    template <class V>
    static V record(const Operands<V>& x) {
        return clamp(x[0], scalar_of<V>(x.step.c), scalar_of<V>(x.step.d));
    }
};

struct ReluRule {
    static constexpr std::string_view name = "relu";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        d.range = image(d.range_of(a), [](double v) { return std::max(v, 0.0); });
        return away_from(d.value_now(a), {0.0});
    }
    template <class V>
    static V record(const Operands<V>& x) { return relu(x[0]); }
};

struct GeluRule {
    static constexpr std::string_view name = "gelu";
    static Var<double> settings_sample(const SettingsLeaves& l) { return gelu(l.X, GeluForm::erf); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        d.range = {-0.2, std::max(d.range_of(a).hi, 0.0)};  // GELU(x) ≥ −0.17 everywhere, ≤ max(x, 0)
        d.step.flag = d.uniform(0, 1) == 1;
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return gelu(x[0], x.step.flag ? GeluForm::erf : GeluForm::tanh); }
};

// ---- products and the attention's parts ----

struct MatmulRule {
    static constexpr std::string_view name = "matmul";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(2);
        if (a == none) return false;
        const Shape& A = d.shape(a);
        const std::size_t b = d.pick(d.values_where([&A](const Shape& B, const Range&) {
            return B.rank() >= 2 && B.rows() == A.cols() &&
                   (B.rank() == 2 || (B.rank() == A.rank() && A.same_batch(B)));
        }));
        if (b == none) return false;
        d.step.in.push_back(b);
        d.out = A.with_matrix(A.rows(), d.shape(b).cols());
        const double bound = static_cast<double>(A.cols()) * d.range_of(a).magnitude() * d.range_of(b).magnitude();
        d.range = {-bound, bound};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return matmul(x[0], x[1]); }
};

// The bfloat16 product by name: on the checks' tapes (double, 50 digits, duals) the exact product,
// so its row proves the VJP formulas it shares with matmul; its float path (the rounding) is
// tests/test_mixed_precision.cpp's.
struct MatmulBf16Rule : MatmulRule {
    static constexpr std::string_view name = "matmul_bf16";
    template <class V>
    static V record(const Operands<V>& x) { return matmul_bf16(x[0], x[1]); }
};

struct TransposeRule {
    static constexpr std::string_view name = "transpose";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(2);
        if (a == none) return false;
        d.out = d.shape(a).with_matrix(d.shape(a).cols(), d.shape(a).rows());
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return transpose(x[0]); }
};

struct SoftmaxRule {
    static constexpr std::string_view name = "softmax";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const Range& x = d.range_of(a);
        d.range = {std::exp(x.lo - x.hi) / static_cast<double>(d.shape(a).cols()), 1};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return softmax(x[0]); }
};

// Recorded as softmax(mask(S, M)): mask's −∞ entries would leave the caps.
struct MaskRule {
    static constexpr std::string_view name = "mask";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(2);
        if (a == none) return false;
        const Shape& S = d.shape(a);
        // One mask for the batch, or one per matrix; some rows may be hidden entirely.
        d.step.first = Tensor<double>(S.rank() > 2 && d.uniform(0, 1) == 1 ? Shape{S.rows(), S.cols()} : S);
        for (double& v : d.step.first.data()) v = d.uniform(0, 3) == 0 ? 0.0 : 1.0;
        d.range = {0, 1};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return softmax(mask(x[0], x.constant(x.step.first))); }
};

struct LogSoftmaxRule {
    static constexpr std::string_view name = "log_softmax";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const Range& x = d.range_of(a);
        d.range = {x.lo - x.hi - std::log(static_cast<double>(d.shape(a).cols())), 0};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return log_softmax(x[0]); }
};

struct FusedAttentionRule {
    static constexpr std::string_view name = "fused_attention";
    // Causal with a query offset and its own tiles; and a window and ALiBi over one head, Q [1, 2, 4]:
    // of the changed values, alibi_heads 0 loads (2 is refused: Q has one head), windows 0 and 2 load.
    static Var<double> settings_sample(const SettingsLeaves& l) {
        const Var<double> h = reshape(l.X, Shape{4, 2}), one_head = split_heads(l.X, 1);
        return add(sum(fused_attention(h, h, h, true, 2, FusedAttentionTiles{3, 2})),
                   sum(fused_attention(one_head, one_head, one_head, {.pattern = {.causal = true, .window = 1, .alibi_heads = 1}})));
    }
    static bool draw(Drawing& d) {
        const std::size_t q = d.unary_of_rank_at_least(2);
        if (q == none) return false;
        const Shape& Q = d.shape(q);
        const auto same_batch = [&Q](const Shape& s) { return s.rank() == Q.rank() && Q.same_batch(s); };
        const std::size_t k =
            d.pick(d.values_where([&](const Shape& s, const Range&) { return same_batch(s) && s.cols() == Q.cols(); }));
        const Shape& K = d.shape(k);
        const std::size_t v =
            d.pick(d.values_where([&](const Shape& s, const Range&) { return same_batch(s) && s.rows() == K.rows(); }));
        d.step.in = {q, k, v};
        d.step.flag = d.uniform(0, 1) == 1;
        d.step.m = d.step.flag ? d.uniform(0, 2) : 0;
        // A sliding window when the queries lie within the keys (1 key up to all of them), ALiBi's
        // bias over the dimension before [T, d] when there is one: each half the time.
        const bool window_fits = d.step.flag && d.step.m + Q.rows() <= K.rows();
        d.step.window = window_fits && d.uniform(0, 1) == 1 ? d.uniform(1, K.rows()) : 0;
        d.step.n = Q.rank() >= 3 && d.uniform(0, 1) == 1 ? Q[Q.rank() - 3] : 0;
        d.out = Q.with_matrix(Q.rows(), d.shape(v).cols());
        d.range = d.range_of(v);  // each output row is a convex combination of V's rows
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) {
        return fused_attention(x[0], x[1], x[2],
                               {.pattern = {.causal = x.step.flag,
                                            .query_offset = x.step.m,
                                            .window = x.step.window,
                                            .alibi_heads = x.step.n}});
    }
};

// Fused attention with bfloat16 tile products, by name: on the checks' tapes (double, 50 digits,
// duals) fused_attention itself, so its row proves the VJP it shares with fused_attention; its
// float path (the rounding) is tests/test_mixed_precision.cpp's.
struct FusedAttentionBf16Rule : FusedAttentionRule {
    static constexpr std::string_view name = "fused_attention_bf16";
    static Var<double> settings_sample(const SettingsLeaves& l) {
        const Var<double> h = reshape(l.X, Shape{4, 2}), one_head = split_heads(l.X, 1);
        return add(
            sum(fused_attention_bf16(h, h, h, {.pattern = {.causal = true, .query_offset = 2}, .tiles = {3, 2}})),
            sum(fused_attention_bf16(one_head, one_head, one_head,
                                     {.pattern = {.causal = true, .window = 1, .alibi_heads = 1}})));
    }
    template <class V>
    static V record(const Operands<V>& x) {
        return fused_attention_bf16(
            x[0], x[1], x[2],
            {.pattern = {
                 .causal = x.step.flag, .query_offset = x.step.m, .window = x.step.window, .alibi_heads = x.step.n}});
    }
};

// ---- reductions ----

struct SumRule {
    static constexpr std::string_view name = "sum";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        d.out = Shape{};
        const double n = static_cast<double>(d.shape(a).size());
        d.range = {n * d.range_of(a).lo, n * d.range_of(a).hi};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return sum(x[0]); }
};

// An axis drawn for a reduction, keepdims or not; the result's shape set, the axis's length returned.
inline double draw_reduction(Drawing& d, std::size_t a) {
    const std::size_t rank = d.shape(a).rank(), axis = d.uniform(0, rank - 1);
    d.step.axis = d.signed_axis(axis, rank);
    d.step.flag = d.uniform(0, 1) == 1;
    d.step.n = axis;
    std::vector<std::size_t> dims = dims_of(d.shape(a));
    const double n = static_cast<double>(dims[axis]);
    if (d.step.flag)
        dims[axis] = 1;
    else
        dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
    d.out = shape_of(dims);
    return n;
}

struct SumAxisRule {
    static constexpr std::string_view name = "sum_axis";
    static Var<double> settings_sample(const SettingsLeaves& l) { return sum(l.X, 1, true); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const double n = draw_reduction(d, a);
        d.range = {n * d.range_of(a).lo, n * d.range_of(a).hi};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return sum(x[0], x.step.axis, x.step.flag); }
};

struct MeanRule {
    static constexpr std::string_view name = "mean";
    static Var<double> settings_sample(const SettingsLeaves& l) { return mean(l.X, 1, false); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        draw_reduction(d, a);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return mean(x[0], x.step.axis, x.step.flag); }
};

struct MaxRule {
    static constexpr std::string_view name = "max";
    static Var<double> settings_sample(const SettingsLeaves& l) { return max(l.X, 1, true); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        draw_reduction(d, a);
        d.range = d.range_of(a);
        return untied(d.value_now(a), d.step.n);
    }
    template <class V>
    static V record(const Operands<V>& x) { return max(x[0], x.step.axis, x.step.flag); }
};

struct LogsumexpRule {
    static constexpr std::string_view name = "logsumexp";
    static Var<double> settings_sample(const SettingsLeaves& l) { return logsumexp(l.X, 0, true); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const double n = draw_reduction(d, a);
        d.range = {d.range_of(a).lo, d.range_of(a).hi + std::log(n)};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return logsumexp(x[0], x.step.axis, x.step.flag); }
};

// ---- shape ops ----

struct ReshapeRule {
    static constexpr std::string_view name = "reshape";
    static Var<double> settings_sample(const SettingsLeaves& l) { return reshape(l.X, Shape{4, 2}); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        std::size_t remaining = d.shape(a).size();
        const std::size_t rank = d.uniform(1, 4);
        for (std::size_t i = 0; i + 1 < rank; ++i) {
            std::vector<std::size_t> divisors;
            for (std::size_t k = 1; k <= remaining; ++k)
                if (remaining % k == 0) divisors.push_back(k);
            d.step.list.push_back(divisors[d.uniform(0, divisors.size() - 1)]);
            remaining /= d.step.list.back();
        }
        d.step.list.push_back(remaining);
        d.out = shape_of(d.step.list);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return reshape(x[0], shape_of(x.step.list)); }
};

struct ConcatRule {
    static constexpr std::string_view name = "concat";
    static Var<double> settings_sample(const SettingsLeaves& l) { return concat({l.X, l.X}, 1); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const Shape A = d.shape(a);
        const std::size_t axis = d.uniform(0, A.rank() - 1);
        const auto partners = d.values_where([&](const Shape& s, const Range&) {
            if (s.rank() != A.rank()) return false;
            for (std::size_t i = 0; i < s.rank(); ++i)
                if (i != axis && s[i] != A[i]) return false;
            return true;
        });
        std::vector<std::size_t> dims = dims_of(A);
        d.range = d.range_of(a);
        for (std::size_t more = d.uniform(1, 2); more > 0; --more) {
            const std::size_t b = partners[d.uniform(0, partners.size() - 1)];
            d.step.in.push_back(b);
            dims[axis] += d.shape(b)[axis];
            d.range = {std::min(d.range.lo, d.range_of(b).lo), std::max(d.range.hi, d.range_of(b).hi)};
        }
        d.step.axis = d.signed_axis(axis, A.rank());
        d.out = shape_of(dims);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) {
        std::vector<V> parts;
        for (const std::size_t v : x.step.in) parts.push_back(x.values[v]);
        return concat(parts, x.step.axis);
    }
};

struct SliceRule {
    static constexpr std::string_view name = "slice";
    static Var<double> settings_sample(const SettingsLeaves& l) { return slice(l.X, 1, 0, 2); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const std::size_t rank = d.shape(a).rank(), axis = d.uniform(0, rank - 1), dim = d.shape(a)[axis];
        d.step.n = d.uniform(0, dim - 1);
        d.step.m = d.uniform(d.step.n + 1, dim);
        d.step.axis = d.signed_axis(axis, rank);
        std::vector<std::size_t> dims = dims_of(d.shape(a));
        dims[axis] = d.step.m - d.step.n;
        d.out = shape_of(dims);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return slice(x[0], x.step.axis, x.step.n, x.step.m); }
};

struct PermuteRule {
    static constexpr std::string_view name = "permute";
    static Var<double> settings_sample(const SettingsLeaves& l) { return permute(split_heads(l.X, 2), {0, 2, 1}); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        d.step.list.resize(d.shape(a).rank());
        std::iota(d.step.list.begin(), d.step.list.end(), std::size_t{0});
        std::shuffle(d.step.list.begin(), d.step.list.end(), d.rng);
        std::vector<std::size_t> dims;
        for (const std::size_t axis : d.step.list) dims.push_back(d.shape(a)[axis]);
        d.out = shape_of(dims);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return permute(x[0], std::span<const std::size_t>(x.step.list)); }
};

// ---- dropout, embedding, the loss, the heads ----

// p drawn from {0, 0.2, 0.5}; kept entries grow by 1/(1 − p).
inline std::size_t draw_dropout(Drawing& d) {
    const std::size_t a = d.unary_of_rank_at_least(1);
    if (a == none) return none;
    static constexpr std::array probabilities{0.0, 0.2, 0.5};
    d.step.c = probabilities[d.uniform(0, probabilities.size() - 1)];
    const double f = 1 / (1 - d.step.c);
    d.range = {std::min(0.0, d.range_of(a).lo * f), std::max(0.0, d.range_of(a).hi * f)};
    return a;
}

struct DropoutRule {
    static constexpr std::string_view name = "dropout";
    static bool draw(Drawing& d) {
        if (draw_dropout(d) == none) return false;
        d.step.seed = d.rng();
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) {
        std::mt19937_64 generator(x.step.seed);  // the same mask on every tape
        return dropout(x[0], x.step.c, generator);
    }
};

struct DropoutWithMaskRule {
    static constexpr std::string_view name = "dropout_with_mask";
    static Var<double> settings_sample(const SettingsLeaves& l) { return dropout_with_mask(l.X, l.keep, 0.25); }
    static bool draw(Drawing& d) {
        const std::size_t a = draw_dropout(d);
        if (a == none) return false;
        d.step.first = Tensor<double>(d.shape(a));
        for (double& k : d.step.first.data()) k = d.real(0, 1) >= d.step.c ? 1.0 : 0.0;
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return dropout_with_mask(x[0], x.constant(x.step.first), x.step.c); }
};

struct EmbeddingRule {
    static constexpr std::string_view name = "embedding";
    static Var<double> settings_sample(const SettingsLeaves& l) { return embedding(l.E, std::vector<std::size_t>{4, 0, 2, 1}, 2); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(2);
        if (a == none) return false;
        const std::size_t D = d.shape(a).cols(), rows = d.shape(a).size() / D, n = d.uniform(1, 4);
        for (std::size_t i = 0; i < n; ++i) d.step.list.push_back(d.uniform(0, rows - 1));
        d.step.n = n % 2 == 0 && d.uniform(0, 1) == 1 ? 2 : 0;  // as two sequences
        d.out = d.step.n ? Shape{2, n / 2, D} : Shape{n, D};
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) {
        const std::span<const std::size_t> rows(x.step.list);
        return x.step.n ? embedding(x[0], rows, x.step.n) : embedding(x[0], rows);
    }
};

struct CrossEntropyRule {
    static constexpr std::string_view name = "cross_entropy";
    static Var<double> settings_sample(const SettingsLeaves& l) { return cross_entropy(l.X, std::vector<std::size_t>{3, 1}); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const std::size_t V = d.shape(a).cols(), rows = d.shape(a).size() / V;
        for (std::size_t i = 0; i < rows; ++i) d.step.list.push_back(d.uniform(0, V - 1));
        d.out = Shape{};
        d.range = {0, d.range_of(a).hi - d.range_of(a).lo + std::log(static_cast<double>(V))};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return cross_entropy(x[0], std::span<const std::size_t>(x.step.list)); }
};

struct SplitHeadsRule {
    static constexpr std::string_view name = "split_heads";
    static Var<double> settings_sample(const SettingsLeaves& l) { return split_heads(l.X, 2); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary([](const Shape& s, const Range&) { return s.rank() == 2 || s.rank() == 3; });
        if (a == none) return false;
        const Shape& X = d.shape(a);
        std::vector<std::size_t> divisors;
        for (std::size_t h = 1; h <= X.cols(); ++h)
            if (X.cols() % h == 0) divisors.push_back(h);
        d.step.n = divisors[d.uniform(0, divisors.size() - 1)];
        std::vector<std::size_t> dims(X.dims().begin(), X.dims().end() - 2);
        for (const std::size_t k : {d.step.n, X.rows(), X.cols() / d.step.n}) dims.push_back(k);
        d.out = shape_of(dims);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return split_heads(x[0], x.step.n); }
};

struct MergeHeadsRule {
    static constexpr std::string_view name = "merge_heads";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary([](const Shape& s, const Range&) { return s.rank() == 3 || s.rank() == 4; });
        if (a == none) return false;
        const Shape& X = d.shape(a);
        std::vector<std::size_t> dims(X.dims().begin(), X.dims().end() - 3);
        dims.push_back(X.rows());
        dims.push_back(X[X.rank() - 3] * X.cols());
        d.out = shape_of(dims);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return merge_heads(x[0]); }
};

// ---- today's decoders: rms_norm, silu, rope, repeat_heads ----

struct RmsNormRule {
    static constexpr std::string_view name = "rms_norm";
    static Var<double> settings_sample(const SettingsLeaves& l) { return rms_norm(l.X, l.gain, {.epsilon = 1e-3}); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(1);
        if (a == none) return false;
        const std::size_t D = d.shape(a).cols();
        // Rows of root mean square ≥ 0.3: the k-th derivative grows as rms^−k (as layer_norm's σ).
        const Tensor<double> X = d.value_now(a);
        for (std::size_t row = 0; row < X.size() / D; ++row) {
            double squares = 0;
            for (std::size_t j = 0; j < D; ++j) squares += X[row * D + j] * X[row * D + j];
            if (std::sqrt(squares / static_cast<double>(D)) < 0.3) return false;
        }
        // Each normalised entry is at most √D in magnitude.
        const double spread =
            vector_or_constant(d, D, d.step.first, 0.5, 1.5).magnitude() * std::sqrt(static_cast<double>(D));
        d.range = {-spread, spread};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return rms_norm(x[0], x.or_constant(1, x.step.first)); }
};

struct SiluRule {
    static constexpr std::string_view name = "silu";
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary();
        d.range = {-0.28, std::max(d.range_of(a).hi, 0.0)};  // silu(x) ≥ −0.2785 everywhere, ≤ max(x, 0)
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return silu(x[0]); }
};

struct RopeRule {
    static constexpr std::string_view name = "rope";
    static Var<double> settings_sample(const SettingsLeaves& l) { return rope(split_heads(l.X, 2), {.base = 500, .pairing = RopePairing::halves, .first_position = 5}); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary([](const Shape& s, const Range&) { return s.rank() >= 2 && s.cols() % 2 == 0; });
        if (a == none) return false;
        d.step.c = d.uniform(0, 1) == 1 ? 10.0 : 10000.0;  // base
        d.step.flag = d.uniform(0, 1) == 1;              // the halves pairing
        d.step.n = d.uniform(0, 20);                      // first position
        const double m = std::sqrt(2.0) * d.range_of(a).magnitude();  // a rotated pair keeps its length
        d.range = {-m, m};
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) {
        return rope(x[0], {.base = x.step.c,
                           .pairing = x.step.flag ? RopePairing::halves : RopePairing::interleaved,
                           .first_position = x.step.n});
    }
};

struct RepeatHeadsRule {
    static constexpr std::string_view name = "repeat_heads";
    static Var<double> settings_sample(const SettingsLeaves& l) { return repeat_heads(split_heads(l.X, 2), 3); }
    static bool draw(Drawing& d) {
        const std::size_t a = d.unary_of_rank_at_least(3);
        if (a == none) return false;
        d.step.n = d.uniform(1, 3);  // groups
        d.out = RepeatHeads::output_shape(d.shape(a), d.step.n);
        d.range = d.range_of(a);
        return true;
    }
    template <class V>
    static V record(const Operands<V>& x) { return repeat_heads(x[0], x.step.n); }
};

// ---- the list: one rule per public op ----

template <class... Rule>
struct RuleList {
    static constexpr std::size_t size = sizeof...(Rule);
    static constexpr std::array<std::string_view, size> names{Rule::name...};
    static constexpr std::array<bool (*)(Drawing&), size> drawers{&Rule::draw...};
    // The record functions at V; `Override`, a rule of the same name as one of the list, records
    // in its place (a fault control's wrong op).
    template <class V, class Override>
    static constexpr std::array<V (*)(const Operands<V>&), size> recorders{
        (Rule::name == Override::name ? &Override::template record<V> : &Rule::template record<V>)...};
};

// clang-format off
using Rules = RuleList<
    AddRule, SubRule, MulRule, DivRule, AddBiasRule, NegRule, ShiftRule, ScaleRule, ReciprocalRule, ExpRule, LogRule,
    Log1pRule, SqrtRule, TanhRule, SigmoidRule, AbsRule, PowRule, ClampRule, ReluRule, GeluRule, MatmulRule, MatmulBf16Rule, TransposeRule,
    SoftmaxRule, MaskRule, LogSoftmaxRule, LayerNormRule, FusedAttentionRule, FusedAttentionBf16Rule, SumRule, SumAxisRule, MeanRule,
    MaxRule, LogsumexpRule, ReshapeRule, ConcatRule, SliceRule, PermuteRule, DropoutRule, DropoutWithMaskRule,
    EmbeddingRule, CrossEntropyRule, SplitHeadsRule, MergeHeadsRule, RmsNormRule, SiluRule, RopeRule,
    RepeatHeadsRule>;
// clang-format on

// The index of the rule named `name`; throws for an unknown name.
inline std::size_t rule_named(std::string_view name) {
    const auto found = std::find(Rules::names.begin(), Rules::names.end(), name);
    if (found == Rules::names.end()) throw std::invalid_argument(fmt::format("no rule named '{}'", name));
    return static_cast<std::size_t>(found - Rules::names.begin());
}

// No rule replaced.
struct NoOverride {
    static constexpr std::string_view name = "";
    template <class V>
    static V record(const Operands<V>& x) { return x[0]; }
};

// The recipe as a graph over any scalar type: J = probe(Y) (or Y itself, `output_Y`), for the checks.
template <class Override = NoOverride>
struct Graph {
    const Recipe* recipe;
    bool output_Y = false;
    std::size_t stop_at = none;  // return this value as soon as it is computed (the generator's look at it)

    template <class Leaves>
    auto operator()(Leaves leaves) const {
        using V = typename Leaves::value_type;
        std::vector<V> values(leaves.begin(), leaves.end());
        values.reserve(leaf_count + recipe->steps.size());
        if (stop_at < values.size()) return values[stop_at];
        for (const Step& s : recipe->steps) {
            values.push_back(Rules::recorders<V, Override>[s.rule](Operands<V>{values, s}));
            if (stop_at < values.size()) return values[stop_at];
        }
        const std::vector<std::size_t> outputs = recipe->outputs();
        V Y = values[outputs.front()];
        if (outputs.size() > 1) {
            std::vector<V> flat;
            for (const std::size_t v : outputs) flat.push_back(reshape(values[v], Shape{values[v].shape().size()}));
            Y = concat(flat, 0);
        }
        return output_Y ? Y : probe(Y);
    }
};

// The recipe's leaves on a tape.
inline std::array<Var<double>, leaf_count> leaves_on(Tape<double>& tape, const std::array<NamedTensor, leaf_count>& l) {
    std::array<Var<double>, leaf_count> vars;
    for (std::size_t i = 0; i < leaf_count; ++i) vars[i] = tape.leaf(l[i].value, l[i].name);
    return vars;
}

inline Tensor<double> Drawing::value_now(std::size_t v) const {
    Tape<double> tape;
    return Graph<>{&r, false, v}(leaves_on(tape, leaves_of(r))).value();
}

// The recipe as its tape shows it, node by node, with each op's settings (the op's declared
// fields): "seed 12: x0 [2x3]; ... n5 = matmul(x0, n4) [2x3]; ...". A recipe an op refuses shows
// the nodes before it and the refusal.
inline std::string describe(const Recipe& recipe) {
    std::string text = fmt::format("seed {}:", recipe.seed);
    for (std::size_t l = 0; l < leaf_count; ++l)
        text += fmt::format(" x{} {}{};", l, recipe.shapes[l].to_string(),
                            recipe.leaf_positive[l] ? " in [0.5, 1.5]" : "");
    Tape<double> tape;
    std::string refused;
    try {
        (void)Graph<>{&recipe, true}(leaves_on(tape, leaves_of(recipe)));
    } catch (const std::exception& e) {
        refused = fmt::format(" refused: {}", e.what());
    }
    const auto name = [](std::uint32_t i) {
        return i < leaf_count ? fmt::format("x{}", i) : fmt::format("n{}", i);
    };
    for (std::uint32_t i = leaf_count; i < tape.size(); ++i) {
        const NodeInfo info = tape.info(i);
        std::vector<std::string> args;
        for (const std::uint32_t in : info.inputs) args.push_back(name(in));
        if (info.op == "leaf") {
            text += fmt::format(" {} = constant {};", name(i), info.shape.to_string());
            continue;
        }
        text += fmt::format(" {} = {}({}{}{}) {};", name(i), info.op, fmt::join(args, ", "),
                            info.settings.empty() ? "" : "; ", info.settings, info.shape.to_string());
    }
    return text + refused + " Y = the unused values (flattened, concatenated); J = probe(Y)";
}

// Appends a step of rule `rule` to the recipe; false (nothing appended) when it cannot be applied
// there or its result would leave the caps.
inline bool try_step(Recipe& r, std::mt19937_64& rng, std::size_t rule) {
    Drawing d{r, rng, Step{}, Shape{}, Range{}};
    d.step.rule = rule;
    if (!Rules::drawers[rule](d)) return false;
    if (d.step.in.empty() || d.step.in[0] == none) return false;
    if (d.out.size() > element_cap || !(d.range.magnitude() <= magnitude_cap)) return false;
    r.steps.push_back(std::move(d.step));
    r.shapes.push_back(d.out);
    r.ranges.push_back(d.range);
    return true;
}

// A recipe's leaves: rank 1 to 3, each length 1 to 3; positive or not.
inline Recipe leaves_drawn(std::uint64_t seed, std::mt19937_64& rng) {
    const auto uniform = [&](std::size_t lo, std::size_t hi) {
        return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
    };
    Recipe r;
    r.seed = seed;
    for (std::size_t l = 0; l < leaf_count; ++l) {
        std::vector<std::size_t> dims(uniform(1, 3));
        for (std::size_t& d : dims) d = uniform(1, 3);
        r.leaf_shapes[l] = shape_of(dims);
        r.leaf_positive[l] = uniform(0, 1) == 1;
        r.shapes.push_back(r.leaf_shapes[l]);
        r.ranges.push_back(r.leaf_positive[l] ? Range{0.5, 1.5} : Range{-1, 1});
    }
    return r;
}

// Draws a recipe: 2 to 8 steps. Each step draws a rule uniformly, then its first operand among the
// values the op accepts, then its partners and settings; an op with no valid operand, or whose
// result would leave the caps, is drawn again. `forced`: the last step is this rule when it can be
// applied.
inline Recipe draw(std::uint64_t seed, std::optional<std::size_t> forced = std::nullopt) {
    std::mt19937_64 rng(seed);
    Recipe r = leaves_drawn(seed, rng);
    const std::size_t steps = std::uniform_int_distribution<std::size_t>(2, 8)(rng);
    while (r.steps.size() < steps) {
        if (forced && r.steps.size() + 1 == steps && try_step(r, rng, *forced)) break;
        try_step(r, rng, std::uniform_int_distribution<std::size_t>(0, Rules::size - 1)(rng));
    }
    return r;
}

// A recipe holding every rule at least once, in the list's order, each tried up to 200 times with
// a random step drawn between tries (to grow an operand it accepts); the first seed from `seed` on
// for which every rule was applied.
inline Recipe draw_every_rule(std::uint64_t seed) {
    for (std::uint64_t attempt = seed; attempt < seed + 100; ++attempt) {
        std::mt19937_64 rng(attempt);
        Recipe r = leaves_drawn(attempt, rng);
        bool complete = true;
        for (std::size_t rule = 0; rule < Rules::size && complete; ++rule) {
            std::size_t tries = 0;
            while (!try_step(r, rng, rule) && ++tries < 200)
                try_step(r, rng, std::uniform_int_distribution<std::size_t>(0, Rules::size - 1)(rng));
            complete = tries < 200;
        }
        if (complete) return r;
    }
    throw std::logic_error(fmt::format("draw_every_rule: no seed in [{}, {}) applies every rule", seed, seed + 100));
}

}  // namespace tapegrad::testing::rules

namespace tapegrad::testing {

// Every op struct of the library on one tape, J = probe(Y) its scalar output: a recipe holding
// every rule (rules::draw_every_rule), so inputs away from every kink. What the re-run (test_rerun)
// and the saved tapes (test_tape_file) are proven on; test_rerun names an op struct of LibraryOps
// (ops/all.hpp) the graph misses.
inline Var<double> every_op_graph(Tape<double>& tape, std::uint64_t seed = 17) {
    const rules::Recipe recipe = rules::draw_every_rule(seed);
    return rules::Graph<>{&recipe}(rules::leaves_on(tape, rules::leaves_of(recipe)));
}

}  // namespace tapegrad::testing
