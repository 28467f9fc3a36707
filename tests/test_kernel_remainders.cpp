// Every compiled kernel (autodiff/cpu.hpp's EngineKernels, ops/fast/kernels.hpp's OpKernels) held
// to a long-double reference at every CPU level, float and double, over row lengths that cover
// every remainder of every vector width the levels use (2 and 4 lanes in SSE2, 4 and 8 in AVX2, 8
// and 16 in AVX-512; the exp kernels' blocks of 64 with their 16-wide tails): 1 to 40, and 47–49,
// 63–65, 127–130. A level whose tail loop drops, repeats or misplaces an element gives errors of
// order one there, far past the bounds below; every position of a row is compared (fault control:
// a softmax row wrong only in lane n − 2 is rejected at every level). tests/test_cpu_levels.cpp
// holds the same kernels at one length each, with the attention they make up.
#define BOOST_TEST_MODULE kernel_remainders
#include "support.hpp"
#include "tally.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace tapegrad;

namespace {

std::vector<std::size_t> row_lengths() {
    std::vector<std::size_t> lengths;
    for (std::size_t n = 1; n <= 40; ++n) lengths.push_back(n);
    for (const std::size_t n : {47u, 48u, 49u, 63u, 64u, 65u, 127u, 128u, 129u, 130u}) lengths.push_back(n);
    return lengths;
}

using testing::Tally;

using Long = long double;

template <class T>
std::vector<T> draws(std::size_t n, double spread, std::mt19937_64& rng) {
    const Tensor<double> t = testing::random_tensor({n}, rng, spread);
    return std::vector<T>(t.data().begin(), t.data().end());
}

// Bounds, with u the unit roundoff of T. Each is an error analysis of the kernel's formula with
// room for the implementation's own functions (Eigen's exp and tanh are within a few ulps); a
// dropped, repeated or misplaced element misses by the size of an element, ≥ 1e-3 here.
template <class T>
constexpr Long u = std::numeric_limits<T>::epsilon() / 2;

// softmax_row: n exps (≤ 4u each, relative) and sums of n terms (≤ n·u): a weight within
// (n + 8)·u of its value; a hidden position's (−inf) exactly 0. Returns the weights.
template <class T>
std::vector<T> checked_softmax_row(const OpKernels<T>& k, const std::vector<T>& scores, Tally& tally) {
    const std::size_t n = scores.size();
    T row_max = -std::numeric_limits<T>::infinity();
    for (const T s : scores) row_max = std::max(row_max, s);
    std::vector<T> weights(n);
    k.softmax_row(scores.data(), n, row_max, weights.data());
    std::vector<Long> reference(n);
    Long total = 0;
    for (std::size_t j = 0; j < n; ++j) total += reference[j] = std::exp(Long(scores[j]) - Long(row_max));
    const Long bound = Long(n + 8) * u<T>;
    for (std::size_t j = 0; j < n; ++j) {
        reference[j] /= total;
        const Long error = std::abs(Long(weights[j]) - reference[j]);
        tally.expect(reference[j] == 0 ? weights[j] == 0 : error <= bound * reference[j],
                     fmt::format("softmax_row n={} at {}: {} vs {}", n, j, double(weights[j]), double(reference[j])));
    }
    return weights;
}

// softmax_row on a row with every position visible, so every lane's weight is compared (a hidden
// position's weight is 0 whatever its lane computed: hiding one in every row hid that lane), then
// on the same scores with position n − 2 hidden (in the tail), which must get exactly 0 and the
// others their weights without it. softmax_vjp_row on the visible row's weights: dS_k =
// w_k·(g_k − Σ g_j w_j) within (n + 8)·u of w_k·(|g_k| + Σ |g_j| w_j).
template <class T>
void softmax_rows(const OpKernels<T>& k, std::size_t n, std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> scores = draws<T>(n, 6.0, rng);
    const std::vector<T> weights = checked_softmax_row(k, scores, tally);
    if (n > 3) {
        std::vector<T> hidden = scores;
        hidden[n - 2] = -std::numeric_limits<T>::infinity();
        checked_softmax_row(k, hidden, tally);
    }
    const Long bound = Long(n + 8) * u<T>;
    const std::vector<T> upstream = draws<T>(n, 2.0, rng);
    std::vector<T> dS(n);
    k.softmax_vjp_row(weights.data(), upstream.data(), n, dS.data());
    Long mean = 0, magnitude = 0;
    for (std::size_t j = 0; j < n; ++j) {
        mean += Long(upstream[j]) * Long(weights[j]);
        magnitude += std::abs(Long(upstream[j])) * Long(weights[j]);
    }
    for (std::size_t j = 0; j < n; ++j) {
        const Long expected = Long(weights[j]) * (Long(upstream[j]) - mean);
        const Long scale = Long(weights[j]) * (std::abs(Long(upstream[j])) + magnitude);
        tally.expect(std::abs(Long(dS[j]) - expected) <= bound * scale,
                     fmt::format("softmax_vjp_row n={} at {}: {} vs {}", n, j, double(dS[j]), double(expected)));
    }
}

// exp_shifted: x − shift rounded (relative u of |x − shift|, which exp turns into |x − shift|·u)
// and exp itself (≤ 4u): within (|x − shift| + 4)·u relative. scale_row: one product, exact to
// rounding, so bitwise equal to c·x in T; and it reports finiteness.
template <class T>
void elementwise_rows(const OpKernels<T>& k, std::size_t n, std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> x = draws<T>(n, 8.0, rng);
    const T shift = T(1.5);
    std::vector<T> y = x;
    k.exp_shifted(y.data(), n, shift);
    for (std::size_t j = 0; j < n; ++j) {
        const Long reference = std::exp(Long(x[j]) - Long(shift));
        const Long bound = (std::abs(Long(x[j]) - Long(shift)) + 4) * u<T> * reference;
        tally.expect(std::abs(Long(y[j]) - reference) <= bound,
                     fmt::format("exp_shifted n={} at {}: {} vs {}", n, j, double(y[j]), double(reference)));
    }
    std::vector<T> scaled = x;
    const T c = T(0.375);
    const bool finite = k.scale_row(scaled.data(), n, c);
    tally.expect(finite, fmt::format("scale_row n={}: finite values reported as not finite", n));
    for (std::size_t j = 0; j < n; ++j) {
        tally.expect(scaled[j] == T(c * x[j]), fmt::format("scale_row n={} at {}", n, j));
    }
    std::vector<T> overflowing = x;
    overflowing[n - 1] = std::numeric_limits<T>::max();  // the last element, in the tail when there is one
    tally.expect(!k.scale_row(overflowing.data(), n, T(4)),
                 fmt::format("scale_row n={}: overflow at the end missed", n));
}

// max_of: exact (a comparison rounds nothing), NaN at any position, the last included, gives NaN.
// sum_of: n terms in any order, within γ_n·Σ|x| (γ_n = n·u/(1 − n·u)).
template <class T>
void reductions(const OpKernels<T>& k, std::size_t n, std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> x = draws<T>(n, 3.0, rng);
    T expected_max = x[0];
    Long total = 0, magnitude = 0;
    for (const T v : x) {
        expected_max = std::max(expected_max, v);
        total += v;
        magnitude += std::abs(Long(v));
    }
    tally.expect(k.max_of(x.data(), n) == expected_max, fmt::format("max_of n={}", n));
    const T sum = k.sum_of(x.data(), n);
    const Long gamma = Long(n) * u<T> / (1 - Long(n) * u<T>);
    tally.expect(std::abs(Long(sum) - total) <= gamma * magnitude,
                 fmt::format("sum_of n={}: {} vs {}", n, double(sum), double(total)));
    for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        std::vector<T> with_nan = x;
        with_nan[at] = std::numeric_limits<T>::quiet_NaN();
        tally.expect(std::isnan(k.max_of(with_nan.data(), n)), fmt::format("max_of n={}: NaN at {} missed", n, at));
    }
}

