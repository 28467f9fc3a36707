// Tests of ops/fused_attention.hpp: the fused op is held to the composed graph's values, gradients
// and tests. The 50-digit checker on the op itself (one line per case, as in test_ops.cpp), values
// and gradients against the composed graph, the spec's Examples 1 and 2 and its other checks that
// apply, fault controls (test-only variants of the op: a backward without the D term, one with a
// wrong log-sum-exp; both must be rejected), the accuracy rule (fused error ≤ 2 × composed error
// against a 50-digit reference), bad input, thread-count independence, gradients requested in part,
// and the models switching to the fused kernel (the multi-head model, and the retrieval training
// of examples/train_retrieval.cpp).
#define BOOST_TEST_MODULE fused_attention
#include "support.hpp"

#include "models/multihead.hpp"
#include "models/retrieval.hpp"
#include "ops/fused_attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <span>
#include <string>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::random_tensor;

namespace {

template <class V>
using scalar_of = typename std::decay_t<V>::scalar_type;

// The composed reference (models/attention.hpp): softmax(mask(scale(matmul(Q, Kᵀ), 1/√d) [+ B], M))·V,
// every intermediate kept, with models/masks.hpp's causal_mask (and its window) and alibi_bias B.
// The fused op also accepts a causal block whose first query already sees the last key
// (query_offset + 1 >= Tk), which causal_mask refuses when the block runs past the keys: there
// every key is visible to every query, which is attention without a mask.
template <Scalar T>
Var<T> composed_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, bool causal, std::size_t offset,
                          std::size_t window = 0, std::size_t alibi_heads = 0) {
    const std::size_t Tq = Q.shape().rows(), Tk = K.shape().rows();
    const bool everything_visible = !causal || (window == 0 && offset + 1 >= Tk);
    if (everything_visible && alibi_heads == 0) return attention_from_qkv(Q, K, V).O;
    if (alibi_heads == 0 && window == 0) return causal_attention(Q, K, V, offset).O;
    const Tensor<double> M = everything_visible ? Tensor<double>(Shape{Tq, Tk}, 1.0) : causal_mask(Tq, Tk, offset, window);
    const Tensor<double> bias = alibi_heads != 0 ? alibi_bias(alibi_heads, Tq, Tk, offset) : Tensor<double>(Shape{Tq, Tk}, 0.0);
    return masked_attention(Q, K, V, M, std::nullopt, &bias).O;
}

// Mixed error |a − b| / max(1, |b|), the checker's measure, as a maximum over two tensors.
template <Scalar T>
double max_mixed_error(const Tensor<T>& a, const Tensor<T>& b) {
    BOOST_REQUIRE(a.shape() == b.shape());
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
        using std::abs;
        const T scale = std::max(T(1), T(abs(b[k])));
        worst = std::max(worst, to_double(T(abs(T(a[k] - b[k])) / scale)));
    }
    return worst;
}

// One case of the op table: shapes, causality, offset, tiles, a sliding window, ALiBi's heads.
struct FusedCase {
    std::string name;
    Shape q, k, v;
    bool causal;
    std::size_t offset;
    FusedAttentionTiles tiles;
    std::size_t window = 0, alibi_heads = 0;

    FusedAttention::Settings settings() const { return {{causal, offset, window, alibi_heads}, tiles}; }
};

// Tiny tiles (2, 3) drive the online softmax across several key tiles (rescaled accumulators)
// and the causal tile skipping at sizes the full 50-digit check can afford.
const std::vector<FusedCase> fused_table = {
    {"T=1", Shape{1, 1}, Shape{1, 1}, Shape{1, 1}, false, 0, {}},
    {"d != r, Tq != Tk", Shape{3, 2}, Shape{4, 2}, Shape{4, 3}, false, 0, {}},
    {"batched, tiles 2x3", Shape{2, 5, 3}, Shape{2, 7, 3}, Shape{2, 7, 2}, false, 0, {2, 3}},
    {"batch x heads, causal, tiles 2x2", Shape{2, 2, 4, 3}, Shape{2, 2, 4, 3}, Shape{2, 2, 4, 2}, true, 0, {2, 2}},
    {"causal, query_offset 3 (key-value cache)", Shape{3, 2}, Shape{6, 2}, Shape{6, 3}, true, 3, {2, 2}},
    {"causal, offset 0, keys never seen", Shape{3, 2}, Shape{7, 2}, Shape{7, 2}, true, 0, {2, 3}},
    {"causal, offset past every key", Shape{3, 2}, Shape{4, 2}, Shape{4, 2}, true, 100, {1, 3}},
    {"wide d, r = 1", Shape{4, 8}, Shape{5, 8}, Shape{5, 1}, true, 1, {3, 2}},
    // Sliding windows: rows whose window starts inside a key tile, key tiles no row of a query
    // tile sees (skipped both ways), a window wider than the keys.
    {"window 2, tiles 2x2", Shape{6, 2}, Shape{6, 2}, Shape{6, 3}, true, 0, {2, 2}, 2},
    {"window 3, query_offset 4, tiles 2x3", Shape{3, 2}, Shape{7, 2}, Shape{7, 2}, true, 4, {2, 3}, 3},
    {"window 1 (each row its own key)", Shape{2, 4, 2}, Shape{2, 4, 2}, Shape{2, 4, 2}, true, 0, {3, 2}, 1},
    {"window wider than the keys", Shape{4, 2}, Shape{4, 2}, Shape{4, 3}, true, 0, {2, 2}, 10},
    // ALiBi: heads the dimension before [T, d]; causal, with a window, and without a mask (later
    // keys penalised too).
    {"ALiBi over 3 heads, causal, tiles 2x2", Shape{3, 4, 2}, Shape{3, 4, 2}, Shape{3, 4, 2}, true, 0, {2, 2}, 0, 3},
    {"ALiBi + window 2, batch x heads, offset 2", Shape{2, 2, 3, 2}, Shape{2, 2, 5, 2}, Shape{2, 2, 5, 3}, true, 2,
     {2, 2}, 2, 2},
    {"ALiBi without the causal mask", Shape{2, 3, 2}, Shape{2, 4, 2}, Shape{2, 4, 2}, false, 0, {2, 3}, 0, 2},
};

