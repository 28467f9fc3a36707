// Random-graph testing: a seeded generator composes random chains and DAGs of every public op
// (ops/*.hpp: the 41 of `op_names` below) on random compatible shapes, each op with its argument
// constraints: inputs at least 0.3 for log and sqrt and at least 0.5 for reciprocal, a divisor and
// a fractional or negative power; broadcastable shapes for add, sub, mul and div; axes in range for
// the reductions, concat, slice and permute; valid indices for embedding and cross-entropy; a fixed
// keep-mask (or a generator seeded in the graph) for dropout. Values are shared and reused (x·x,
// a + a, one value feeding several ops). Each value carries an interval holding it (computed by
// interval arithmetic from the leaves' domains), which is what the constraints are checked on and
// what keeps every value within ±10 (so the checker's derivation, |J'''| ≤ 1e3, holds). Kinks (abs,
// relu, clamp at a bound, max at a tie) are avoided: the generator looks at the input's values and
// refuses one within 1e-6 of a kink (see kink_distance). Should the checker still classify a
// coordinate as at a kink (check/report.hpp), that graph gets no second-order check (those checks
// assume smooth points). Every value no later step uses is an output: Y is that value, or the outputs flattened
// and concatenated, and J = probe(Y) = Σ Y ∘ G.
//
// Every graph goes through the full 50-digit checker; every third graph (seed ≡ 0 mod 3) without a
// kink also through the JVP check on Y and the HVP check on J (check/second_order.hpp, default
// options: the same 50-digit thresholds as tests/test_second_order.cpp). The run prints how often
// each op was drawn; from 300 graphs, every public function must have been drawn and every op
// struct of LibraryOps (ops/all.hpp) recorded on those tapes (a missing one is named).
//
// CI runs 500 graphs (4.8 s for the whole file in Release on the 2-core host of 2026-12-02). More,
// or other seeds (5,000 at seed 270000: 0 failures, every op drawn at least 309 times, JVP and HVP
// on 1,667, 39 s there):
//     TAPEGRAD_RANDOM_GRAPHS=5000 TAPEGRAD_RANDOM_SEED=270000 ./build/tests/test_random_graphs --log_level=message
// A failing graph is printed as its recipe ("n5 = matmul(x0, n4) [2x3]; ...") with its seed,
// so it can be replayed alone with TAPEGRAD_RANDOM_GRAPHS=1 TAPEGRAD_RANDOM_SEED=<seed>.
// Fault control: sigmoid with a wrong VJP substituted in graphs that draw sigmoid must be rejected.
#define BOOST_TEST_MODULE random_graphs
#include "support.hpp"

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

namespace {

constexpr std::size_t leaf_count = 3;

// The ops, in the order of op_names (kept packed; clang-format would give each its own line).
// clang-format off
enum class StepOp {
    add, sub, mul, div, add_bias, neg, shift, scale, reciprocal, exp, log, sqrt, tanh, sigmoid, abs, pow, clamp,
    relu, gelu, matmul, transpose, softmax, mask, log_softmax, layer_norm, fused_attention, sum, sum_axis, mean,
    max, logsumexp, reshape, concat, slice, permute, dropout, dropout_with_mask, embedding, cross_entropy,
    split_heads, merge_heads
};
constexpr std::array op_names = {
    "add", "sub", "mul", "div", "add_bias", "neg", "shift", "scale", "reciprocal", "exp", "log", "sqrt", "tanh",
    "sigmoid", "abs", "pow", "clamp", "relu", "gelu", "matmul", "transpose", "softmax", "mask", "log_softmax",
    "layer_norm", "fused_attention", "sum", "sum_axis", "mean", "max", "logsumexp", "reshape", "concat", "slice",
    "permute", "dropout", "dropout_with_mask", "embedding", "cross_entropy", "split_heads", "merge_heads"};
// clang-format on

std::string_view name_of(StepOp op) { return op_names[static_cast<std::size_t>(op)]; }

// The constraints, fixed here (see the top of the file). Magnitudes within ±10 and inputs of log and
// sqrt ≥ 0.3, of 1/x ≥ 0.5 keep third derivatives of one op within 2/0.3³ ≈ 74 (log) and 6/0.5⁴ =
// 96 (1/x); a value of at most 48 elements keeps the 50-digit checker's cost per graph small.
constexpr double magnitude_cap = 10;
constexpr double root_margin = 0.3;     // log, sqrt
constexpr double divisor_margin = 0.5;  // reciprocal, div's divisor, pow with p < 0 or fractional
constexpr std::size_t element_cap = 48;
constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

// An interval holding a value's every entry.
struct Range {
    double lo = 0, hi = 0;
    double magnitude() const { return std::max(std::abs(lo), std::abs(hi)); }
};

// One step of a recipe: an op applied to earlier values (leaves are 0..leaf_count-1), with its
// settings drawn.
struct Step {
    StepOp op = StepOp::add;
    std::vector<std::size_t> in;  // operand values (layer_norm's gain and bias: `none` for a constant)
    double c = 0, d = 0;          // scale and shift constants, pow's exponent, clamp's bounds, dropout's p
    int axis = 0;
    bool flag = false;              // keepdims, causal, GELU's erf form
    std::size_t n = 0, m = 0;       // heads, query offset, slice range, embedding sequences
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

    bool uses(StepOp op) const {
        return std::any_of(steps.begin(), steps.end(), [op](const Step& s) { return s.op == op; });
    }