// score_gradient_row: p_k = c·(p_k·(dp_k − mean)), three roundings: within 3u of
// |c|·|p_k|·|dp_k − mean| plus u of |c|·|p_k|·(|dp_k| + |mean|) for the subtraction.
template <class T>
void score_gradients(const OpKernels<T>& k, std::size_t n, std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> p = draws<T>(n, 1.0, rng), dp = draws<T>(n, 2.0, rng);
    const T mean = T(0.3), c = T(-0.7);
    std::vector<T> out = p;
    k.score_gradient_row(out.data(), dp.data(), n, mean, c);
    for (std::size_t j = 0; j < n; ++j) {
        const Long expected = Long(c) * Long(p[j]) * (Long(dp[j]) - Long(mean));
        const Long scale = std::abs(Long(c) * Long(p[j])) * (std::abs(Long(dp[j])) + std::abs(Long(mean)));
        tally.expect(std::abs(Long(out[j]) - expected) <= 4 * u<T> * scale,
                     fmt::format("score_gradient_row n={} at {}: {} vs {}", n, j, double(out[j]), double(expected)));
    }
}

// GELU's tanh form: y = a·s, s = (1 + tanh(z))/2, z = √(2/π)(a + 0.044715a³). Each of z, tanh, s
// carries a few u (absolute in s, which lies in (0, 1)), so |y − ref| ≤ 32u·(1 + |a|); the VJP's
// slope s + a·2s(1 − s)·√(2/π)(1 + 3·0.044715a²)/… has terms up to |a|³ in size: ≤ 64u·|g|·(1 + |a|³).
template <class T>
void gelu_rows(const OpKernels<T>& k, std::size_t n, std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> a = draws<T>(n, 4.0, rng), g = draws<T>(n, 1.0, rng);
    std::vector<T> y(n), da(n);
    k.gelu_tanh(a.data(), n, y.data());
    k.gelu_tanh_vjp(a.data(), g.data(), n, da.data());
    const Long c = std::sqrt(Long(2) / std::acos(Long(-1))), kappa = Long(0.044715);
    for (std::size_t j = 0; j < n; ++j) {
        const Long x = a[j], z = c * (x + kappa * x * x * x), t = std::tanh(z), s = (1 + t) / 2;
        const Long value = x * s;
        const Long slope = s + x * (1 - t * t) / 2 * c * (1 + 3 * kappa * x * x);
        tally.expect(std::abs(Long(y[j]) - value) <= 32 * u<T> * (1 + std::abs(x)),
                     fmt::format("gelu_tanh n={} at {}: {} vs {}", n, j, double(y[j]), double(value)));
        tally.expect(
            std::abs(Long(da[j]) - Long(g[j]) * slope) <= 64 * u<T> * std::abs(Long(g[j])) * (1 + std::abs(x * x * x)),
            fmt::format("gelu_tanh_vjp n={} at {}: {} vs {}", n, j, double(da[j]), double(Long(g[j]) * slope)));
    }
}