template <Scalar T>
Var<T> fused(const FusedCase& c, const std::array<Var<T>, 3>& in) {
    return fused_attention(in[0], in[1], in[2], c.settings());
}

template <Scalar T>
Var<T> composed(const FusedCase& c, const std::array<Var<T>, 3>& in) {
    return composed_attention(in[0], in[1], in[2], c.causal, c.offset, c.window, c.alibi_heads);
}

// Fault controls, built from the real op: the backward without the D term (dS = P ∘ dP), and a
// saved log-sum-exp that forgot log l (so the recomputed P is unnormalised). The forward output is
// unchanged in both. Each declares its own hooks_of, so the tape takes its vjp_all (its own, or
// FusedAttention's inherited one) as the op's backward.

// FusedAttention's backward given a zero output: D = rowsum(dO ∘ O) is then 0, exactly the
// missing D term.
struct NoDTerm : FusedAttention {
    using hooks_of = NoDTerm;
    template <Scalar T>
    static void vjp_all(const Settings& settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        const Tensor<T> zero_output(at.out.shape(), T(0));
        FusedAttention::vjp_all<T>(settings, VjpArgs<T>{at.in, zero_output, at.saved, at.G}, grads);
    }
};

// FusedAttention's forward, then each row's largest visible score max_j S_ij saved in place of
// its log-sum-exp L_i = log Σ_j exp(S_ij).
struct MaxInsteadOfLogSumExp : FusedAttention {
    using hooks_of = MaxInsteadOfLogSumExp;
    template <Scalar T>
    static void forward(const Settings& settings, Inputs<T> in, Tensor<T>& O, Tensor<T>& saved) {
        FusedAttention::forward<T>(settings, in, O, saved);
        const Tensor<T>& Q = *in[0];
        const Tensor<T>& K = *in[1];
        const std::size_t Tq = Q.rows(), Tk = K.rows(), d = Q.cols();
        const T c = inv_sqrt<T>(d);
        for (std::size_t row = 0; row < saved.size(); ++row) {  // row = b·Tq + i
            const std::size_t b = row / Tq, i = row % Tq;
            const std::size_t visible = settings.pattern.end_key(i, Tk);
            T largest = -std::numeric_limits<T>::infinity();
            for (std::size_t j = 0; j < visible; ++j) {
                T dot(0);
                for (std::size_t a = 0; a < d; ++a) dot += Q[row * d + a] * K[(b * Tk + j) * d + a];
                largest = std::max(largest, T(c * dot));
            }
            saved[row] = largest;
        }
    }
};

// The backward of a window one key wider than the forward's (the sliding-window off-by-one):
// the recomputed P gives the extra key a weight the forward never did.
struct WindowWiderInBackward : FusedAttention {
    using hooks_of = WindowWiderInBackward;
    template <Scalar T>
    static void vjp_all(Settings settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        ++settings.pattern.window;
        FusedAttention::vjp_all<T>(settings, at, grads);
    }
};

// The backward recomputing P without ALiBi's bias (a fused kernel that adds the bias in the
// forward only).
struct BiasForgottenInBackward : FusedAttention {
    using hooks_of = BiasForgottenInBackward;
    template <Scalar T>
    static void vjp_all(Settings settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        settings.pattern.alibi_heads = 0;
        FusedAttention::vjp_all<T>(settings, at, grads);
    }
};

template <Scalar T>
Tensor<T> to(const Tensor<double>& x) {
    return tensor_cast<T>(x);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fused_op_passes_the_50_digit_checker) {
    std::mt19937_64 rng(11);
    for (const FusedCase& c : fused_table) {
        BOOST_TEST_CONTEXT(c.name) {
            const CheckReport report = check_op([&c](auto in) { return fused(c, in); }, rng, c.q, c.k, c.v);
            BOOST_TEST(report.passed, report.summary());
            BOOST_TEST(report.max_error_mp <= 1e-25);  // the checker's fixed 50-digit threshold
        }
    }
}

// Values and all three gradients equal the composed graph's, in 50 digits. Both compute the same
// function with about 1e-49 rounding per operation and at most a few dozen operations per
// result, so 1e-40 leaves nine decades of margin while any formula difference shows at ~1e-2.
BOOST_AUTO_TEST_CASE(values_and_gradients_equal_the_composed_graph) {
    std::mt19937_64 rng(5);
    for (const FusedCase& c : fused_table) {
        BOOST_TEST_CONTEXT(c.name) {
            const Tensor<mp50> q = to<mp50>(random_tensor(c.q, rng)), k = to<mp50>(random_tensor(c.k, rng)),
                               v = to<mp50>(random_tensor(c.v, rng));
            Tape<mp50> fused_tape, composed_tape;
            const std::array<Var<mp50>, 3> a{fused_tape.leaf(q), fused_tape.leaf(k), fused_tape.leaf(v)};
            const std::array<Var<mp50>, 3> b{composed_tape.leaf(q), composed_tape.leaf(k), composed_tape.leaf(v)};
            const Var<mp50> O_fused = fused(c, a);
            const Var<mp50> O_composed = composed(c, b);
            BOOST_TEST(max_mixed_error(O_fused.value(), O_composed.value()) <= 1e-40);
            const Tensor<mp50> G = to<mp50>(random_tensor(O_fused.shape(), rng));
            fused_tape.backward(O_fused, G);
            composed_tape.backward(O_composed, G);
            for (std::size_t x = 0; x < 3; ++x) {
                BOOST_TEST_CONTEXT("gradient of input " << x) {
                    BOOST_TEST(max_mixed_error(a[x].grad(), b[x].grad()) <= 1e-40);
                }
            }
        }
    }
}

