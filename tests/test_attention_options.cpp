// One fact, one answer for multi-head attention: the composed and fused kernels over the product
// of the options (causal or not, query offset 0 or not, ALiBi, a sliding window, RoPE with a base
// other than 10000 in both pairings, grouped heads with g > 1 and H_kv > 1, a key/value cache,
// padding), each pair held to each other AND to a loop reference written from the definitions
// (not from the library's code), on non-square projections so that a missing transpose or a
// swapped head width cannot hide. Self-consistency alone would pass a consistent but wrong
// function (a head-to-group mapping, an absolute position off by one, a pairing applied to one side
// only); the reference does not.
#define BOOST_TEST_MODULE attention_options
#include "support.hpp"
#include "models/multihead.hpp"

#include <cmath>
#include <numbers>
#include <optional>

using namespace tapegrad;
using tapegrad::testing::random_tensor;

namespace {

// Sizes: B sequences, Tq queries at absolute positions offset.., Tk keys at 0.., model width D,
// head widths dh (queries and keys) and dv (values) unequal, output width D_out ≠ D.
constexpr std::size_t B = 2, Tq = 4, Tk = 7, D = 5, dh = 4, dv = 3, D_out = 6;

struct Combination {
    bool causal = true;
    std::size_t offset = 0;
    bool alibi = false;
    std::size_t window = 0;
    std::optional<RopeSettings> rope{};
    std::size_t H = 2, H_kv = 2;

