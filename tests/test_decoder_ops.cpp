// The ops of today's decoders (LLaMA, Mistral): rms_norm, silu (SwiGLU's gate), rope in both
// pairings and from an offset, repeat_heads (grouped-query attention's key/value heads) through the
// generic 50-digit checker, one line per row, on random shapes, each row's worst error printed;
// then their specific promises against independent references (the definitions, a complex-number
// RoPE as Meta's code writes it, the key/value-cache offset), the errors that name the fault, and
// fault controls: the wrong gradients other frameworks have published, written as VJPs, each of
// which the checker must reject.
#define BOOST_TEST_MODULE decoder_ops
#include "support.hpp"

#include <complex>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::message_of;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::random_tensor;
using tapegrad::testing::scalar_of;

namespace {

RopeSettings rope_at(RopePairing pairing, std::size_t first_position, double base = 10000) {
    return {.base = base, .pairing = pairing, .first_position = first_position};
}

// clang-format off
const std::vector<OpCase> op_table = {
    {"rms_norm", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rms_norm(in[0], in[1]); }, rng, Shape{d.m, d.n}, Shape{d.n}); }},
    {"rms_norm batched", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rms_norm(in[0], in[1]); }, rng, Shape{d.batch, d.m, d.k + 1}, Shape{d.k + 1}); }},
    {"rms_norm eps=0.5", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rms_norm(in[0], in[1], {.epsilon = 0.5}); }, rng, Shape{d.m, d.n}, Shape{d.n}); }},
    {"silu", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return silu(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"rope interleaved", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rope(in[0], rope_at(RopePairing::interleaved, 0, 10)); }, rng, Shape{d.m, 2 * d.n}); }},
    {"rope halves", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rope(in[0], rope_at(RopePairing::halves, 0, 10)); }, rng, Shape{d.m, 2 * d.n}); }},
    {"rope interleaved heads from 7", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rope(in[0], rope_at(RopePairing::interleaved, 7)); }, rng, Shape{d.batch, 2, d.m, 2 * d.k}); }},
    {"rope halves heads from 300", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return rope(in[0], rope_at(RopePairing::halves, 300)); }, rng, Shape{d.batch, 2, d.m, 2 * d.k}); }},
    {"repeat_heads 1", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return repeat_heads(in[0], 1); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"repeat_heads 3", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return repeat_heads(in[0], 3); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"repeat_heads 2 batched", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return repeat_heads(in[0], 2); }, rng, Shape{2, d.batch, d.m, d.n}); }},
};
// clang-format on

// ---- fault controls: published wrong gradients, as VJPs ----

// llm.c #763: RMSNorm's backward "forgot to multiply by the weight": dx = r·(G − x̂·mean(G∘x̂)).
struct RmsNormWithoutGainInBackward : RmsNorm {
    static constexpr std::string_view name = "rms_norm without the gain in dX";
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        if (which != 0) return RmsNorm::vjp(s, at, which, din);
        const std::size_t D = at.in[0]->cols(), N = at.in[0]->size() / D;
        for (std::size_t n = 0; n < N; ++n) {
            const T& r = at.saved[n];
            T mean(0);
            for (std::size_t j = 0; j < D; ++j) mean += at.G[n * D + j] * T((*at.in[0])[n * D + j] * r);
            mean /= T(D);
            for (std::size_t j = 0; j < D; ++j)
                din[n * D + j] = r * (at.G[n * D + j] - T((*at.in[0])[n * D + j] * r) * mean);
        }
    }
};

// The scale treated as a constant: dx = r·ĝ, the term through r dropped (ggml's rms_norm_back of
// ggml #1491 is wrong on every row; this is the derivation's commonest slip).
struct RmsNormScaleAsConstant : RmsNorm {
    static constexpr std::string_view name = "rms_norm with r held constant in dX";
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        if (which != 0) return RmsNorm::vjp(s, at, which, din);
        const std::size_t D = at.in[0]->cols(), N = at.in[0]->size() / D;
        for (std::size_t n = 0; n < N; ++n)
            for (std::size_t j = 0; j < D; ++j) din[n * D + j] = at.saved[n] * at.G[n * D + j] * (*at.in[1])[j];
    }
};