// Spec Example 1: X = I, Q = aI (a = √2·ln 3), K = I, V = diag(2, 4), probe G = [[1,0],[0,2]].
// S = [[ln3, 0], [0, ln3]], A = [[3/4, 1/4], [1/4, 3/4]], O = [[3/2, 1], [1/2, 3]], J = 15/2,
// dS = [[3/8, −3/8], [−3/2, 3/2]], dQ = dS/√2, dK = ln3·dSᵀ, dV = Aᵀ·G = [[3/4, 1/2], [1/4, 3/2]].
// Tolerances: 1e-12 in double (the spec's own; values are O(1) after a handful of roundings of
// 1e-16) and 1e-40 in 50 digits (same argument as above).
template <Scalar T>
void example_1(double tolerance) {
    using std::abs;
    using std::log;
    using std::sqrt;
    const T ln3 = log(T(3)), a = T(sqrt(T(2))) * ln3, half = T(1) / T(2);
    Tape<T> tape;
    const Var<T> Q = tape.leaf(Tensor<T>::matrix({{a, T(0)}, {T(0), a}}), "Q");
    const Var<T> K = tape.leaf(Tensor<T>::matrix({{T(1), T(0)}, {T(0), T(1)}}), "K");
    const Var<T> V = tape.leaf(Tensor<T>::matrix({{T(2), T(0)}, {T(0), T(4)}}), "V");
    const Var<T> O = fused_attention(Q, K, V, false, 0);
    const Tensor<T> G = Tensor<T>::matrix({{T(1), T(0)}, {T(0), T(2)}});
    T J(0);
    for (std::size_t k = 0; k < 4; ++k) J += O.value()[k] * G[k];
    tape.backward(O, G);
    const T s = inv_sqrt<T>(2);
    const Tensor<T> dS = Tensor<T>::matrix({{T(3) / T(8), T(-3) / T(8)}, {T(-3) / T(2), T(3) / T(2)}});
    BOOST_TEST(max_mixed_error(O.value(), Tensor<T>::matrix({{T(3) / T(2), T(1)}, {half, T(3)}})) <= tolerance);
    BOOST_TEST(to_double(T(abs(T(J - T(15) / T(2))))) <= tolerance);
    BOOST_TEST(max_mixed_error(Q.grad(), Tensor<T>::matrix({{s * dS(0, 0), s * dS(0, 1)}, {s * dS(1, 0), s * dS(1, 1)}})) <=
               tolerance);
    BOOST_TEST(max_mixed_error(K.grad(), Tensor<T>::matrix({{ln3 * dS(0, 0), ln3 * dS(1, 0)},
                                                            {ln3 * dS(0, 1), ln3 * dS(1, 1)}})) <= tolerance);
    BOOST_TEST(max_mixed_error(V.grad(), Tensor<T>::matrix({{T(3) / T(4), half}, {T(1) / T(4), T(3) / T(2)}})) <=
               tolerance);
    // Range check of the spec: each output coordinate lies within the values' range
    // (O[:,0] in [0, 2], O[:,1] in [0, 4]) because each row of weights is a distribution.
    for (std::size_t i = 0; i < 2; ++i) {
        BOOST_TEST((O.value()(i, 0) >= T(0) && O.value()(i, 0) <= T(2)));
        BOOST_TEST((O.value()(i, 1) >= T(0) && O.value()(i, 1) <= T(4)));
    }
}

BOOST_AUTO_TEST_CASE(spec_example_1) {
    example_1<double>(1e-12);
    example_1<mp50>(1e-40);
}

// Spec Example 2: both keys [1, 1]. Weights [1/2, 1/2], both output rows [1, 2], J = 5; dQ = 0
// (a query cannot tell the keys apart) but dK ≠ 0: dS = [[1/2, −1/2], [−2, 2]], so
// dK = dSᵀ·Q/√2 = [[ln3/2, −2 ln3], [−ln3/2, 2 ln3]]. Same tolerances as Example 1.
template <Scalar T>
void example_2(double tolerance) {
    using std::abs;
    using std::log;
    using std::sqrt;
    const T ln3 = log(T(3)), a = T(sqrt(T(2))) * ln3;
    Tape<T> tape;
    const Var<T> Q = tape.leaf(Tensor<T>::matrix({{a, T(0)}, {T(0), a}}), "Q");
    const Var<T> K = tape.leaf(Tensor<T>::matrix({{T(1), T(1)}, {T(1), T(1)}}), "K");
    const Var<T> V = tape.leaf(Tensor<T>::matrix({{T(2), T(0)}, {T(0), T(4)}}), "V");
    const Var<T> O = fused_attention(Q, K, V, false, 0);
    tape.backward(O, Tensor<T>::matrix({{T(1), T(0)}, {T(0), T(2)}}));
    BOOST_TEST(max_mixed_error(O.value(), Tensor<T>::matrix({{T(1), T(2)}, {T(1), T(2)}})) <= tolerance);
    BOOST_TEST(max_mixed_error(Q.grad(), Tensor<T>(Shape{2, 2}, T(0))) <= tolerance);
    BOOST_TEST(max_mixed_error(K.grad(), Tensor<T>::matrix({{ln3 / T(2), T(-2) * ln3}, {-ln3 / T(2), T(2) * ln3}})) <=
               tolerance);
    BOOST_TEST(to_double(T(abs(K.grad()(0, 1)))) > 1.0);  // not zero: keys still get a gradient
}

BOOST_AUTO_TEST_CASE(spec_example_2) {
    example_2<double>(1e-12);
    example_2<mp50>(1e-40);
}