// silu: y = a·σ(a), σ from e = e^(−|a|) (one exp of a few u, a division or two): |y − ref| ≤
// 16u·|a| since σ ∈ (0, 1); the slope σ + a·σ' has terms up to about 0.3·|a|·... each within a few
// u relative: ≤ 32u·|g|·(1 + |a|). Inputs over ±12 reach both tails of σ.
template <class T>
void silu_rows(const OpKernels<T>& k, std::size_t n, std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> a = draws<T>(n, 12.0, rng), g = draws<T>(n, 1.0, rng);
    std::vector<T> y(n), da(n);
    k.silu(a.data(), n, y.data());
    k.silu_vjp(a.data(), g.data(), n, da.data());
    for (std::size_t j = 0; j < n; ++j) {
        const Long x = a[j], sigma = 1 / (1 + std::exp(-x)), value = x * sigma;
        const Long slope = sigma + x * sigma * (1 - sigma);
        tally.expect(std::abs(Long(y[j]) - value) <= 16 * u<T> * std::abs(x),
                     fmt::format("silu n={} at {}: {} vs {}", n, j, double(y[j]), double(value)));
        tally.expect(std::abs(Long(da[j]) - Long(g[j]) * slope) <= 32 * u<T> * std::abs(Long(g[j])) * (1 + std::abs(x)),
                     fmt::format("silu_vjp n={} at {}: {} vs {}", n, j, double(da[j]), double(Long(g[j]) * slope)));
    }
}

template <class T>
Tally check_op_kernels(const OpKernels<T>& kernels, std::uint64_t seed) {
    Tally tally;
    std::mt19937_64 rng(seed);
    for (const std::size_t n : row_lengths()) {
        softmax_rows(kernels, n, rng, tally);
        elementwise_rows(kernels, n, rng, tally);
        reductions(kernels, n, rng, tally);
        score_gradients(kernels, n, rng, tally);
        gelu_rows(kernels, n, rng, tally);
        silu_rows(kernels, n, rng, tally);
    }
    return tally;
}