// silu's gate without its own slope: dA = G ∘ σ(A).
struct SiluWithoutGateSlope : Silu {
    static constexpr std::string_view name = "silu without the gate's slope";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * Sigmoid::logistic((*at.in[0])[k]);
    }
};

// RoPE's backward rotating by R(θ) instead of R(θ)ᵀ (sin's sign kept).
struct RopeBackwardForward : Rope {
    static constexpr std::string_view name = "rope whose VJP rotates by R(θ), not R(θ)ᵀ";
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        rotate(s.pairing, at.saved, at.G, dX, +1);
    }
};

// RoPE's backward pairing the features by the other convention (halves for interleaved).
struct RopeBackwardOtherPairing : Rope {
    static constexpr std::string_view name = "rope whose VJP pairs features the other way";
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const RopePairing other = s.pairing == RopePairing::interleaved ? RopePairing::halves : RopePairing::interleaved;
        rotate(other, at.saved, at.G, dX, -1);
    }
};

// A fused RoPE that cuts the graph: the rotation applied forward, no gradient through it (dX = 0).
struct RopeCuttingTheGraph : Rope {
    static constexpr std::string_view name = "rope with no gradient (the graph cut)";
    template <Scalar T>
    static void vjp(const Settings<T>&, const VjpArgs<T>&, std::size_t, Tensor<T>& dX) {
        dX.fill(T(0));
    }
};

// Grouped-query attention's wrong dK, dV: one member of the group's gradient (r = 0), or their mean.
template <bool mean>
struct RepeatHeadsWrongGroupSum : RepeatHeads {
    static constexpr std::string_view name =
        mean ? "repeat_heads averaging the group's gradients" : "repeat_heads taking the first head's gradient";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dX) {
        RepeatHeads::vjp(s, at, which, dX);
        const std::size_t head = at.in[0]->rows() * at.in[0]->cols();
        for (std::size_t c = 0; c < dX.size(); ++c) {
            if constexpr (mean) {
                dX[c] /= T(s.groups);
            } else {
                dX[c] = at.G[(c / head) * s.groups * head + c % head];
            }
        }
    }
};

const bool faults_registered =
    register_siblings<RmsNormWithoutGainInBackward>() && register_siblings<RmsNormScaleAsConstant>() &&
    register_siblings<SiluWithoutGateSlope>() && register_siblings<RopeBackwardForward>() &&
    register_siblings<RopeBackwardOtherPairing>() && register_siblings<RopeCuttingTheGraph>() &&
    register_siblings<RepeatHeadsWrongGroupSum<true>>() &&
    register_siblings<RepeatHeadsWrongGroupSum<false>>();