// The spec's asymmetric transpose check: Q = [[1,2],[0,1]], K = [[1,0],[2,1]] give Q·Kᵀ =
// [[1,4],[0,1]] (Q·K would be [[5,2],[2,1]]); with V = I the output is the weights themselves,
// A_i = softmax(row i of Q·Kᵀ / √2), computed here by hand. 1e-12 as above.
BOOST_AUTO_TEST_CASE(spec_transpose_check) {
    Tape<double> tape;
    const Var<double> Q = tape.leaf(Tensor<double>::matrix({{1, 2}, {0, 1}}));
    const Var<double> K = tape.leaf(Tensor<double>::matrix({{1, 0}, {2, 1}}));
    const Var<double> V = tape.leaf(Tensor<double>::matrix({{1, 0}, {0, 1}}));
    const Tensor<double>& O = fused_attention(Q, K, V, false, 0).value();
    const double c = 1 / std::sqrt(2.0);
    const double w0 = 1 / (1 + std::exp(3 * c)), w1 = 1 / (1 + std::exp(c));  // weight of key 0 per row
    BOOST_TEST(max_mixed_error(O, Tensor<double>::matrix({{w0, 1 - w0}, {w1, 1 - w1}})) <= 1e-12);
}

// Further checks of the spec that apply to an op that hides A: each output coordinate within the
// range of the visible values (rows of weights are distributions), and the keys' gradient sums to
// zero over the keys (dS rows sum to zero, so dK = c·dSᵀQ has Σ_j dK_j = c·Σ_i (Σ_j dS_ij) Q_i = 0:
// shifting every key by one vector changes no weight). Checked in 50 digits at 1e-40 (as above),
// on a causal case with an offset and tiles that split the rows.
BOOST_AUTO_TEST_CASE(spec_row_range_and_key_shift_invariance) {
    std::mt19937_64 rng(3);
    const std::size_t Tq = 5, Tk = 9, offset = 2, d = 3, r = 4;
    Tape<mp50> tape;
    const Var<mp50> Q = tape.leaf(to<mp50>(random_tensor(Shape{Tq, d}, rng, 2.0)));
    const Var<mp50> K = tape.leaf(to<mp50>(random_tensor(Shape{Tk, d}, rng, 2.0)));
    const Var<mp50> V = tape.leaf(to<mp50>(random_tensor(Shape{Tk, r}, rng)));
    const Var<mp50> O = fused_attention(Q, K, V, true, offset, FusedAttentionTiles{2, 3});
    for (std::size_t i = 0; i < Tq; ++i) {
        for (std::size_t l = 0; l < r; ++l) {
            mp50 low = V.value()(0, l), high = low;
            for (std::size_t j = 0; j <= std::min(Tk - 1, offset + i); ++j) {
                low = std::min(low, V.value()(j, l));
                high = std::max(high, V.value()(j, l));
            }
            BOOST_TEST((O.value()(i, l) >= low && O.value()(i, l) <= high));
        }
    }
    tape.backward(O, to<mp50>(random_tensor(O.shape(), rng)));
    for (std::size_t a = 0; a < d; ++a) {
        mp50 total(0);
        for (std::size_t j = 0; j < Tk; ++j) total += K.grad()(j, a);
        BOOST_TEST(std::abs(to_double(total)) <= 1e-40);
    }
    // Keys no query sees (j > offset + Tq − 1) receive no gradient at all.
    for (std::size_t j = offset + Tq; j < Tk; ++j)
        for (std::size_t a = 0; a < d; ++a) BOOST_TEST(to_double(K.grad()(j, a)) == 0.0);
}

// Fault controls: the checker must reject a backward without the D term and a backward that
// recomputes P from a wrong log-sum-exp, on inputs where the exact op passes.
BOOST_AUTO_TEST_CASE(fault_controls_are_rejected) {
    std::mt19937_64 rng(17);
    const NamedTensor leaves[] = {{"Q", random_tensor(Shape{2, 3, 2}, rng)},
                                  {"K", random_tensor(Shape{2, 4, 2}, rng)},
                                  {"V", random_tensor(Shape{2, 4, 3}, rng)}};
    const auto graph_of = [](auto op_tag) {
        return [](auto in) {
            using Op = typename decltype(op_tag)::type;
            return testing::probe(record_fused_attention<Op>(
                in[0], in[1], in[2], {.pattern = {.causal = true, .query_offset = 1}, .tiles = {2, 2}}));
        };
    };
    const CheckReport exact = check_gradients(graph_of(std::type_identity<FusedAttention>{}), leaves);
    BOOST_TEST(exact.passed, exact.summary());
    const CheckReport no_d = check_gradients(graph_of(std::type_identity<NoDTerm>{}), leaves);
    BOOST_TEST(!no_d.passed, "a backward without the D term was accepted: " << no_d.summary());
    const CheckReport wrong_lse = check_gradients(graph_of(std::type_identity<MaxInsteadOfLogSumExp>{}), leaves);
    BOOST_TEST(!wrong_lse.passed, "a backward with a wrong log-sum-exp was accepted: " << wrong_lse.summary());
    BOOST_TEST_MESSAGE("no D term: " << no_d.summary());
    BOOST_TEST_MESSAGE("wrong log-sum-exp: " << wrong_lse.summary());
}