    std::string name() const {
        return fmt::format("causal {} offset {} alibi {} window {} rope {} H {} H_kv {}", causal, offset, alibi, window,
                           rope ? (rope->pairing == RopePairing::halves ? "halves" : "interleaved") : "none", H, H_kv);
    }
    MultiHeadOptions options(AttentionKernel kernel) const {
        MultiHeadOptions o;
        o.heads = H, o.kv_heads = H_kv, o.causal = causal, o.query_offset = offset, o.alibi = alibi, o.window = window;
        o.rope = rope, o.kernel = kernel;
        return o;
    }
};

// Every combination both kernels take: the window only with the causal mask (it is refused
// otherwise: alibi_and_windows_refuse_what_they_cannot_do in test_multihead.cpp).
std::vector<Combination> every_combination() {
    const std::optional<RopeSettings> ropes[] = {std::nullopt, RopeSettings{.base = 500, .pairing = RopePairing::interleaved},
                                                 RopeSettings{.base = 500, .pairing = RopePairing::halves}};
    const std::pair<std::size_t, std::size_t> heads[] = {{2, 2}, {4, 2}, {4, 1}};  // g = 1, g = 2 with H_kv = 2, MQA
    std::vector<Combination> all;
    for (const bool causal : {false, true})
        for (const std::size_t offset : {std::size_t{0}, std::size_t{2}})
            for (const bool alibi : {false, true})
                for (const std::size_t window : {std::size_t{0}, std::size_t{2}}) {
                    if (window != 0 && !causal) continue;
                    for (const auto& rope : ropes)
                        for (const auto& [H, H_kv] : heads) all.push_back({causal, offset, alibi, window, rope, H, H_kv});
                }
    return all;
}

// ---- the reference, loop by loop from the definitions ----

// Row t of X times columns [first, first + n) of W.
std::vector<double> project(const Tensor<double>& X, std::size_t b, std::size_t t, const Tensor<double>& W,
                            std::size_t first, std::size_t n) {
    const std::size_t rows = X.shape()[1];
    std::vector<double> y(n, 0.0);
    for (std::size_t c = 0; c < n; ++c)
        for (std::size_t e = 0; e < X.shape()[2]; ++e) y[c] += X[(b * rows + t) * X.shape()[2] + e] * W(e, first + c);
    return y;
}

// RoPE at absolute position p: pair i (features (2i, 2i+1) interleaved, (i, i + d/2) in halves)
// rotated by θ = p·base^(−2i/d).
void rotate(std::vector<double>& x, std::size_t p, const RopeSettings& rope) {
    const std::size_t d = x.size();
    for (std::size_t i = 0; i < d / 2; ++i) {
        const std::size_t j = rope.pairing == RopePairing::halves ? i : 2 * i;
        const std::size_t k = rope.pairing == RopePairing::halves ? i + d / 2 : 2 * i + 1;
        const double theta = double(p) * std::pow(rope.base, -2.0 * double(i) / double(d));
        const double xj = x[j], xk = x[k];
        x[j] = xj * std::cos(theta) - xk * std::sin(theta);
        x[k] = xj * std::sin(theta) + xk * std::cos(theta);
    }
}

// Y [B, Tq, D_out] of multi-head attention: query head h reads key/value head h / (H / H_kv);
// query i at p = offset + i sees key j when (not causal or j ≤ p) and (no window or p − j < w) and
// j < length (padding), with ALiBi's −m_h·|p − j|, m_h = 2^(−8(h+1)/H) (H a power of two); a query
// row at or past its sequence's length outputs zero.
// `fault` is for the controls only: the slips a self-consistent library could make, which the
// comparisons must see.
enum class Fault {
    none,
    heads_grouped_by_modulo,       // query head h reads key/value head h % H_kv instead of h / g
    query_positions_one_later,     // RoPE rotates query i at p + 1
    queries_paired_the_other_way,  // RoPE's pairing applied to the keys only, the other on queries
    alibi_at_the_row_index,        // ALiBi's bias at i instead of the absolute position p
};

Tensor<double> reference(const Combination& c, const Tensor<double>& Xq, const Tensor<double>& Xkv,
                         const std::array<Tensor<double>, 4>& W, const std::vector<std::size_t>& lengths = {},
                         Fault fault = Fault::none) {
    const std::size_t g = c.H / c.H_kv, tq = Xq.shape()[1], tk = Xkv.shape()[1];
    Tensor<double> Y(Shape{B, tq, D_out}, 0.0);
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t length = lengths.empty() ? tk : lengths[b];
        for (std::size_t i = 0; i < tq; ++i) {
            const std::size_t p = c.offset + i;
            if (p >= length) continue;  // a padded query row: zero
            std::vector<double> merged(c.H * dv, 0.0);
            for (std::size_t h = 0; h < c.H; ++h) {
                const std::size_t kv = fault == Fault::heads_grouped_by_modulo ? h % c.H_kv : h / g;
                std::vector<double> q = project(Xq, b, i, W[0], h * dh, dh);
                if (c.rope) {
                    RopeSettings on_q = *c.rope;
                    if (fault == Fault::queries_paired_the_other_way) {
                        on_q.pairing = on_q.pairing == RopePairing::halves ? RopePairing::interleaved : RopePairing::halves;
                    }
                    rotate(q, fault == Fault::query_positions_one_later ? p + 1 : p, on_q);
                }
                const double m = std::exp2(-8.0 * double(h + 1) / double(c.H));
                std::vector<double> s(tk, 0.0);
                std::vector<bool> seen(tk, false);
                double largest = -1e300;
                for (std::size_t j = 0; j < tk; ++j) {
                    seen[j] = (!c.causal || j <= p) && (c.window == 0 || p - j < c.window) && j < length;
                    if (!seen[j]) continue;
                    std::vector<double> k = project(Xkv, b, j, W[1], kv * dh, dh);
                    if (c.rope) rotate(k, j, *c.rope);
                    for (std::size_t a = 0; a < dh; ++a) s[j] += q[a] * k[a];
                    s[j] /= std::sqrt(double(dh));
                    const double at = fault == Fault::alibi_at_the_row_index ? double(i) : double(p);
                    if (c.alibi) s[j] -= m * std::abs(at - double(j));
                    largest = std::max(largest, s[j]);
                }
                double total = 0;
                for (std::size_t j = 0; j < tk; ++j) total += seen[j] ? std::exp(s[j] - largest) : 0.0;
                for (std::size_t j = 0; j < tk; ++j) {
                    if (!seen[j]) continue;
                    const std::vector<double> v = project(Xkv, b, j, W[2], kv * dv, dv);
                    for (std::size_t a = 0; a < dv; ++a) merged[h * dv + a] += std::exp(s[j] - largest) / total * v[a];
                }
            }
            for (std::size_t o = 0; o < D_out; ++o)
                for (std::size_t e = 0; e < c.H * dv; ++e) Y[(b * tq + i) * D_out + o] += merged[e] * W[3](e, o);
        }
    }
    return Y;
}