    std::string describe() const {
        std::string text = fmt::format("seed {}:", seed);
        for (std::size_t l = 0; l < leaf_count; ++l)
            text += fmt::format(" x{} {}{};", l, shapes[l].to_string(), leaf_positive[l] ? " in [0.5, 1.5]" : "");
        auto name = [](std::size_t v) {
            return v == none ? std::string("const") : v < leaf_count ? fmt::format("x{}", v) : fmt::format("n{}", v);
        };
        for (std::size_t s = 0; s < steps.size(); ++s) {
            const Step& step = steps[s];
            std::string args;
            for (const std::size_t v : step.in) args += (args.empty() ? "" : ", ") + name(v);
            std::string settings;
            switch (step.op) {
                case StepOp::shift:
                case StepOp::scale:
                case StepOp::pow:
                    settings = fmt::format(", {:.3}", step.c);
                    break;
                case StepOp::clamp:
                    settings = fmt::format(", {:.3}, {:.3}", step.c, step.d);
                    break;
                case StepOp::dropout:
                    settings = fmt::format(", p {}, seed {}", step.c, step.seed);
                    break;
                case StepOp::dropout_with_mask:
                    settings = fmt::format(", keep {}, p {:.3}", step.first.shape().to_string(), step.c);
                    break;
                case StepOp::gelu:
                    settings = step.flag ? ", erf" : ", tanh";
                    break;
                case StepOp::mask:
                    settings = fmt::format(", M {}", step.first.shape().to_string());
                    break;
                case StepOp::fused_attention:
                    settings = fmt::format(", causal {}, offset {}", step.flag, step.m);
                    break;
                case StepOp::sum_axis:
                case StepOp::mean:
                case StepOp::max:
                case StepOp::logsumexp:
                    settings = fmt::format(", axis {}{}", step.axis, step.flag ? ", keepdims" : "");
                    break;
                case StepOp::concat:
                    settings = fmt::format(", axis {}", step.axis);
                    break;
                case StepOp::slice:
                    settings = fmt::format(", axis {}, [{}, {})", step.axis, step.n, step.m);
                    break;
                case StepOp::permute:
                case StepOp::reshape:
                case StepOp::embedding:
                case StepOp::cross_entropy:
                    settings = fmt::format(", ({}){}", fmt::join(step.list, ", "),
                                           step.n ? fmt::format(", sequences {}", step.n) : "");
                    break;
                case StepOp::split_heads:
                    settings = fmt::format(", heads {}", step.n);
                    break;
                default:
                    break;
            }
            const bool masked = step.op == StepOp::mask;  // recorded as softmax(mask(S, M))
            text +=
                fmt::format(" {} = {}{}({}{}){} {};", name(leaf_count + s), masked ? "softmax(" : "", name_of(step.op),
                            args, settings, masked ? ")" : "", shapes[leaf_count + s].to_string());
        }
        return text + " Y = the unused values (flattened, concatenated); J = probe(Y)";
    }
};

Shape shape_of(const std::vector<std::size_t>& dims) { return Shape(std::span<const std::size_t>(dims)); }
std::vector<std::size_t> dims_of(const Shape& s) { return {s.dims().begin(), s.dims().end()}; }

// sigmoid whose VJP drops the factor (1 − Y): dA = G ∘ Y (the random graphs' fault control).
struct SigmoidWithWrongVjp : Sigmoid {
    static constexpr std::string_view name = "sigmoid with dA = G·Y";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * at.out[k];
    }
};

// The recipe as a graph over any scalar type: J = probe(Y) (or Y itself, `output_Y`), for the checks.
struct Graph {
    const Recipe* recipe;
    bool output_Y = false;
    bool broken_sigmoid = false;
    std::size_t stop_at = none;  // return this value as soon as it is computed (the generator's look at it)