// Fault controls of the window and ALiBi: a backward whose window is one key wider than the
// forward's, and one that forgets the bias, on 2 heads over 6 keys with a window of 3 and tiles
// that split it, where the exact op passes. A forward fault that the backward shares (a window one
// narrower in both, reversed slopes) is a consistent function the checker cannot see: the value
// test against the composed graph catches those (window_and_alibi_faults_in_the_forward_are_seen).
BOOST_AUTO_TEST_CASE(window_and_alibi_fault_controls_are_rejected) {
    std::mt19937_64 rng(19);
    const NamedTensor leaves[] = {{"Q", random_tensor(Shape{2, 4, 2}, rng, 2.0)},
                                  {"K", random_tensor(Shape{2, 6, 2}, rng, 2.0)},
                                  {"V", random_tensor(Shape{2, 6, 3}, rng)}};
    const auto graph_of = [](auto op_tag) {
        return [](auto in) {
            using Op = typename decltype(op_tag)::type;
            return testing::probe(record_fused_attention<Op>(
                in[0], in[1], in[2],
                {.pattern = {.causal = true, .query_offset = 2, .window = 3, .alibi_heads = 2}, .tiles = {2, 2}}));
        };
    };
    const CheckReport exact = check_gradients(graph_of(std::type_identity<FusedAttention>{}), leaves);
    BOOST_TEST(exact.passed, exact.summary());
    const CheckReport wider = check_gradients(graph_of(std::type_identity<WindowWiderInBackward>{}), leaves);
    BOOST_TEST(!wider.passed, "a backward with a wider window was accepted: " << wider.summary());
    const CheckReport no_bias = check_gradients(graph_of(std::type_identity<BiasForgottenInBackward>{}), leaves);
    BOOST_TEST(!no_bias.passed, "a backward without ALiBi's bias was accepted: " << no_bias.summary());
    BOOST_TEST_MESSAGE("wider window in the backward: " << wider.summary());
    BOOST_TEST_MESSAGE("bias forgotten in the backward: " << no_bias.summary());
}

// The forward's faults the checker cannot see (a consistent wrong function) against the composed
// graph of masks.hpp (itself held to a loop reference in test_multihead.cpp): a window one key
// narrower or wider, ALiBi over reversed heads (the slopes reversed: the last head's slope on the
// first), no bias. The exact op agrees to 1e-13 in double; each fault misses by more than 1e-3.
BOOST_AUTO_TEST_CASE(window_and_alibi_faults_in_the_forward_are_seen) {
    std::mt19937_64 rng(29);
    const std::size_t H = 4, T = 9, d = 3, window = 4;
    Tape<double> tape;
    const Var<double> Q = tape.leaf(random_tensor(Shape{2, H, T, d}, rng, 2.0));
    const Var<double> K = tape.leaf(random_tensor(Shape{2, H, T, d}, rng, 2.0));
    const Var<double> V = tape.leaf(random_tensor(Shape{2, H, T, d}, rng));
    const Tensor<double> reference = composed_attention(Q, K, V, true, 0, window, H).value();
    const auto miss = [&](const Tensor<double>& O) { return max_mixed_error(O, reference); };
    const FusedAttention::Settings exact{.pattern = {.causal = true, .window = window, .alibi_heads = H}, .tiles = {4, 3}};
    BOOST_TEST(miss(fused_attention(Q, K, V, exact).value()) <= 1e-13);
    for (const std::size_t w : {window - 1, window + 1}) {
        FusedAttention::Settings wrong = exact;
        wrong.pattern.window = w;
        BOOST_TEST_CONTEXT("window " << w) { BOOST_TEST(miss(fused_attention(Q, K, V, wrong).value()) > 1e-3); }
    }
    FusedAttention::Settings no_bias = exact;
    no_bias.pattern.alibi_heads = 0;
    BOOST_TEST(miss(fused_attention(Q, K, V, no_bias).value()) > 1e-3);
    // Reversed slopes: the heads' order reversed on the way in and out gives head h the slope of
    // head H − 1 − h.
    const auto reverse_heads = [&](const Var<double>& x) {
        std::vector<Var<double>> heads;
        for (std::size_t h = H; h-- > 0;) heads.push_back(slice(x, 1, h, h + 1));
        return concat(heads, 1);
    };
    const Var<double> reversed = reverse_heads(fused_attention(reverse_heads(Q), reverse_heads(K), reverse_heads(V), exact));
    BOOST_TEST(miss(reversed.value()) > 1e-3);
}

// The tape takes the one-pass backward (vjp_all) of the op and of the fault controls, so the
// faults above are in the path the tape uses.
static_assert(TapeOp<FusedAttention, double> && HasAllInputsVjp<FusedAttention, double>);
static_assert(TapeOp<NoDTerm, double> && HasAllInputsVjp<NoDTerm, double>);
static_assert(TapeOp<MaxInsteadOfLogSumExp, mp50> && HasAllInputsVjp<MaxInsteadOfLogSumExp, mp50>);