bool mentions(const std::string& text, const std::string& words) { return text.find(words) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(every_decoder_op_passes_the_50_digit_checker) {
    testing::check_op_table(op_table, 4107, 5);
}

// Each fault control on the shapes where it is wrong (a gain away from 1, rows of width ≥ 2, more
// than one head per group), through the op-table drive: rejected, the correct op passing on the
// same leaves.
BOOST_AUTO_TEST_CASE(published_wrong_gradients_are_rejected) {
    BOOST_TEST(faults_registered);
    std::mt19937_64 rng(11);
    const auto rejects = [&rng](auto correct, auto broken, auto... shapes) {
        return testing::rejects(correct, broken, rng, shapes...);
    };
    BOOST_TEST(rejects([](auto in) { return rms_norm(in[0], in[1]); },
                       [](auto in) {
                           using T = scalar_of<decltype(in[0])>;
                           return in[0].tape().template record<RmsNormWithoutGainInBackward>({in[0], in[1]}, {T(1e-6)});
                       },
                       Shape{3, 5}, Shape{5}));
    BOOST_TEST(rejects([](auto in) { return rms_norm(in[0], in[1]); },
                       [](auto in) {
                           using T = scalar_of<decltype(in[0])>;
                           return in[0].tape().template record<RmsNormScaleAsConstant>({in[0], in[1]}, {T(1e-6)});
                       },
                       Shape{3, 5}, Shape{5}));
    BOOST_TEST(rejects([](auto in) { return silu(in[0]); },
                       [](auto in) { return in[0].tape().template record<SiluWithoutGateSlope>({in[0]}); }, Shape{3, 4}));
    for (const RopePairing pairing : {RopePairing::interleaved, RopePairing::halves}) {
        const auto settings = [pairing](auto in) {
            using T = scalar_of<decltype(in[0])>;
            return Rope::Settings<T>{T(10), pairing, 3};
        };
        BOOST_TEST(rejects([pairing](auto in) { return rope(in[0], rope_at(pairing, 3, 10)); },
                           [&](auto in) { return in[0].tape().template record<RopeBackwardForward>({in[0]}, settings(in)); },
                           Shape{2, 3, 8}));
        BOOST_TEST(rejects([pairing](auto in) { return rope(in[0], rope_at(pairing, 3, 10)); },
                           [&](auto in) { return in[0].tape().template record<RopeBackwardOtherPairing>({in[0]}, settings(in)); },
                           Shape{2, 3, 8}));
        BOOST_TEST(rejects([pairing](auto in) { return rope(in[0], rope_at(pairing, 3, 10)); },
                           [&](auto in) { return in[0].tape().template record<RopeCuttingTheGraph>({in[0]}, settings(in)); },
                           Shape{2, 3, 8}));
    }
    BOOST_TEST(rejects([](auto in) { return repeat_heads(in[0], 3); },
                       [](auto in) { return in[0].tape().template record<RepeatHeadsWrongGroupSum<true>>({in[0]}, {3}); },
                       Shape{2, 2, 3, 2}));
    BOOST_TEST(rejects([](auto in) { return repeat_heads(in[0], 3); },
                       [](auto in) { return in[0].tape().template record<RepeatHeadsWrongGroupSum<false>>({in[0]}, {3}); },
                       Shape{2, 2, 3, 2}));
}

// rms_norm against its definition: y = g·x/√(mean x² + ε), ε inside the root (so a row's mean
// square after the norm is ms/(ms + ε), not 1: this tells ε's placement), and no mean removed.
BOOST_AUTO_TEST_CASE(rms_norm_matches_its_definition) {
    std::mt19937_64 rng(12);
    Tape<double> tape;
    const Tensor<double> x = random_tensor(Shape{2, 3, 6}, rng, 3.0), g = random_tensor(Shape{6}, rng);
    const Tensor<double> Y = rms_norm(tape.leaf(x), tape.leaf(g), {.epsilon = 1e-3}).value();
    for (std::size_t n = 0; n < 6; ++n) {
        double ms = 0;
        for (std::size_t j = 0; j < 6; ++j) ms += x[n * 6 + j] * x[n * 6 + j] / 6;
        for (std::size_t j = 0; j < 6; ++j)
            BOOST_TEST(Y[n * 6 + j] == g[j] * x[n * 6 + j] / std::sqrt(ms + 1e-3), boost::test_tools::tolerance(1e-14));
    }
}

// rms_norm's input gradient at width 1 is dx = r·ε·ĝ/(x² + ε), tiny beside r·ĝ when x² ≫ ε: the
// form r·(ĝ − x̂·mean(ĝ∘x̂)) subtracts two numbers equal to log10(x²/ε) digits and kept only the
// rest (5.8 digits lost at |x| = 0.8, ε = 1e-6; 14 at 1e4). The same cancellation hits the dominant
// element of a wider row (x_j² ≫ the other squares + D·ε). Double against the 50-digit gradient at
// every element: the relative error bound, 64 u ≈ 7e-15, is a dozen roundings of the formula with
// margin. The old form (emulated in exact arithmetic) misses it at 12 of these 14 points, by 7× to
// 1e14×; it passes only at x = 0.0213 and −0.01 with ε = 1e-6, where x²/ε is a few hundred.
BOOST_AUTO_TEST_CASE(rms_norm_gradient_keeps_its_digits_where_a_row_is_one_element) {
    const double u = std::numeric_limits<double>::epsilon() / 2;
    const std::vector<std::vector<double>> rows{{0.8}, {-3.7}, {0.0213}, {1e4}, {-1e-2}, {1e3, 1e-3}, {-2e-4, 0.8, 3e-5}};
    for (const double epsilon : {1e-6, 1e-10})
        for (const std::vector<double>& row : rows) {
            const std::size_t D = row.size();
            BOOST_TEST_CONTEXT("row " << Tensor<double>(Shape{1, D}, row) << ", epsilon " << epsilon) {
                const auto gradient = [&](auto zero) {
                    using T = decltype(zero);
                    Tape<T> tape;
                    Tensor<T> x(Shape{1, D}), gain(Shape{D}), G(Shape{1, D});
                    for (std::size_t j = 0; j < D; ++j) x[j] = T(row[j]), gain[j] = T(0.9 - 0.3 * j), G[j] = T(-1.3 + j);
                    const Var<T> X = tape.leaf(x);
                    tape.backward(rms_norm(X, tape.leaf(gain), {.epsilon = epsilon}), G);
                    return X.grad();
                };
                const Tensor<mp50> exact = gradient(mp50(0));
                const Tensor<double> ours = gradient(0.0);
                for (std::size_t j = 0; j < D; ++j) {
                    const mp50 error = abs(mp50(ours[j]) - exact[j]) / abs(exact[j]);
                    BOOST_TEST(to_double(error) <= 64 * u, "element " << j);
                }
            }
        }
}

// silu against x·σ(x) from std::exp, and stable at ±1e4 (no NaN, derivative 0 far below zero).
BOOST_AUTO_TEST_CASE(silu_matches_its_definition_and_is_stable) {
    Tape<double> tape;
    const Var<double> A = tape.leaf(Tensor<double>::matrix({{-3.0, -0.5, 0.0, 0.75, 4.0, -1e4, 1e4}}));
    const Var<double> Y = silu(A);
    for (std::size_t k = 0; k < 5; ++k) {
        const double a = A.value()[k];
        BOOST_TEST(Y.value()[k] == a / (1 + std::exp(-a)), boost::test_tools::tolerance(1e-15));
    }
    BOOST_TEST(Y.value()[5] == 0.0);
    BOOST_TEST(Y.value()[6] == 1e4);
    tape.backward(sum(Y));
    BOOST_TEST(A.grad()[5] == 0.0);
    BOOST_TEST(A.grad()[6] == 1.0);
}

// RoPE as Meta's LLaMA code writes it: each pair (x_2i, x_2i+1) a complex number times e^{iθ}
// (std::complex, θ = p·base^(−2i/d) from std::pow); the halves pairing is the interleaved one on
// features reordered (i, i + d/2) -> (2i, 2i + 1), as Hugging Face's permutation of Meta's weights.
BOOST_AUTO_TEST_CASE(rope_matches_a_complex_rotation_in_both_pairings) {
    std::mt19937_64 rng(13);
    const std::size_t T = 5, d = 8, first = 11;
    const Tensor<double> x = random_tensor(Shape{2, T, d}, rng);
    Tape<double> tape;
    const Tensor<double> interleaved = rope(tape.leaf(x), rope_at(RopePairing::interleaved, first)).value();
    const Tensor<double> halves = rope(tape.leaf(x), rope_at(RopePairing::halves, first)).value();
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t i = 0; i < d / 2; ++i) {
                const double theta = static_cast<double>(first + t) * std::pow(10000.0, -2.0 * i / d);
                const std::complex<double> turn = std::polar(1.0, theta);
                const std::size_t row = (b * T + t) * d;
                const std::complex<double> a = std::complex<double>(x[row + 2 * i], x[row + 2 * i + 1]) * turn;
                BOOST_TEST(interleaved[row + 2 * i] == a.real(), boost::test_tools::tolerance(1e-13));
                BOOST_TEST(interleaved[row + 2 * i + 1] == a.imag(), boost::test_tools::tolerance(1e-13));
                const std::complex<double> h = std::complex<double>(x[row + i], x[row + i + d / 2]) * turn;
                BOOST_TEST(halves[row + i] == h.real(), boost::test_tools::tolerance(1e-13));
                BOOST_TEST(halves[row + i + d / 2] == h.imag(), boost::test_tools::tolerance(1e-13));
            }
}