// ---- the library, both kernels ----

// The output and every gradient of one run: Y, dX_query, dX_memory, dW_Q, dW_K, dW_V, dW_O.
using Run = std::array<Tensor<double>, 7>;
const std::array<std::string_view, 7> run_names{"Y", "dX_query", "dX_memory", "dW_Q", "dW_K", "dW_V", "dW_O"};

struct Drawn {
    Tensor<double> Xq, Xkv;
    std::array<Tensor<double>, 4> W;
    Tensor<double> G;
};

Drawn draw(const Combination& c, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    Drawn in{random_tensor(Shape{B, Tq, D}, rng), random_tensor(Shape{B, Tk, D}, rng),
              {random_tensor(Shape{D, c.H * dh}, rng), random_tensor(Shape{D, c.H_kv * dh}, rng),
               random_tensor(Shape{D, c.H_kv * dv}, rng), random_tensor(Shape{c.H * dv, D_out}, rng)},
              random_tensor(Shape{B, Tq, D_out}, rng)};
    return in;
}

Run run(const Drawn& in, const MultiHeadOptions& options) {
    Tape<double> tape;
    const Var<double> Xq = tape.leaf(in.Xq), Xkv = tape.leaf(in.Xkv);
    const MultiHeadWeights<double> w{tape.leaf(in.W[0]), tape.leaf(in.W[1]), tape.leaf(in.W[2]), tape.leaf(in.W[3])};
    const Var<double> Y = multihead_attention(Xq, Xkv, w, options).Y;
    tape.backward(Y, in.G);
    return {Y.value(), Xq.grad(), Xkv.grad(), w.W_Q.grad(), w.W_K.grad(), w.W_V.grad(), w.W_O.grad()};
}

// Mixed error |a − b| / max(1, |b|), the checker's measure, as a maximum over two tensors.
double max_mixed_error(const Tensor<double>& a, const Tensor<double>& b) {
    BOOST_REQUIRE(a.shape() == b.shape());
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
        worst = std::max(worst, std::abs(a[k] - b[k]) / std::max(1.0, std::abs(b[k])));
    }
    return worst;
}

// The bound of every comparison here, fixed before any ran: both sides are double computations of
// one function over at most Tk = 7 keys and D = 5 features, in different summation orders (tiles,
// online softmax, the reference's loops), whose rounding differs by a few n·u ≈ 1e-15; 1e-12
// leaves three decades and is still nine decades below the smallest fault this file controls for.
constexpr double agree = 1e-12;

}  // namespace

// Every combination: fused and composed agree on Y and on all six gradients; both agree with the
// reference on Y.
BOOST_AUTO_TEST_CASE(both_kernels_agree_with_each_other_and_the_reference_on_every_combination) {
    const std::vector<Combination> all = every_combination();
    // Not causal: 2 offsets × 2 ALiBi × 3 RoPE × 3 head layouts = 36; causal: × 2 windows = 72. A
    // generator that lost a dimension fails here.
    BOOST_TEST(all.size() == 108u);
    double worst_pair = 0, worst_reference = 0;
    for (std::size_t n = 0; n < all.size(); ++n) {
        const Combination& c = all[n];
        BOOST_TEST_CONTEXT(c.name()) {
            const Drawn in = draw(c, 1000 + n);
            const Run composed = run(in, c.options(AttentionKernel::composed));
            const Run fused = run(in, c.options(AttentionKernel::fused));
            for (std::size_t x = 0; x < composed.size(); ++x) {
                const double e = max_mixed_error(fused[x], composed[x]);
                worst_pair = std::max(worst_pair, e);
                BOOST_TEST(e <= agree, run_names[x] << ": fused against composed " << e);
            }
            const Tensor<double> Y = reference(c, in.Xq, in.Xkv, in.W);
            for (const Run* r : {&composed, &fused}) {
                const double e = max_mixed_error((*r)[0], Y);
                worst_reference = std::max(worst_reference, e);
                BOOST_TEST(e <= agree, (r == &fused ? "fused" : "composed") << " Y against the reference " << e);
            }
        }
    }
    BOOST_TEST_MESSAGE(fmt::format("{} combinations: fused vs composed (Y and 6 gradients) {:.3g}, vs the loop "
                                   "reference (Y) {:.3g}",
                                   all.size(), worst_pair, worst_reference));
}