// The engine's kernels: the NaN scan finds a NaN at every position (the tail's included) and none
// in a clean row; the dual planes are exact copies; and the products' blocks, with each of m, n, k
// over the lengths, within the classical bound γ_k·(|A|·|B|) of the long-double product
// (γ_k = k·u/(1 − k·u), whatever the order or FMA), the rows and columns outside the block untouched.
template <class T>
void scans_and_planes(const EngineKernels<T>& k, std::size_t n, Tally& tally) {
    std::vector<T> x(n, T(0.5));
    tally.expect(!k.any_nan(x.data(), n), fmt::format("any_nan n={}: NaN reported in a clean row", n));
    for (std::size_t at = 0; at < n; ++at) {
        x[at] = std::numeric_limits<T>::quiet_NaN();
        tally.expect(k.any_nan(x.data(), n), fmt::format("any_nan n={}: NaN at {} missed", n, at));
        x[at] = T(0.5);
    }
    std::vector<T> pairs(2 * n), first(n), second(n), merged(2 * n, T(-1));
    for (std::size_t j = 0; j < 2 * n; ++j) pairs[j] = T(j) + T(0.25);
    k.deinterleave(pairs.data(), n, first.data(), second.data());
    k.interleave(first.data(), second.data(), n, merged.data(), false);
    for (std::size_t j = 0; j < n; ++j) {
        tally.expect(first[j] == pairs[2 * j] && second[j] == pairs[2 * j + 1],
                     fmt::format("deinterleave n={} at {}", n, j));
    }
    tally.expect(merged == pairs, fmt::format("interleave n={}", n));
}

template <class T>
void product_block(const EngineKernels<T>& kernel, kernels::Form form, std::size_t m, std::size_t n, std::size_t k,
                   std::mt19937_64& rng, Tally& tally) {
    const std::vector<T> A = draws<T>(m * k, 1.0, rng), B = draws<T>(k * n, 1.0, rng);
    // Leave a row and a column on each side where there are more than two.
    const kernels::Block block{m > 2 ? 1u : 0u, m > 2 ? m - 2 : m, n > 2 ? 1u : 0u, n > 2 ? n - 2 : n};
    std::vector<T> C(m * n, T(7));
    kernel.gemm_block(form, m, n, k, A.data(), B.data(), C.data(), false, block);
    const Long gamma = Long(k) * u<T> / (1 - Long(k) * u<T>);
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
            const bool inside = i >= block.first_row && i < block.first_row + block.rows && j >= block.first_col &&
                                j < block.first_col + block.cols;
            Long exact = 0, magnitude = 0;
            for (std::size_t p = 0; p < k; ++p) {
                const Long a = form == kernels::Form::aTb ? A[p * m + i] : A[i * k + p];
                const Long b = form == kernels::Form::abT ? B[j * k + p] : B[p * n + j];
                exact += a * b;
                magnitude += std::abs(a * b);
            }
            const bool ok = inside ? std::abs(Long(C[i * n + j]) - exact) <= gamma * magnitude : C[i * n + j] == T(7);
            tally.expect(ok, fmt::format("gemm_block form {} m={} n={} k={} at ({}, {})", int(form), m, n, k, i, j));
        }
}

template <class T>
Tally check_engine_kernels(const EngineKernels<T>& kernels, std::uint64_t seed) {
    Tally tally;
    std::mt19937_64 rng(seed);
    for (const std::size_t n : row_lengths()) scans_and_planes(kernels, n, tally);
    // Each dimension over the lengths up to 40 (and 65, 130) with the other two fixed at sizes that
    // take the blocked path (k + rows + n ≥ 20); each length also once below it (plain loops).
    for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
        for (const std::size_t length : row_lengths()) {
            if (length > 40 && length != 65 && length != 130) continue;
            product_block(kernels, form, length, 9, 13, rng, tally);
            product_block(kernels, form, 6, length, 13, rng, tally);
            product_block(kernels, form, 6, 9, length, rng, tally);
            product_block(kernels, form, 3, 2, std::min<std::size_t>(length, 12), rng, tally);
        }
    }
    return tally;
}

template <class T>
void check_every_level(const char* type) {
    const testing::RestoreCpuLevel restore;
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        const Tally ops = check_op_kernels(op_kernels<T>(), 41);
        const Tally engine = check_engine_kernels(engine_kernels<T>(), 42);
        BOOST_TEST_MESSAGE(fmt::format("{} {}: {} op-kernel and {} engine-kernel comparisons", cpu_level_name(level),
                                       type, ops.comparisons, engine.comparisons));
        BOOST_TEST(ops.failures == 0u, cpu_level_name(level) << " " << type << " op kernels: " << ops.summary());
        BOOST_TEST(engine.failures == 0u, cpu_level_name(level)
                                              << " " << type << " engine kernels: " << engine.summary());
    }
}