// The key/value cache's promise: rows rotated from first_position n equal rows n.. of the whole
// sequence rotated from 0, bit for bit (the same angles, the same operations).
BOOST_AUTO_TEST_CASE(rope_from_an_offset_equals_the_rows_of_the_whole_sequence) {
    std::mt19937_64 rng(14);
    const std::size_t T = 9, d = 6, n = 4;
    const Tensor<double> x = random_tensor(Shape{T, d}, rng);
    Tape<double> tape;
    const Var<double> X = tape.leaf(x);
    for (const RopePairing pairing : {RopePairing::interleaved, RopePairing::halves}) {
        const Tensor<double> whole = rope(X, rope_at(pairing, 0)).value();
        const Tensor<double> tail = rope(slice(X, 0, n, T), rope_at(pairing, n)).value();
        for (std::size_t k = 0; k < tail.size(); ++k) BOOST_TEST(tail[k] == whole[n * d + k]);
    }
}

// repeat_heads against its index formula: Y[b, h] = X[b, h / g].
BOOST_AUTO_TEST_CASE(repeat_heads_gives_each_query_head_its_groups_key_value_head) {
    std::mt19937_64 rng(15);
    const Tensor<double> x = random_tensor(Shape{2, 3, 4, 5}, rng);
    Tape<double> tape;
    const Tensor<double> Y = repeat_heads(tape.leaf(x), 2).value();
    BOOST_TEST(Y.shape().to_string() == "[2x6x4x5]");
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 6; ++h)
            for (std::size_t e = 0; e < 20; ++e) BOOST_TEST(Y[(b * 6 + h) * 20 + e] == x[(b * 3 + h / 2) * 20 + e]);
}