// Gradients requested in part (some of Q, K, V need none, so vjp_all skips dQ, dK or dS) equal
// those of a full request bit for bit: each gradient is formed by the same operations in the same
// order either way. On every case of the table, and on sizes that cross the default tiles with two
// threads. And one leaf feeding Q, K and V receives the sum of the three contributions of one
// vjp_all call (to 1e-12: only the order of that sum is the tape's).
template <Scalar T>
void partial_requests_match_full(const FusedCase& c, std::mt19937_64& rng) {
    const Tensor<T> q = to<T>(random_tensor(c.q, rng)), k = to<T>(random_tensor(c.k, rng)),
                    v = to<T>(random_tensor(c.v, rng));
    const Tensor<T> g = to<T>(random_tensor(c.q.with_matrix(c.q.rows(), c.v.cols()), rng));
    std::array<Tensor<T>, 3> full;
    for (unsigned need = 7; need >= 1; --need) {  // which of Q, K, V need a gradient; 7 (all) first
        Tape<T> tape;
        const std::array<Var<T>, 3> in{tape.leaf(q, "Q", (need & 1) != 0), tape.leaf(k, "K", (need & 2) != 0),
                                       tape.leaf(v, "V", (need & 4) != 0)};
        tape.backward(fused(c, in), g);
        for (std::size_t x = 0; x < 3; ++x) {
            if ((need & (1u << x)) == 0) continue;
            if (need == 7) full[x] = in[x].grad();
            BOOST_TEST_CONTEXT("requested " << need << ", gradient of input " << x) {
                BOOST_TEST((in[x].grad() == full[x]));
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(gradients_requested_in_part_equal_a_full_request) {
    std::mt19937_64 rng(37);
    for (const FusedCase& c : fused_table) {
        BOOST_TEST_CONTEXT(c.name) {
            partial_requests_match_full<double>(c, rng);
            partial_requests_match_full<mp50>(c, rng);
        }
    }
    set_threads(2);
    const std::vector<FusedCase> large = {
        {"T=300, default tiles, causal", Shape{2, 300, 16}, Shape{2, 300, 16}, Shape{2, 300, 8}, true, 0, {}},
        {"Tq=200, Tk=330, tiles 32x48", Shape{2, 200, 8}, Shape{2, 330, 8}, Shape{2, 330, 4}, false, 0, {32, 48}},
        {"causal, offset 40, tiles 16x24", Shape{3, 100, 8}, Shape{3, 140, 8}, Shape{3, 140, 4}, true, 40, {16, 24}},
    };
    for (const FusedCase& c : large) {
        BOOST_TEST_CONTEXT(c.name) { partial_requests_match_full<double>(c, rng); }
    }
    set_threads(0);
    const Tensor<double> x = random_tensor(Shape{2, 7, 3}, rng);
    Tape<double> shared, separate;
    const Var<double> X = shared.leaf(x);
    const std::array<Var<double>, 3> in{separate.leaf(x), separate.leaf(x), separate.leaf(x)};
    const FusedCase c{"one leaf feeding Q, K and V", x.shape(), x.shape(), x.shape(), true, 0, {2, 3}};
    const Tensor<double> G = random_tensor(x.shape(), rng);
    shared.backward(fused(c, std::array<Var<double>, 3>{X, X, X}), G);
    separate.backward(fused(c, in), G);
    Tensor<double> sum(x.shape(), 0.0);
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = in[0].grad()[k] + in[1].grad()[k] + in[2].grad()[k];
    BOOST_TEST(max_mixed_error(X.grad(), sum) <= 1e-12);
}

// The accuracy rule: against a 50-digit reference (the composed graph on a 50-digit tape), the
// double fused op's error is at most twice the double composed graph's, for O and each gradient.
// Error = max |x − ref| over the tensor (absolute: the values are O(1)). A composed error of
// exactly 0 would make the rule demand exactness; it does not occur for these random inputs (the
// test requires it to be positive), so no floor is needed. Sizes cross tile boundaries: T = 200
// with default 128-row tiles, and with 32 × 48 tiles, causal and not.
BOOST_AUTO_TEST_CASE(accuracy_rule_fused_error_at_most_twice_composed) {
    struct Config {
        std::size_t batch, Tq, Tk, d, r;
        bool causal;
        std::size_t offset;
        FusedAttentionTiles tiles;
    };
    const std::vector<Config> configs = {
        {1, 200, 200, 8, 6, false, 0, {}},
        {2, 150, 170, 8, 4, true, 20, {32, 48}},
    };
    std::mt19937_64 rng(23);
    for (const Config& c : configs) {
        BOOST_TEST_CONTEXT("T=" << c.Tq << "x" << c.Tk << " causal=" << c.causal) {
            // Spread 2: scores up to about ±4·√d/… give weights far from uniform.
            const Tensor<double> q = random_tensor(Shape{c.batch, c.Tq, c.d}, rng, 2.0);
            const Tensor<double> k = random_tensor(Shape{c.batch, c.Tk, c.d}, rng, 2.0);
            const Tensor<double> v = random_tensor(Shape{c.batch, c.Tk, c.r}, rng);
            const Tensor<double> g = random_tensor(Shape{c.batch, c.Tq, c.r}, rng);
            Tape<mp50> ref_tape;
            const std::array<Var<mp50>, 3> ref{ref_tape.leaf(to<mp50>(q)), ref_tape.leaf(to<mp50>(k)),
                                               ref_tape.leaf(to<mp50>(v))};
            const Var<mp50> O_ref = composed_attention(ref[0], ref[1], ref[2], c.causal, c.offset);
            ref_tape.backward(O_ref, to<mp50>(g));
            const auto error = [](const Tensor<double>& x, const Tensor<mp50>& reference) {
                double worst = 0;
                for (std::size_t i = 0; i < x.size(); ++i)
                    worst = std::max(worst, std::abs(to_double(mp50(mp50(x[i]) - reference[i]))));
                return worst;
            };
            Tape<double> fused_tape, composed_tape;
            const std::array<Var<double>, 3> f{fused_tape.leaf(q), fused_tape.leaf(k), fused_tape.leaf(v)};
            const std::array<Var<double>, 3> p{composed_tape.leaf(q), composed_tape.leaf(k), composed_tape.leaf(v)};
            const Var<double> O_fused = fused_attention(f[0], f[1], f[2], c.causal, c.offset, c.tiles);
            const Var<double> O_composed = composed_attention(p[0], p[1], p[2], c.causal, c.offset);
            fused_tape.backward(O_fused, g);
            composed_tape.backward(O_composed, g);
            const std::array<std::string, 4> names{"O", "dQ", "dK", "dV"};
            for (std::size_t x = 0; x < 4; ++x) {
                const double fused_error = x == 0 ? error(O_fused.value(), O_ref.value())
                                                  : error(f[x - 1].grad(), ref[x - 1].grad());
                const double composed_error = x == 0 ? error(O_composed.value(), O_ref.value())
                                                     : error(p[x - 1].grad(), ref[x - 1].grad());
                BOOST_TEST_MESSAGE(fmt::format("T={}x{} causal={} {}: fused error {:.3g}, composed error {:.3g}, "
                                               "ratio {:.3f}",
                                               c.Tq, c.Tk, c.causal, names[x], fused_error, composed_error,
                                               fused_error / composed_error));
                BOOST_TEST_CONTEXT(names[x]) {
                    BOOST_TEST(composed_error > 0.0);
                    BOOST_TEST(fused_error <= 2 * composed_error);
                }
            }
        }
    }
}

// Bad input: a clear tapegrad error naming the op and the shapes or values, never a crash.
BOOST_AUTO_TEST_CASE(bad_input_is_refused_with_clear_errors) {
    Tape<double> tape;
    const auto leaf = [&](const Shape& s, double x = 0.5) { return tape.leaf(Tensor<double>(s, x)); };
    const auto says = [](std::string_view a, std::string_view b) {
        return [a = std::string(a), b = std::string(b)](const error& e) {
            const std::string what = e.what();
            const bool ok = what.find(a) != std::string::npos && what.find(b) != std::string::npos;
            if (!ok) BOOST_TEST_MESSAGE("unexpected message: " << what);
            return ok;
        };
    };
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({2, 3}), leaf({2, 4}), leaf({2, 4}), false, 0), shape_error,
                          says("fused_attention", "[2x4]"));
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({2, 3}), leaf({3, 3}), leaf({4, 2}), false, 0), shape_error,
                          says("fused_attention", "[4x2]"));
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({2, 2, 3}), leaf({3, 2, 3}), leaf({3, 2, 3}), false, 0), shape_error,
                          says("fused_attention", "[3x2x3]"));
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({3}), leaf({3, 3}), leaf({3, 3}), false, 0), shape_error,
                          says("fused_attention", "[3]"));
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({0, 3}), leaf({3, 3}), leaf({3, 3}), false, 0), shape_error,
                          says("fused_attention", "empty"));
    BOOST_CHECK_EXCEPTION(
        fused_attention(leaf({2, 3}), leaf({2, 3}, std::numeric_limits<double>::infinity()), leaf({2, 3}), true, 0),
        value_error, says("fused_attention", "inf"));
    // Finite inputs whose scores overflow: S = 1e200·1e200·3/√3 = inf.
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({2, 3}, 1e200), leaf({2, 3}, 1e200), leaf({2, 3}), false, 0),
                          value_error, says("fused_attention", "score"));
    BOOST_CHECK_EXCEPTION(fused_attention(leaf({2, 3}), leaf({2, 3}), leaf({2, 3}), false, 0, FusedAttentionTiles{0, 4}),
                          value_error, says("fused_attention", "tile"));
    // A large score range is fine (the online softmax subtracts the running maximum): no NaN.
    Tape<double> large;
    const Var<double> O = fused_attention(large.leaf(Tensor<double>::matrix({{100, 0}, {-100, 3}})),
                                          large.leaf(Tensor<double>::matrix({{100, 1}, {-100, 2}})),
                                          large.leaf(Tensor<double>::matrix({{1, 2}, {3, 4}})), false, 0);
    BOOST_TEST(O.value()(0, 0) == 1.0, boost::test_tools::tolerance(1e-12));
}