// The comparisons above can fail, for the faults they exist to catch: the fused kernel given
// offset 0 for a non-causal ALiBi block at offset 2 (the bug AttentionPattern removed: it differed
// from the composed kernel by 7e-3), and the reference's own controls, each on a combination where
// it matters: the faulty reference misses the library by more than 1e-3, the exact one agrees.
BOOST_AUTO_TEST_CASE(the_comparisons_see_the_faults_they_exist_for) {
    const Combination alibi{.causal = false, .offset = 2, .alibi = true, .H = 2, .H_kv = 2};
    const Drawn in = draw(alibi, 7);
    const Run composed = run(in, alibi.options(AttentionKernel::composed));
    MultiHeadOptions offset_dropped = alibi.options(AttentionKernel::fused);
    offset_dropped.query_offset = 0;
    BOOST_TEST(max_mixed_error(run(in, offset_dropped)[0], composed[0]) > 1e-3);

    const RopeSettings rope{.base = 500, .pairing = RopePairing::interleaved};
    const std::pair<Fault, Combination> controls[] = {
        {Fault::heads_grouped_by_modulo, {.H = 4, .H_kv = 2}},
        {Fault::query_positions_one_later, {.causal = false, .offset = 2, .rope = rope}},
        {Fault::queries_paired_the_other_way, {.offset = 2, .rope = rope}},
        {Fault::alibi_at_the_row_index, {.causal = false, .offset = 2, .alibi = true}},
    };
    for (const auto& [fault, c] : controls) {
        BOOST_TEST_CONTEXT("fault " << int(fault) << ", " << c.name()) {
            const Drawn x = draw(c, 8 + int(fault));
            for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
                const Tensor<double> Y = run(x, c.options(kernel))[0];
                BOOST_TEST(max_mixed_error(Y, reference(c, x.Xq, x.Xkv, x.W)) <= agree);
                BOOST_TEST(max_mixed_error(Y, reference(c, x.Xq, x.Xkv, x.W, {}, fault)) > 1e-3);
            }
        }
    }
}

// A key/value cache: two blocks of self-attention, the second at offset 3 over the cached keys,
// through both kernels and every combination of causality, ALiBi, the window and RoPE's pairing
// (grouped heads, H = 4 over H_kv = 2): each block's Y equals the reference's for its queries over
// every key so far, and the kernels agree on the second block's gradients.
BOOST_AUTO_TEST_CASE(a_key_value_cache_agrees_on_both_kernels_and_with_the_reference) {
    std::size_t cases = 0;
    for (const Combination& base : every_combination()) {
        if (base.offset != 0 || base.H != 4 || base.H_kv != 2) continue;
        BOOST_TEST_CONTEXT(base.name()) {
            std::mt19937_64 rng(500 + cases++);
            const std::size_t first = 3, second = 3;
            const Tensor<double> X = random_tensor(Shape{B, first + second, D}, rng);
            const std::array<Tensor<double>, 4> W{random_tensor(Shape{D, base.H * dh}, rng),
                                                  random_tensor(Shape{D, base.H_kv * dh}, rng),
                                                  random_tensor(Shape{D, base.H_kv * dv}, rng),
                                                  random_tensor(Shape{base.H * dv, D_out}, rng)};
            const auto rows = [&](std::size_t begin, std::size_t end) {
                Tensor<double> part(Shape{B, end - begin, D});
                for (std::size_t b = 0; b < B; ++b)
                    for (std::size_t t = begin; t < end; ++t)
                        for (std::size_t e = 0; e < D; ++e) part.at({b, t - begin, e}) = X.at({b, t, e});
                return part;
            };
            std::array<Run, 2> second_block;
            for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
                KeyValueCache<double> cache;
                Tape<double> tape;
                const MultiHeadWeights<double> w{tape.leaf(W[0]), tape.leaf(W[1]), tape.leaf(W[2]), tape.leaf(W[3])};
                MultiHeadOptions options = base.options(kernel);
                const Var<double> X1 = tape.leaf(rows(0, first));
                const Tensor<double> Y1 = multihead_attention(X1, w, options, &cache).Y.value();
                BOOST_TEST(max_mixed_error(Y1, reference(base, rows(0, first), rows(0, first), W)) <= agree);
                options.query_offset = first;
                const Var<double> X2 = tape.leaf(rows(first, first + second));
                const Var<double> Y2 = multihead_attention(X2, w, options, &cache).Y;
                Combination at_second = base;
                at_second.offset = first;
                BOOST_TEST(max_mixed_error(Y2.value(), reference(at_second, rows(first, first + second),
                                                                 rows(0, first + second), W)) <= agree);
                tape.backward(sum(Y2));
                second_block[kernel == AttentionKernel::fused] = {Y2.value(), X2.grad(), X1.grad(), w.W_Q.grad(),
                                                                  w.W_K.grad(), w.W_V.grad(), w.W_O.grad()};
            }
            for (std::size_t x = 0; x < run_names.size(); ++x) {
                BOOST_TEST(max_mixed_error(second_block[1][x], second_block[0][x]) <= agree, run_names[x]);
            }
        }
    }
    BOOST_TEST(cases == 18u);  // not causal: 2 ALiBi × 3 RoPE; causal: × 2 windows
}