// Fault controls: the active level's kernels with one entry replaced by a variant whose tail is
// wrong. A sum that drops the elements past the last multiple of 4, and a GEMM block that
// leaves its last column unwritten when its width is odd: both must fail here, at the lengths with such a
// remainder, while the correct kernels pass the same comparisons.
template <class T>
T sum_dropping_the_tail(const T* x, std::size_t n) {
    return n < 4 ? op_kernels<T>().sum_of(x, n) : op_kernels<T>().sum_of(x, n - n % 4);
}

template <class T>
void gemm_block_missing_the_last_odd_column(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const T* A,
                                            const T* B, T* C, bool accumulate, kernels::Block block) {
    std::vector<T> kept(C, C + m * n);
    engine_kernels<T>().gemm_block(form, m, n, k, A, B, C, accumulate, block);
    const std::size_t last = block.first_col + block.cols - 1;
    if (block.cols % 2 == 1 && block.cols > 1)
        for (std::size_t i = block.first_row; i < block.first_row + block.rows; ++i)
            C[i * n + last] = kept[i * n + last];
}

// A softmax row wrong only in lane n − 2 (twice its weight) when n ≡ 3 (mod 4), as an AVX2
// remainder loop that mishandles the middle one of three leftover lanes would be: the active
// level's kernel, then that lane spoilt unless its position is hidden (the kernel zeroes hidden
// positions after its exps, so a hidden position hides whatever its lane computed).
template <class T>
void softmax_row_wrong_in_lane_n_minus_2(const T* scores, std::size_t n, T row_max, T* weights) {
    op_kernels<T>().softmax_row(scores, n, row_max, weights);
    if (n % 4 == 3 && scores[n - 2] != -std::numeric_limits<T>::infinity()) weights[n - 2] *= T(2);
}

// At every level: the variant fails exactly one comparison per row length ≡ 3 (mod 4), the visible
// row's lane n − 2, while the level's own kernel passes the same comparisons.
template <class T>
void wrong_lane_rejected_at_every_level(const char* type) {
    const testing::RestoreCpuLevel restore;
    const std::vector<std::size_t> lengths = row_lengths();
    const auto faulty_rows =
        std::size_t(std::count_if(lengths.begin(), lengths.end(), [](std::size_t n) { return n % 4 == 3; }));
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        OpKernels<T> broken = op_kernels<T>();
        broken.softmax_row = &softmax_row_wrong_in_lane_n_minus_2<T>;
        const Tally bad = check_op_kernels(broken, 41);
        BOOST_TEST_MESSAGE(cpu_level_name(level)
                           << " " << type << " softmax_row wrong in lane n - 2: " << bad.summary());
        BOOST_TEST(bad.failures == faulty_rows, cpu_level_name(level) << " " << type << ": " << bad.summary());
        BOOST_TEST(check_op_kernels(op_kernels<T>(), 41).failures == 0u);
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_kernel_agrees_at_every_remainder_and_level_double) { check_every_level<double>("double"); }

BOOST_AUTO_TEST_CASE(every_kernel_agrees_at_every_remainder_and_level_float) { check_every_level<float>("float"); }

BOOST_AUTO_TEST_CASE(a_kernel_whose_remainder_drops_a_term_is_rejected) {
    OpKernels<double> broken = op_kernels<double>();
    broken.sum_of = &sum_dropping_the_tail<double>;
    const Tally bad = check_op_kernels(broken, 41);
    BOOST_TEST_MESSAGE("sum_of dropping the tail: " << bad.summary());
    BOOST_TEST(bad.failures > 0u);
    BOOST_TEST(check_op_kernels(op_kernels<double>(), 41).failures == 0u);

    EngineKernels<float> broken_engine = engine_kernels<float>();
    broken_engine.gemm_block = &gemm_block_missing_the_last_odd_column<float>;
    const Tally bad_engine = check_engine_kernels(broken_engine, 42);
    BOOST_TEST_MESSAGE("gemm_block missing the last odd column: " << bad_engine.summary());
    BOOST_TEST(bad_engine.failures > 0u);
}

BOOST_AUTO_TEST_CASE(a_softmax_row_wrong_only_in_lane_n_minus_2_is_rejected_at_every_level) {
    wrong_lane_rejected_at_every_level<double>("double");
    wrong_lane_rejected_at_every_level<float>("float");
}