// Results do not depend on the thread count: each tile is computed by one thread in a fixed order,
// and dQ's terms are added in key-tile order. On 1 to 16 threads, plain, causal, and causal with a
// window and ALiBi at an offset, with 2 heads of 300 queries in tiles of 128 (6 forward items, 6
// backward items, 7 with the offset's keys: fewer than the threads from 7 on), bit for bit.
// A non-finite input is named at its first position in each of Q, K and V, whatever the position
// (the first, a middle and the last element: the float and double scan counts before it looks),
// +inf and -inf alike; the largest finite value of the type passes the scan (its scores then
// overflow, a refusal of its own), and a second bad element after the first is not the one named.
template <Scalar T>
void check_non_finite_inputs() {
    // (No NaN: a leaf refuses one before an op sees it.)
    const T values[] = {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
    const Shape shape{2, 3, 5};  // 30 elements: a vector width's remainder at every level
    const std::array<std::string_view, 3> names{"Q", "K", "V"};
    for (std::size_t which = 0; which < 3; ++which)
        for (const std::size_t at : {0u, 13u, 29u})
            for (const T& bad : values) {
                Tape<T> tape;
                std::array<Tensor<T>, 3> in{Tensor<T>(shape, T(0.25)), Tensor<T>(shape, T(-0.5)),
                                            Tensor<T>(shape, T(0.75))};
                in[which][at] = bad;
                if (at != 29) in[which][29] = std::numeric_limits<T>::infinity();  // a later one, not named
                const std::string message = testing::message_of<value_error>(
                    [&] { (void)fused_attention(tape.leaf(in[0]), tape.leaf(in[1]), tape.leaf(in[2]), true, 0); });
                const std::string expected =
                    fmt::format("fused_attention: {} has the non-finite value {} at {} (shape [2x3x5])", names[which],
                                to_double(bad), index_string(shape, at));
                BOOST_TEST(message == expected);
            }
    if constexpr (has_compiled_kernels<T>) {  // the scan's bound: ±max is finite
        Tape<T> tape;
        const Tensor<T> largest(shape, std::numeric_limits<T>::max());
        const std::string message = testing::message_of<value_error>(
            [&] { (void)fused_attention(tape.leaf(largest), tape.leaf(largest), tape.leaf(largest), true, 0); });
        BOOST_TEST(message.starts_with("fused_attention: score S = Q·Kᵀ/√d is inf"), message);
    }
}

BOOST_AUTO_TEST_CASE(a_non_finite_input_is_named_at_its_first_position) {
    check_non_finite_inputs<double>();
    check_non_finite_inputs<float>();
    check_non_finite_inputs<mp50>();
}

BOOST_AUTO_TEST_CASE(results_are_identical_on_1_to_16_threads) {
    std::mt19937_64 rng(29);
    const Tensor<double> q = random_tensor(Shape{2, 300, 16}, rng), k = random_tensor(Shape{2, 340, 16}, rng),
                         v = random_tensor(Shape{2, 340, 8}, rng), g = random_tensor(Shape{2, 300, 8}, rng);
    const FusedAttention::Settings settings[] = {
        {}, {.pattern = {.causal = true}}, {.pattern = {.causal = true, .query_offset = 40, .window = 150, .alibi_heads = 2}}};
    for (const FusedAttention::Settings& s : settings) {
        std::vector<std::array<Tensor<double>, 4>> results;
        for (unsigned threads = 1; threads <= testing::most_threads_tested; ++threads) {
            set_threads(threads);
            Tape<double> tape;
            const Var<double> Q = tape.leaf(q), K = tape.leaf(k), V = tape.leaf(v);
            const Var<double> O = fused_attention(Q, K, V, s);
            tape.backward(O, g);
            results.push_back({O.value(), Q.grad(), K.grad(), V.grad()});
        }
        set_threads(0);  // back to the default, every core
        for (std::size_t t = 1; t < results.size(); ++t)
            for (std::size_t x = 0; x < 4; ++x) {
                BOOST_TEST((results[t][x] == results[0][x]), "causal " << s.pattern.causal << " window "
                                                              << s.pattern.window << ", result " << x << ", "
                                                              << t + 1 << " threads");
            }
    }
}

// Models switch to it: the multi-head model with AttentionKernel::fused gives the composed
// kernel's output and gradients. In 50 digits to 1e-40 (as above); in double to a mixed error of
// 1e-12: the two kernels round differently, by about n·u ≈ 1e-14 for these sizes, two decades below.
template <Scalar T>
void multihead_switch(bool causal, std::size_t offset, double tolerance) {
    std::mt19937_64 rng(31);
    const std::size_t B = 2, Tq = 4, Tk = 6, D = 5, H = 2;
    const Tensor<double> xq = random_tensor(Shape{B, Tq, D}, rng), xm = random_tensor(Shape{B, Tk, D}, rng);
    const Tensor<double> wq = random_tensor(Shape{D, H * 3}, rng), wk = random_tensor(Shape{D, H * 3}, rng),
                         wv = random_tensor(Shape{D, H * 2}, rng), wo = random_tensor(Shape{H * 2, 3}, rng);
    const Tensor<double> g = random_tensor(Shape{B, Tq, 3}, rng);
    std::array<std::array<Tensor<T>, 7>, 2> results;
    for (int kernel = 0; kernel < 2; ++kernel) {
        Tape<T> tape;
        const Var<T> Xq = tape.leaf(to<T>(xq)), Xm = tape.leaf(to<T>(xm));
        const MultiHeadWeights<T> w{tape.leaf(to<T>(wq)), tape.leaf(to<T>(wk)), tape.leaf(to<T>(wv)),
                                    tape.leaf(to<T>(wo))};
        MultiHeadOptions options;
        options.heads = H;
        options.causal = causal;
        options.query_offset = offset;
        options.kernel = kernel == 0 ? AttentionKernel::composed : AttentionKernel::fused;
        const MultiHeadResult<T> result = multihead_attention(Xq, Xm, w, options);
        tape.backward(result.Y, to<T>(g));
        results[kernel] = {result.Y.value(), Xq.grad(), Xm.grad(), w.W_Q.grad(), w.W_K.grad(), w.W_V.grad(),
                           w.W_O.grad()};
    }
    const std::array<std::string, 7> names{"Y", "dX_query", "dX_memory", "dW_Q", "dW_K", "dW_V", "dW_O"};
    for (std::size_t x = 0; x < 7; ++x) {
        BOOST_TEST_CONTEXT(names[x]) { BOOST_TEST(max_mixed_error(results[1][x], results[0][x]) <= tolerance); }
    }
}

BOOST_AUTO_TEST_CASE(multihead_model_switches_to_the_fused_kernel) {
    multihead_switch<double>(true, 2, 1e-12);
    multihead_switch<double>(false, 0, 1e-12);
    multihead_switch<mp50>(true, 2, 1e-40);
}

// The training example (examples/train_retrieval.cpp: RetrievalTrainer, Adam) gives the same
// losses with either kernel: same data stream (seed 2026), same Adam settings, same initial
// parameters. The bound is 1e-9: the kernels' roundings differ by ~1e-16 per value and
// Adam's normalised steps of 1e-2 carry such differences along without amplifying them to
// anywhere near 1e-9 in 30 steps.
std::vector<double> retrieval_training_losses(AttentionKernel kernel, std::size_t steps) {
    RetrievalConfig config{};
    config.kernel = kernel;
    RetrievalTrainer trainer(config, AdamSettings{.learning_rate = 1e-2});
    std::mt19937_64 training_data(2026);
    std::vector<double> losses;
    for (std::size_t step = 0; step < steps; ++step) {
        losses.push_back(trainer.step(make_retrieval_batch(config, 16, training_data)));
    }
    return losses;
}

BOOST_AUTO_TEST_CASE(retrieval_training_losses_agree_with_either_kernel) {
    const std::size_t steps = 30;
    const std::vector<double> composed = retrieval_training_losses(AttentionKernel::composed, steps);
    const std::vector<double> fused = retrieval_training_losses(AttentionKernel::fused, steps);
    double worst = 0;
    for (std::size_t step = 0; step < steps; ++step) worst = std::max(worst, std::abs(fused[step] - composed[step]));
    BOOST_TEST_MESSAGE(fmt::format("retrieval training, {} steps: loss {:.6f} -> {:.6f}, max |fused - composed| {:.3g}",
                                   steps, composed.front(), composed.back(), worst));
    BOOST_TEST(worst <= 1e-9);
}