    template <class Leaves>
    auto operator()(Leaves leaves) const {
        using V = typename Leaves::value_type;
        using T = typename V::scalar_type;
        std::vector<V> values(leaves.begin(), leaves.end());
        values.reserve(leaf_count + recipe->steps.size());
        if (stop_at < values.size()) return values[stop_at];
        Tape<T>& tape = leaves[0].tape();
        const auto constant = [&tape](const Tensor<double>& t) { return tape.constant(tensor_cast<T>(t)); };
        for (const Step& s : recipe->steps) {
            const V& a = values[s.in[0]];
            const auto operand = [&](std::size_t i) { return values[s.in[i]]; };
            switch (s.op) {
                case StepOp::add:
                    values.push_back(add(a, operand(1)));
                    break;
                case StepOp::sub:
                    values.push_back(sub(a, operand(1)));
                    break;
                case StepOp::mul:
                    values.push_back(mul(a, operand(1)));
                    break;
                case StepOp::div:
                    values.push_back(div(a, operand(1)));
                    break;
                case StepOp::add_bias:
                    values.push_back(add_bias(a, s.in[1] == none ? constant(s.first) : operand(1)));
                    break;
                case StepOp::layer_norm:
                    values.push_back(layer_norm(a, s.in[1] == none ? constant(s.first) : operand(1),
                                                s.in[2] == none ? constant(s.second) : operand(2)));
                    break;
                case StepOp::neg:
                    values.push_back(neg(a));
                    break;
                case StepOp::shift:
                    values.push_back(shift(a, T(s.c)));
                    break;
                case StepOp::scale:
                    values.push_back(scale(a, T(s.c)));
                    break;
                case StepOp::reciprocal:
                    values.push_back(reciprocal(a));
                    break;
                case StepOp::exp:
                    values.push_back(exp(a));
                    break;
                case StepOp::log:
                    values.push_back(log(a));
                    break;
                case StepOp::sqrt:
                    values.push_back(sqrt(a));
                    break;
                case StepOp::tanh:
                    values.push_back(tanh(a));
                    break;
                case StepOp::sigmoid:
                    values.push_back(broken_sigmoid ? tape.template record<SigmoidWithWrongVjp>({a}) : sigmoid(a));
                    break;
                case StepOp::abs:
                    values.push_back(abs(a));
                    break;
                case StepOp::pow:
                    values.push_back(pow(a, T(s.c)));
                    break;
                case StepOp::clamp:
                    values.push_back(clamp(a, T(s.c), T(s.d)));
                    break;
                case StepOp::relu:
                    values.push_back(relu(a));
                    break;
                case StepOp::gelu:
                    values.push_back(gelu(a, s.flag ? GeluForm::erf : GeluForm::tanh));
                    break;
                case StepOp::matmul:
                    values.push_back(matmul(a, operand(1)));
                    break;
                case StepOp::transpose:
                    values.push_back(transpose(a));
                    break;
                case StepOp::softmax:
                    values.push_back(softmax(a));
                    break;
                case StepOp::mask:
                    values.push_back(softmax(mask(a, constant(s.first))));
                    break;
                case StepOp::log_softmax:
                    values.push_back(log_softmax(a));
                    break;
                case StepOp::fused_attention:
                    values.push_back(fused_attention(a, operand(1), operand(2), s.flag, s.m));
                    break;
                case StepOp::sum:
                    values.push_back(sum(a));
                    break;
                case StepOp::sum_axis:
                    values.push_back(sum(a, s.axis, s.flag));
                    break;
                case StepOp::mean:
                    values.push_back(mean(a, s.axis, s.flag));
                    break;
                case StepOp::max:
                    values.push_back(max(a, s.axis, s.flag));
                    break;
                case StepOp::logsumexp:
                    values.push_back(logsumexp(a, s.axis, s.flag));
                    break;
                case StepOp::reshape:
                    values.push_back(reshape(a, shape_of(s.list)));
                    break;
                case StepOp::concat: {
                    std::vector<V> parts;
                    for (const std::size_t v : s.in) parts.push_back(values[v]);
                    values.push_back(concat(parts, s.axis));
                    break;
                }
                case StepOp::slice:
                    values.push_back(slice(a, s.axis, s.n, s.m));
                    break;
                case StepOp::permute:
                    values.push_back(permute(a, std::span<const std::size_t>(s.list)));
                    break;
                case StepOp::dropout: {
                    std::mt19937_64 generator(s.seed);  // the same mask on every tape
                    values.push_back(dropout(a, s.c, generator));
                    break;
                }
                case StepOp::dropout_with_mask:
                    values.push_back(dropout_with_mask(a, constant(s.first), s.c));
                    break;
                case StepOp::embedding:
                    values.push_back(s.n ? embedding(a, std::span<const std::size_t>(s.list), s.n)
                                         : embedding(a, std::span<const std::size_t>(s.list)));
                    break;
                case StepOp::cross_entropy:
                    values.push_back(cross_entropy(a, std::span<const std::size_t>(s.list)));
                    break;
                case StepOp::split_heads:
                    values.push_back(split_heads(a, s.n));
                    break;
                case StepOp::merge_heads:
                    values.push_back(merge_heads(a));
                    break;
            }
            if (stop_at < values.size()) return values[stop_at];
        }
        const std::vector<std::size_t> outputs = recipe->outputs();
        V Y = values[outputs.front()];
        if (outputs.size() > 1) {
            std::vector<V> flat;
            for (const std::size_t v : outputs) flat.push_back(reshape(values[v], Shape{values[v].shape().size()}));
            Y = concat(flat, 0);
        }
        return output_Y ? Y : testing::probe(Y);
    }
};

// The leaves of a recipe, drawn from its seed: [−1, 1], or [0.5, 1.5] for a positive leaf.
std::array<NamedTensor, leaf_count> leaves_of(const Recipe& recipe) {
    std::mt19937_64 rng(recipe.seed);
    std::array<NamedTensor, leaf_count> leaves;
    for (std::size_t l = 0; l < leaf_count; ++l) {
        Tensor<double> t = testing::random_tensor(recipe.leaf_shapes[l], rng, recipe.leaf_positive[l] ? 0.5 : 1.0);
        if (recipe.leaf_positive[l])
            for (double& x : t.data()) x += 1.0;
        leaves[l] = {fmt::format("x{}", l), std::move(t)};
    }
    return leaves;
}

// Kinks: an input of abs, relu or clamp must be at least `kink_distance` from each kink, and the
// largest entry of each lane of max ahead of the second by as much. Even an input that sits at a
// kink only because an identity holds (relu(x − x)) is refused: the checker's branch stage moves
// one consumer's copy of a leaf alone, which breaks the identity, and there the function can be C¹
// but not C² (relu(h)²), which central differences see as an O(h) error and the kink test (a jump
// in the first derivative) does not classify. 1e-6 is eight decades above the steps.
constexpr double kink_distance = 1e-6;

bool away_from(const Tensor<double>& x, std::initializer_list<double> kinks) {
    for (const double v : x.data())
        for (const double k : kinks)
            if (std::abs(v - k) < kink_distance) return false;
    return true;
}