// Padding is the composed kernel's alone: with ALiBi (and RoPE) at an offset, padded keys are never
// seen and padded query rows are zero, as the reference says; the fused kernel refuses lengths.
BOOST_AUTO_TEST_CASE(padding_with_alibi_and_rope_matches_the_reference_and_the_fused_kernel_refuses_it) {
    for (const bool causal : {false, true}) {
        const Combination c{.causal = causal, .offset = 2, .alibi = true, .rope = RopeSettings{.base = 500}, .H = 4,
                            .H_kv = 2};
        BOOST_TEST_CONTEXT(c.name()) {
            const Drawn in = draw(c, 11 + causal);
            const std::vector<std::size_t> lengths{Tk, 4};  // the second sequence's queries 2, 3 real, 4, 5 padded
            MultiHeadOptions options = c.options(AttentionKernel::composed);
            options.lengths = lengths;
            const Run composed = run(in, options);
            BOOST_TEST(max_mixed_error(composed[0], reference(c, in.Xq, in.Xkv, in.W, lengths)) <= agree);
            options.kernel = AttentionKernel::fused;
            BOOST_TEST(testing::message_of<usage_error>([&] { (void)run(in, options); }).find("padding (lengths) needs") !=
                       std::string::npos);
        }
    }
}

// AttentionPattern is what both kernels read: its mask and bias at every row and key, against the
// rules written out (causal, offset, window, ALiBi at the absolute position, causal or not).
BOOST_AUTO_TEST_CASE(the_pattern_s_mask_and_bias_are_its_rules_at_every_position) {
    for (const bool causal : {false, true})
        for (const std::size_t offset : {0, 1, 3})
            for (const std::size_t window : {0, 1, 2, 9}) {
                if (window != 0 && !causal) continue;
                const AttentionPattern pattern{.causal = causal, .query_offset = offset, .window = window, .alibi_heads = 2};
                const std::size_t tq = 3, tk = offset + tq + 1;
                const Tensor<double> M = pattern.mask(tq, tk), bias = pattern.bias(tq, tk);
                for (std::size_t i = 0; i < tq; ++i)
                    for (std::size_t j = 0; j < tk; ++j) {
                        const std::size_t p = offset + i;
                        const bool seen = (!causal || j <= p) && (window == 0 || p < j + window);
                        BOOST_TEST(M(i, j) == (seen ? 1.0 : 0.0), "row " << i << " key " << j);
                        for (std::size_t h = 0; h < 2; ++h) {
                            const double m = h == 0 ? 1.0 / 16 : 1.0 / 256;  // 2^(−8(h+1)/2)
                            BOOST_TEST(bias[(h * tq + i) * tk + j] == -m * std::abs(double(p) - double(j)));
                        }
                    }
            }
}