BOOST_AUTO_TEST_CASE(bad_inputs_name_the_op_and_the_fault) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>(Shape{2, 4}, 0.5), "X");
    const Var<double> X3 = tape.leaf(Tensor<double>(Shape{2, 3}, 0.5)), v3 = tape.leaf(Tensor<double>(Shape{3}, 1.0));
    const Var<double> scalar = tape.leaf(Tensor<double>(Shape{}, 1.0)), row = tape.leaf(Tensor<double>(Shape{4}, 1.0));
    BOOST_TEST(mentions(message_of<shape_error>([&] { rms_norm(X, v3); }), "rms_norm: gain is [3] but X is [2x4]: it must be [4]"));
    BOOST_TEST(mentions(message_of<value_error>([&] { rms_norm(X, row, {.epsilon = 0.0}); }), "rms_norm: epsilon 0 must be positive"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { rms_norm(scalar, v3); }), "rms_norm: X must have a feature dimension"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { rope(X3); }), "rope: X is [2x3]: its last axis (3) must be even"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { rope(row); }), "rope: X must be a matrix"));
    BOOST_TEST(mentions(message_of<value_error>([&] { rope(X, {.base = 0.0}); }), "rope: base 0 must be positive and finite"));
    BOOST_TEST(mentions(message_of<value_error>([&] { rope(X, {.base = std::numeric_limits<double>::infinity()}); }), "rope: base inf"));
    BOOST_TEST(mentions(message_of<value_error>([&] { rope(X, {.pairing = RopePairing(7)}); }), "rope: pairing 7 is neither"));
    // The last position a saved tape can hold is taken, the next one refused (a tape saved with it
    // would not load: setting "first_position" ... above 1099511627776).
    BOOST_TEST((rope(X, {.first_position = max_elements}).shape() == X.shape()));
    BOOST_TEST(mentions(message_of<value_error>([&] { rope(X, {.first_position = max_elements + 1}); }),
                        "rope: first_position 1099511627777 is above 1099511627776"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { repeat_heads(X, 2); }), "repeat_heads: X must be [..., H_kv, T, d] (rank 3 or more), got [2x4]"));
    const Var<double> heads = tape.leaf(Tensor<double>(Shape{2, 2, 3}, 0.5));
    BOOST_TEST(mentions(message_of<shape_error>([&] { repeat_heads(heads, 0); }), "repeat_heads: groups must be at least 1"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { repeat_heads(heads, std::numeric_limits<std::size_t>::max() / 4); }), "overflow the element count"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { silu(tape.leaf(Tensor<double>(Shape{0, 2}))); }), "silu: A is empty"));
}