bool untied(const Tensor<double>& x, std::size_t axis) {
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

// Draws a recipe: 2 to 8 steps. Each step draws an op uniformly, then its first operand among the
// values the op accepts (the latest such value with probability 2/3, so graphs grow deep, else any,
// so they grow wide), then its partners and settings; an op with no valid operand, or whose result
// would leave the caps, is drawn again. `forced`: the last step is this op when it can be applied.
Recipe draw(std::uint64_t seed, std::optional<StepOp> forced = std::nullopt) {
    std::mt19937_64 rng(seed);
    auto uniform = [&](std::size_t lo, std::size_t hi) {
        return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
    };
    auto real = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
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
    // A value as the graph computes it in double, for the one constraint intervals cannot give.
    const std::array<NamedTensor, leaf_count> leaf_values = leaves_of(r);
    const auto value_now = [&](std::size_t v) {
        Tape<double> tape;
        std::array<Var<double>, leaf_count> vars;
        for (std::size_t l = 0; l < leaf_count; ++l) vars[l] = tape.leaf(leaf_values[l].value, leaf_values[l].name);
        return Graph{&r, false, false, v}(vars).value();
    };
    const auto pick = [&](const std::vector<std::size_t>& candidates) {
        if (candidates.empty()) return none;
        return uniform(0, 2) != 0 ? candidates.back() : candidates[uniform(0, candidates.size() - 1)];
    };
    const auto values_where = [&](auto accepts) {
        std::vector<std::size_t> found;
        for (std::size_t v = 0; v < r.shapes.size(); ++v)
            if (accepts(r.shapes[v], r.ranges[v])) found.push_back(v);
        return found;
    };
    const auto keep_mask = [&](const Shape& shape, double p) {
        Tensor<double> keep(shape);
        for (double& k : keep.data()) k = real(0, 1) >= p ? 1.0 : 0.0;
        return keep;
    };

    // Tries to append `op`; false (nothing appended) when it cannot be applied here.
    const auto try_step = [&](StepOp op) -> bool {
        Step step;
        step.op = op;
        Shape out;
        Range range;
        const auto rank_at_least = [](std::size_t k) {
            return [k](const Shape& s, const Range&) { return s.rank() >= k; };
        };
        const auto any = [](const Shape&, const Range&) { return true; };
        const auto unary = [&](auto accepts) {
            const std::size_t a = pick(values_where(accepts));
            if (a == none) return none;
            step.in = {a};
            out = r.shapes[a];
            return a;
        };
        switch (op) {
            case StepOp::add:
            case StepOp::sub:
            case StepOp::mul:
            case StepOp::div: {
                const std::size_t a = pick(values_where(any));
                std::vector<std::size_t> partners;
                for (std::size_t v = 0; v < r.shapes.size(); ++v) {
                    if (!try_broadcast_shape(r.shapes[a], r.shapes[v])) continue;
                    if (op == StepOp::div && r.ranges[v].lo < divisor_margin) continue;
                    partners.push_back(v);
                }
                const std::size_t b = pick(partners);
                if (b == none) return false;
                step.in = {a, b};
                out = *try_broadcast_shape(r.shapes[a], r.shapes[b]);
                const Range& x = r.ranges[a];
                const Range& y = op == StepOp::div ? Range{1 / r.ranges[b].hi, 1 / r.ranges[b].lo} : r.ranges[b];
                if (op == StepOp::add)
                    range = {x.lo + y.lo, x.hi + y.hi};
                else if (op == StepOp::sub)
                    range = {x.lo - y.hi, x.hi - y.lo};
                else {
                    const std::array p{x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi};
                    range = {*std::min_element(p.begin(), p.end()), *std::max_element(p.begin(), p.end())};
                }
                break;
            }
            case StepOp::add_bias:
            case StepOp::layer_norm: {
                const std::size_t a = unary(rank_at_least(op == StepOp::add_bias ? 2 : 1));
                if (a == none) return false;
                const std::size_t D = r.shapes[a].cols();
                const auto vectors = values_where([D](const Shape& s, const Range&) { return s == Shape{D}; });
                // A partner [D] when one exists, else a constant drawn here.
                const auto partner_or_constant = [&](Tensor<double>& constant, double lo, double hi) {
                    const std::size_t v =
                        vectors.empty() || uniform(0, 3) == 0 ? none : vectors[uniform(0, vectors.size() - 1)];
                    if (v == none) {
                        constant = Tensor<double>(Shape{D});
                        for (double& x : constant.data()) x = real(lo, hi);
                    }
                    step.in.push_back(v);
                    return v == none ? Range{lo, hi} : r.ranges[v];
                };
                if (op == StepOp::add_bias) {
                    const Range b = partner_or_constant(step.first, -1, 1);
                    range = {r.ranges[a].lo + b.lo, r.ranges[a].hi + b.hi};
                } else {
                    // Rows of width D ≥ 2 must be spread (standard deviation ≥ 0.1): the normaliser
                    // 1/σ makes the k-th derivative grow as σ^−k, and near σ = 0 (up to ε = 1e-5)
                    // the third derivative would pass the 1e3 the checker's steps are derived for.
                    if (D >= 2) {
                        const Tensor<double> X = value_now(a);
                        for (std::size_t row = 0; row < X.size() / D; ++row) {
                            double mean = 0, squares = 0;
                            for (std::size_t j = 0; j < D; ++j) mean += X[row * D + j] / static_cast<double>(D);
                            for (std::size_t j = 0; j < D; ++j)
                                squares += (X[row * D + j] - mean) * (X[row * D + j] - mean);
                            if (std::sqrt(squares / static_cast<double>(D)) < 0.1) return false;
                        }
                    }
                    // Each normalised entry is at most √D in magnitude.
                    const Range g = partner_or_constant(step.first, 0.5, 1.5),
                                b = partner_or_constant(step.second, -1, 1);
                    const double spread = g.magnitude() * std::sqrt(static_cast<double>(D));
                    range = {b.lo - spread, b.hi + spread};
                }
                break;
            }
            case StepOp::neg: {
                const std::size_t a = unary(any);
                range = {-r.ranges[a].hi, -r.ranges[a].lo};
                break;
            }
            case StepOp::shift: {
                const std::size_t a = unary(any);
                step.c = real(-1, 1);
                range = {r.ranges[a].lo + step.c, r.ranges[a].hi + step.c};
                break;
            }
            case StepOp::scale: {
                const std::size_t a = unary(any);
                step.c = real(-2, 2);
                range = {std::min(r.ranges[a].lo * step.c, r.ranges[a].hi * step.c),
                         std::max(r.ranges[a].lo * step.c, r.ranges[a].hi * step.c)};
                break;
            }
            case StepOp::reciprocal:
            case StepOp::log:
            case StepOp::sqrt: {
                const double margin = op == StepOp::reciprocal ? divisor_margin : root_margin;
                const std::size_t a = unary([margin](const Shape&, const Range& x) { return x.lo >= margin; });
                if (a == none) return false;
                const Range& x = r.ranges[a];
                if (op == StepOp::reciprocal)
                    range = {1 / x.hi, 1 / x.lo};
                else if (op == StepOp::log)
                    range = {std::log(x.lo), std::log(x.hi)};
                else
                    range = {std::sqrt(x.lo), std::sqrt(x.hi)};
                break;
            }
            case StepOp::exp: {
                const std::size_t a = unary(any);
                range = {std::exp(r.ranges[a].lo), std::exp(r.ranges[a].hi)};
                break;
            }
            case StepOp::tanh:
            case StepOp::sigmoid: {
                const std::size_t a = unary(any);
                const auto f = [op](double x) { return op == StepOp::tanh ? std::tanh(x) : 1 / (1 + std::exp(-x)); };
                range = {f(r.ranges[a].lo), f(r.ranges[a].hi)};
                break;
            }
            case StepOp::abs:
            case StepOp::relu:
            case StepOp::gelu: {
                const std::size_t a = unary(any);
                const Range& x = r.ranges[a];
                if (op == StepOp::abs)
                    range = {x.lo >= 0 ? x.lo : x.hi <= 0 ? -x.hi : 0.0, x.magnitude()};
                else if (op == StepOp::relu)
                    range = {std::max(x.lo, 0.0), std::max(x.hi, 0.0)};
                else
                    range = {-0.2, std::max(x.hi, 0.0)};  // GELU(x) ≥ −0.17 everywhere, ≤ max(x, 0)
                step.flag = op == StepOp::gelu && uniform(0, 1) == 1;
                if (op != StepOp::gelu && !away_from(value_now(a), {0.0})) return false;
                break;
            }
            case StepOp::pow: {
                const std::size_t a = unary(any);
                const Range& x = r.ranges[a];
                // Integer powers for any sign; fractional and negative ones for inputs ≥ divisor_margin.
                static constexpr std::array integer{2.0, 3.0};
                static constexpr std::array positive_only{-1.0, -0.5, 0.5, 1.5, 2.5};
                step.c = x.lo >= divisor_margin && uniform(0, 1) == 1
                             ? positive_only[uniform(0, positive_only.size() - 1)]
                             : integer[uniform(0, integer.size() - 1)];
                const double p = step.c;
                if (x.lo >= 0)
                    range = {std::min(std::pow(x.lo, p), std::pow(x.hi, p)),
                             std::max(std::pow(x.lo, p), std::pow(x.hi, p))};
                else if (p == 2)
                    range = {x.hi <= 0 ? x.hi * x.hi : 0.0, x.magnitude() * x.magnitude()};
                else
                    range = {std::pow(x.lo, 3), std::pow(x.hi, 3)};
                break;
            }
            case StepOp::clamp: {
                const std::size_t a = unary(any);
                step.c = real(-1, 0.5);
                step.d = step.c + real(0.25, 1.5);
                range = {std::clamp(r.ranges[a].lo, step.c, step.d), std::clamp(r.ranges[a].hi, step.c, step.d)};
                if (!away_from(value_now(a), {step.c, step.d})) return false;
                break;
            }
            case StepOp::matmul: {
                const std::size_t a = unary(rank_at_least(2));
                if (a == none) return false;
                const Shape& A = r.shapes[a];
                const auto partners = values_where([&A](const Shape& B, const Range&) {
                    return B.rank() >= 2 && B.rows() == A.cols() &&
                           (B.rank() == 2 || (B.rank() == A.rank() && A.same_batch(B)));
                });
                const std::size_t b = pick(partners);
                if (b == none) return false;
                step.in.push_back(b);
                out = A.with_matrix(A.rows(), r.shapes[b].cols());
                const double bound = static_cast<double>(A.cols()) * r.ranges[a].magnitude() * r.ranges[b].magnitude();
                range = {-bound, bound};
                break;
            }
            case StepOp::transpose: {
                const std::size_t a = unary(rank_at_least(2));
                if (a == none) return false;
                out = r.shapes[a].with_matrix(r.shapes[a].cols(), r.shapes[a].rows());
                range = r.ranges[a];
                break;
            }
            case StepOp::softmax: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                const Range& x = r.ranges[a];
                range = {std::exp(x.lo - x.hi) / static_cast<double>(r.shapes[a].cols()), 1};
                break;
            }
            case StepOp::mask: {
                const std::size_t a = unary(rank_at_least(2));
                if (a == none) return false;
                const Shape& S = r.shapes[a];
                // One mask for the batch, or one per matrix; some rows may be hidden entirely.
                step.first = Tensor<double>(S.rank() > 2 && uniform(0, 1) == 1 ? Shape{S.rows(), S.cols()} : S);
                for (double& v : step.first.data()) v = uniform(0, 3) == 0 ? 0.0 : 1.0;
                range = {0, 1};
                break;
            }
            case StepOp::log_softmax: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                const Range& x = r.ranges[a];
                range = {x.lo - x.hi - std::log(static_cast<double>(r.shapes[a].cols())), 0};
                break;
            }
            case StepOp::fused_attention: {
                const std::size_t q = unary([](const Shape& s, const Range&) { return s.rank() >= 2; });
                if (q == none) return false;
                const Shape& Q = r.shapes[q];
                const auto same_batch = [&Q](const Shape& s) { return s.rank() == Q.rank() && Q.same_batch(s); };
                const std::size_t k = pick(
                    values_where([&](const Shape& s, const Range&) { return same_batch(s) && s.cols() == Q.cols(); }));
                const Shape& K = r.shapes[k];
                const std::size_t v = pick(
                    values_where([&](const Shape& s, const Range&) { return same_batch(s) && s.rows() == K.rows(); }));
                step.in = {q, k, v};
                step.flag = uniform(0, 1) == 1;
                step.m = step.flag ? uniform(0, 2) : 0;
                out = Q.with_matrix(Q.rows(), r.shapes[v].cols());
                range = r.ranges[v];  // each output row is a convex combination of V's rows
                break;
            }
            case StepOp::sum: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                out = Shape{};
                const double n = static_cast<double>(r.shapes[a].size());
                range = {n * r.ranges[a].lo, n * r.ranges[a].hi};
                break;
            }
            case StepOp::sum_axis:
            case StepOp::mean:
            case StepOp::max:
            case StepOp::logsumexp: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                const std::size_t rank = r.shapes[a].rank();
                const std::size_t axis = uniform(0, rank - 1);
                step.axis = static_cast<int>(axis) - (uniform(0, 1) == 1 ? static_cast<int>(rank) : 0);
                step.flag = uniform(0, 1) == 1;
                std::vector<std::size_t> dims = dims_of(r.shapes[a]);
                const double n = static_cast<double>(dims[axis]);
                if (step.flag)
                    dims[axis] = 1;
                else
                    dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(axis));
                out = shape_of(dims);
                const Range& x = r.ranges[a];
                if (op == StepOp::sum_axis)
                    range = {n * x.lo, n * x.hi};
                else if (op == StepOp::logsumexp)
                    range = {x.lo, x.hi + std::log(n)};
                else
                    range = x;
                if (op == StepOp::max && !untied(value_now(a), axis)) return false;
                break;
            }
            case StepOp::reshape: {
                const std::size_t a = unary(any);
                std::size_t remaining = r.shapes[a].size();
                const std::size_t rank = uniform(1, 4);
                for (std::size_t i = 0; i + 1 < rank; ++i) {
                    std::vector<std::size_t> divisors;
                    for (std::size_t d = 1; d <= remaining; ++d)
                        if (remaining % d == 0) divisors.push_back(d);
                    step.list.push_back(divisors[uniform(0, divisors.size() - 1)]);
                    remaining /= step.list.back();
                }
                step.list.push_back(remaining);
                out = shape_of(step.list);
                range = r.ranges[a];
                break;
            }
            case StepOp::concat: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                const Shape& A = r.shapes[a];
                const std::size_t axis = uniform(0, A.rank() - 1);
                const auto partners = values_where([&](const Shape& s, const Range&) {
                    if (s.rank() != A.rank()) return false;
                    for (std::size_t i = 0; i < s.rank(); ++i)
                        if (i != axis && s[i] != A[i]) return false;
                    return true;
                });
                std::vector<std::size_t> dims = dims_of(A);
                range = r.ranges[a];
                for (std::size_t more = uniform(1, 2); more > 0; --more) {
                    const std::size_t b = partners[uniform(0, partners.size() - 1)];
                    step.in.push_back(b);
                    dims[axis] += r.shapes[b][axis];
                    range = {std::min(range.lo, r.ranges[b].lo), std::max(range.hi, r.ranges[b].hi)};
                }
                step.axis = static_cast<int>(axis) - (uniform(0, 1) == 1 ? static_cast<int>(A.rank()) : 0);
                out = shape_of(dims);
                break;
            }
            case StepOp::slice: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                const std::size_t rank = r.shapes[a].rank(), axis = uniform(0, rank - 1), dim = r.shapes[a][axis];
                step.n = uniform(0, dim - 1);
                step.m = uniform(step.n + 1, dim);
                step.axis = static_cast<int>(axis) - (uniform(0, 1) == 1 ? static_cast<int>(rank) : 0);
                std::vector<std::size_t> dims = dims_of(r.shapes[a]);
                dims[axis] = step.m - step.n;
                out = shape_of(dims);
                range = r.ranges[a];
                break;
            }
            case StepOp::permute: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                step.list.resize(r.shapes[a].rank());
                std::iota(step.list.begin(), step.list.end(), std::size_t{0});
                std::shuffle(step.list.begin(), step.list.end(), rng);
                std::vector<std::size_t> dims;
                for (const std::size_t axis : step.list) dims.push_back(r.shapes[a][axis]);
                out = shape_of(dims);
                range = r.ranges[a];
                break;
            }
            case StepOp::dropout:
            case StepOp::dropout_with_mask: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                static constexpr std::array probabilities{0.0, 0.2, 0.5};
                step.c = probabilities[uniform(0, probabilities.size() - 1)];
                if (op == StepOp::dropout)
                    step.seed = rng();
                else
                    step.first = keep_mask(r.shapes[a], step.c);
                const double f = 1 / (1 - step.c);
                range = {std::min(0.0, r.ranges[a].lo * f), std::max(0.0, r.ranges[a].hi * f)};
                break;
            }
            case StepOp::embedding: {
                const std::size_t a = unary(rank_at_least(2));
                if (a == none) return false;
                const std::size_t D = r.shapes[a].cols(), rows = r.shapes[a].size() / D, n = uniform(1, 4);
                for (std::size_t i = 0; i < n; ++i) step.list.push_back(uniform(0, rows - 1));
                step.n = n % 2 == 0 && uniform(0, 1) == 1 ? 2 : 0;  // as two sequences
                out = step.n ? Shape{2, n / 2, D} : Shape{n, D};
                range = r.ranges[a];
                break;
            }
            case StepOp::cross_entropy: {
                const std::size_t a = unary(rank_at_least(1));
                if (a == none) return false;
                const std::size_t V = r.shapes[a].cols(), rows = r.shapes[a].size() / V;
                for (std::size_t i = 0; i < rows; ++i) step.list.push_back(uniform(0, V - 1));
                out = Shape{};
                range = {0, r.ranges[a].hi - r.ranges[a].lo + std::log(static_cast<double>(V))};
                break;
            }
            case StepOp::split_heads: {
                const std::size_t a =
                    unary([](const Shape& s, const Range&) { return s.rank() == 2 || s.rank() == 3; });
                if (a == none) return false;
                const Shape& X = r.shapes[a];
                std::vector<std::size_t> divisors;
                for (std::size_t h = 1; h <= X.cols(); ++h)
                    if (X.cols() % h == 0) divisors.push_back(h);
                step.n = divisors[uniform(0, divisors.size() - 1)];
                std::vector<std::size_t> dims(X.dims().begin(), X.dims().end() - 2);
                for (const std::size_t d : {step.n, X.rows(), X.cols() / step.n}) dims.push_back(d);
                out = shape_of(dims);
                range = r.ranges[a];
                break;
            }
            case StepOp::merge_heads: {
                const std::size_t a =
                    unary([](const Shape& s, const Range&) { return s.rank() == 3 || s.rank() == 4; });
                if (a == none) return false;
                const Shape& X = r.shapes[a];
                std::vector<std::size_t> dims(X.dims().begin(), X.dims().end() - 3);
                dims.push_back(X.rows());
                dims.push_back(X[X.rank() - 3] * X.cols());
                out = shape_of(dims);
                range = r.ranges[a];
                break;
            }
        }
        if (step.in.empty() || step.in[0] == none) return false;
        if (out.size() > element_cap || !(range.magnitude() <= magnitude_cap)) return false;
        r.steps.push_back(std::move(step));
        r.shapes.push_back(out);
        r.ranges.push_back(range);
        return true;
    };

    const std::size_t steps = uniform(2, 8);
    while (r.steps.size() < steps) {
        if (forced && r.steps.size() + 1 == steps && try_step(*forced)) break;
        try_step(static_cast<StepOp>(uniform(0, op_names.size() - 1)));
    }
    return r;
}

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// The first-order check of a recipe's graph, the leaves as a C array (the checker's signature).
CheckReport check_first_order(const Recipe& recipe, const std::array<NamedTensor, leaf_count>& l, bool broken = false) {
    const NamedTensor leaves[] = {l[0], l[1], l[2]};
    return check_gradients(Graph{&recipe, false, broken}, leaves);
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_graphs_pass_the_50_digit_checker) {
    const std::uint64_t count = env_or("TAPEGRAD_RANDOM_GRAPHS", 500);
    const std::uint64_t first_seed = env_or("TAPEGRAD_RANDOM_SEED", 1000);
    tapegrad::set_threads(1);  // the graphs are tiny; threads would cost more than they save
    const auto start = std::chrono::steady_clock::now();
    std::map<std::string_view, std::size_t> op_uses;
    for (const std::string_view name : op_names) op_uses[name] = 0;
    std::set<std::string> recorded;  // the op structs the recorded tapes hold: LibraryOps' coverage
    std::size_t shared = 0, failed = 0, coordinates = 0, with_kinks = 0, second_order = 0, steps = 0;
    double worst_mp = 0, worst_double = 0, worst_jvp = 0, worst_hvp = 0;
    for (std::uint64_t g = 0; g < count; ++g) {
        const Recipe recipe = draw(first_seed + g);
        steps += recipe.steps.size();
        for (const Step& step : recipe.steps) ++op_uses[name_of(step.op)];
        std::vector<std::size_t> uses(recipe.shapes.size());
        for (const Step& step : recipe.steps)
            for (const std::size_t v : step.in)
                if (v != none) ++uses[v];
        if (std::any_of(uses.begin(), uses.end(), [](std::size_t u) { return u > 1; })) ++shared;

        const std::array<NamedTensor, leaf_count> l = leaves_of(recipe);
        const NamedTensor leaves[] = {l[0], l[1], l[2]};
        CheckReport report;
        try {
            report = check_gradients(Graph{&recipe}, leaves);
        } catch (const std::exception& e) {  // the generator built a graph an op refuses: its bug
            ++failed;
            BOOST_ERROR(recipe.describe() << "\nrefused: " << e.what());
            continue;
        }
        coordinates += report.coordinates;
        worst_mp = std::max(worst_mp, report.max_error_mp);
        worst_double = std::max(worst_double, report.max_error_double);
        if (report.kinks > 0) ++with_kinks;
        bool passed = report.passed;
        std::string summaries = report.summary();
        if (recipe.seed % 3 == 0 && report.kinks == 0) {
            ++second_order;
            // Recorded once on a Tape<double> and checked as recorded (check/recorded.hpp: the
            // re-runs at 50 digits and in the duals go through the ops' siblings in the library),
            // so the recipe's interpreter is compiled at double and 50 digits only.
            Tape<double> tape;
            std::array<Var<double>, leaf_count> vars;
            for (std::size_t i = 0; i < leaf_count; ++i) vars[i] = tape.leaf(leaves[i].value, leaves[i].name);
            const Var<double> Y = Graph{&recipe, true}(vars);
            for (std::uint32_t i = 0; i <= Y.index(); ++i) recorded.emplace(tape.info(i).op);
            const Var<double> J = testing::probe(Y);
            const SecondOrderReport jvp = check_jvp(tape, Y);
            const SecondOrderReport hvp = check_hvp(tape, J);
            worst_jvp = std::max(worst_jvp, jvp.max_error_mp);
            worst_hvp = std::max(worst_hvp, hvp.max_error_mp);
            passed = passed && jvp.passed && hvp.passed;
            summaries += "\n" + jvp.summary() + "\n" + hvp.summary();
        }
        if (!passed) {
            ++failed;
            BOOST_ERROR(recipe.describe() << "\n" << summaries);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string ops;
    std::size_t fewest = std::numeric_limits<std::size_t>::max();
    for (const auto& [name, n] : op_uses) {
        ops += fmt::format(" {} {},", name, n);
        fewest = std::min(fewest, n);
    }
    BOOST_TEST_MESSAGE(fmt::format(
        "{} random graphs (seeds {}..{}) in {:.1f} s, {} steps, {} with a value used more than once, {} with a "
        "coordinate at a kink; {} failed; {} derivatives; worst error 50-digit {:.3g}, double {:.3g}; JVP and HVP "
        "on {} graphs ({:.1f}%), worst 50-digit JVP {:.3g}, HVP {:.3g}; each op drawn at least {} times; ops:{}",
        count, first_seed, first_seed + count - 1, seconds, steps, shared, with_kinks, failed, coordinates, worst_mp,
        worst_double, second_order, 100.0 * static_cast<double>(second_order) / static_cast<double>(count), worst_jvp,
        worst_hvp, fewest, ops));
    BOOST_TEST(failed == 0u);
    // The generator must actually produce shared values, every op and second-order checks, or the
    // test proves little.
    if (count >= 300) {
        BOOST_TEST(shared >= count / 4);
        BOOST_TEST(fewest >= 1u, "an op was never drawn:" << ops);
        const std::string missing = testing::missing_names(testing::library_op_names(), recorded);
        BOOST_TEST(missing.empty(), "op structs of LibraryOps (ops/all.hpp) that no recorded random graph holds: " << missing);
        BOOST_TEST(5 * second_order >= count);
    }
}

// The leaves' gradients of a recipe's J on a double tape (with the wrong sigmoid VJP, `broken`).
std::vector<Tensor<double>> gradients_of(const Recipe& recipe, const std::array<NamedTensor, leaf_count>& leaves,
                                         bool broken) {
    Tape<double> tape;
    std::array<Var<double>, leaf_count> vars;
    for (std::size_t l = 0; l < leaf_count; ++l) vars[l] = tape.leaf(leaves[l].value, leaves[l].name);
    tape.backward(Graph{&recipe, false, broken}(vars));
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
        const Recipe recipe = draw(seed, StepOp::sigmoid);
        if (!recipe.uses(StepOp::sigmoid)) continue;
        ++graphs;
        const std::array<NamedTensor, leaf_count> leaves = leaves_of(recipe);
        const bool changes = gradients_of(recipe, leaves, false) != gradients_of(recipe, leaves, true);
        const CheckReport correct = check_first_order(recipe, leaves);
        const CheckReport broken = check_first_order(recipe, leaves, true);
        BOOST_TEST(correct.passed, recipe.describe() << "\n" << correct.summary());
        if (changes) {
            ++observable;
            BOOST_TEST(!broken.passed, "the wrong sigmoid VJP passed in " << recipe.describe() << "\n"
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
        std::array<Var<double>, leaf_count> vars;
        for (std::size_t i = 0; i < leaf_count; ++i) vars[i] = tape.leaf(leaves[i].value, leaves[i].name);
        const Var<double> J = Graph{&recipe}(vars);
        BOOST_TEST_CONTEXT(recipe.describe()) {
            testing::expect_same_report(check_gradients(tape, J), check_gradients(Graph{&recipe}, leaves));
        }
    }
}
