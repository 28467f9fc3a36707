// The compiled elementwise and row kernels (autodiff/cpu.hpp's EngineKernels, ops/fast/kernels.hpp's
// OpKernels) fed the inputs ordinary draws never give them: negative and positive values, ±0,
// float and double subnormals, tiny normals, huge values (where exp overflows, where a² and a³
// overflow, up to the largest finite), ±inf, and NaN with several payloads (quiet and signalling bit
// patterns, sign bit set or not). Each special value sits at the first, a middle and the last
// position of rows of every length 1–33 and 47, 63, 64, 65, 129, 131 (every remainder of the 2-,
// 4-, 8- and 16-lane loops and of the 16-element tail blocks of the exp kernels, and rows of one, two
// and three 64-element blocks), in a background of ordinary values of both signs; rows made of
// special values only put them side by side in every kind of lane.
// Every output element is compared with a scalar reference written here from the kernel's formula,
// in long double (whose exponent range holds a³ of the largest double, so huge inputs get their true
// value): NaN exactly where the formula gives NaN, infinities and the sign of zero exactly where the
// formula determines them, finite values within a bound whose derivation stands beside it. The bfloat16
// rounding is compared bit for bit with a round-to-nearest-even written from the definition. The
// promises the library documents for special inputs are held explicitly (the last test cases).
// Held at the active level: CTest reruns this file under TAPEGRAD_CPU=<level> for every level built
// in (tests/CMakeLists.txt), so each level's own code is held to the same references.
#define BOOST_TEST_MODULE kernel_special_values
#include "support.hpp"
#include "tally.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace tapegrad;

namespace {

using testing::Tally;
using Long = long double;

template <class T>
using Bits = std::conditional_t<std::is_same_v<T, float>, std::uint32_t, std::uint64_t>;

template <class T>
Bits<T> bits_of(T x) {
    return std::bit_cast<Bits<T>>(x);
}

template <class T>
bool same_bits(T a, T b) {
    return bits_of(a) == bits_of(b);
}

template <class T>
std::string describe(T x) {
    return fmt::format("{} ({:#x})", x, bits_of(x));
}

// u, T's unit roundoff; the smallest normal; the largest finite.
template <class T>
constexpr Long u = std::numeric_limits<T>::epsilon() / 2;
template <class T>
constexpr Long min_normal = std::numeric_limits<T>::min();
template <class T>
constexpr Long max_finite = std::numeric_limits<T>::max();
// One rounding of a result that lands among the subnormals is off by up to half the smallest
// subnormal, absolute (gradual underflow: fl(x) = x·(1 + δ) + η, |δ| ≤ u, |η| ≤ denorm_min/2).
template <class T>
constexpr Long underflow = Long(std::numeric_limits<T>::denorm_min()) / 2;

// factor·magnitude, 0 when magnitude is 0 (a relative bound on an exact zero is zero, even where the
// factor grew without limit: |x − shift| at x = −inf).
Long times(Long factor, Long magnitude) { return magnitude == 0 ? Long(0) : factor * magnitude; }

// ---- the inputs --------------------------------------------------------------------------------

// NaN bit patterns: quiet (payload 0 and not), signalling (quiet bit clear, payload in the lowest bit
// and in the highest payload bit), all ones, each sign. A kernel that tests only the quiet bit, drops
// the sign bit or lets the rounding carry run through a NaN's payload gets one of them wrong.
template <class T>
std::vector<T> nan_patterns() {
    std::vector<Bits<T>> bits;
    if constexpr (std::is_same_v<T, float>) {
        bits = {0x7fc00000u, 0x7fc12345u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu, 0xffc00000u, 0xff800001u, 0xffd55555u};
    } else {
        bits = {0x7ff8000000000000u, 0x7ff8000000012345u, 0x7ff0000000000001u, 0x7ff4000000000000u,
                0x7fffffffffffffffu, 0xfff8000000000000u, 0xfff0000000000001u, 0xfffaaaaaaaaaaaaau};
    }
    std::vector<T> nans;
    for (const Bits<T> b : bits) nans.push_back(std::bit_cast<T>(b));
    return nans;
}

// Finite magnitudes, from the smallest subnormal to the largest finite: subnormals (smallest, three
// times it, the middle one, the largest), the smallest normal, tiny normals, ordinary values, then
// the edges of the kernels' arithmetic: GELU's e^{−2u} leaving the finite range (|a| ≈ 10.4 in float,
// 21.5 in double), σ saturating (17, 30, 40), exp overflowing and underflowing (88.75, 709.875,
// 745.25), a³ and a² overflowing (7e12 and 2e19 in float, 6e102 and 2e154 in double), and beyond.
template <class T>
std::vector<T> finite_magnitudes() {
    using L = std::numeric_limits<T>;
    std::vector<T> m{L::denorm_min(),
                     T(3) * L::denorm_min(),
                     L::min() / T(2),
                     L::min() - L::denorm_min(),
                     L::min(),
                     L::epsilon(),
                     T(0.5),
                     T(1),
                     T(3),
                     T(10.375),
                     T(17),
                     T(30),
                     T(88.75),
                     T(1e4),
                     L::max() / T(2),
                     L::max()};
    if constexpr (std::is_same_v<T, float>) {
        for (const float v : {1e-30f, 100.0f, 7e12f, 2e19f, 1e30f}) m.push_back(v);
    } else {
        for (const double v : {1e-300, 21.5, 40.0, 709.875, 745.25, 6e102, 2e154, 1e200}) m.push_back(v);
    }
    return m;
}

// Every special value: ± each finite magnitude, ±0, ±inf, and the NaN patterns.
template <class T>
std::vector<T> special_values() {
    std::vector<T> values;
    for (const T m : finite_magnitudes<T>()) {
        values.push_back(m);
        values.push_back(-m);
    }
    for (const T v : {T(0), T(-0.0), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
        values.push_back(v);
    }
    for (const T v : nan_patterns<T>()) values.push_back(v);
    return values;
}

// Softmax weights and fused attention's probabilities lie in [0, 1] (or are NaN, from a NaN row):
// the special values of that domain.
template <class T>
std::vector<T> probability_values() {
    using L = std::numeric_limits<T>;
    std::vector<T> values{T(0),     L::denorm_min(), L::min() / T(2), L::min() - L::denorm_min(),
                          L::min(), L::epsilon(),    T(0.5),          T(1)};
    for (const T v : nan_patterns<T>()) values.push_back(v);
    return values;
}

std::vector<std::size_t> row_lengths() {
    std::vector<std::size_t> lengths;
    for (std::size_t n = 1; n <= 33; ++n) lengths.push_back(n);
    for (const std::size_t n : {47u, 63u, 64u, 65u, 129u, 131u}) lengths.push_back(n);
    return lengths;
}
constexpr std::size_t longest_row = 131;

// The first, a middle and the last position (fewer for the shortest rows).
std::vector<std::size_t> positions(std::size_t n) {
    std::vector<std::size_t> at{0};
    if (n / 2 != 0) at.push_back(n / 2);
    if (n - 1 != n / 2 && n > 1) at.push_back(n - 1);
    return at;
}

// Backgrounds of ordinary values, both signs: −5.25 to 5.25 in steps of 0.375 (a +0 among them), the
// upstream gradients −2.125 to 2.375 (never 0), and weights in (0, 0.41].
template <class T>
std::vector<T> mixed_values() {
    std::vector<T> v(longest_row);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = T((long((j * 37 + 11) % 29) - 14) * 0.375);
    return v;
}
template <class T>
std::vector<T> upstream_values() {
    std::vector<T> v(longest_row);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = T((long((j * 53 + 5) % 19) - 9) * 0.25 + 0.125);
    return v;
}
template <class T>
std::vector<T> weight_values() {
    std::vector<T> v(longest_row);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = T(double(1 + (j * 7) % 13) / 32);
    return v;
}

// check(row) for every length, position and special value: the background's first n values with the
// special value at the position (its bits checked there, so every NaN payload reaches the kernel).
template <class T, class Check>
void sweep(const std::vector<T>& specials, const std::vector<T>& background, Tally& tally, Check check) {
    for (const std::size_t n : row_lengths())
        for (const std::size_t at : positions(n))
            for (const T v : specials) {
                std::vector<T> row(background.begin(), background.begin() + long(n));
                row[at] = v;
                tally.expect(same_bits(row[at], v), "the harness changed a special value's bits");
                check(row);
            }
}

// Rows of special values only, one per length, the list rotated by 7n so that from one length to the
// next each value lands in other lanes, next to other special values.
template <class T, class Check>
void all_special_rows(const std::vector<T>& specials, Check check) {
    for (const std::size_t n : row_lengths()) {
        std::vector<T> row(n);
        for (std::size_t j = 0; j < n; ++j) row[j] = specials[(j + 7 * n) % specials.size()];
        check(row);
    }
}

// ---- the comparison ----------------------------------------------------------------------------

// Sign::exact where the result is a product whose factors' signs the formula fixes (then IEEE
// multiplication gives the sign even to a result that underflows to zero): gelu and silu values
// (a·s, s ≥ 0), exponentials and softmax weights (≥ 0), the score-gradient product, scale_row.
// Sign::free where the result is a sum or difference: IEEE 754 gives +0 to x + (−x) and to a sum of
// zeros of both signs whatever the exact value's sign, so a zero there may carry either sign (the
// derivatives σ + a·σ', s + term; sums; softmax's VJP w·(g − mean) with mean rounded).
enum class Sign { exact, free };

// `got` against the long-double reference: NaN exactly where the reference is NaN; the reference's
// infinity exactly; a finite reference within `bound`, or, where the reference (within its bound)
// reaches past T's largest finite, T's infinity of its sign (the correctly rounded overflow).
template <class T>
bool agrees(T got, Long ref, Long bound, Sign sign) {
    if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got);
    if (sign == Sign::exact && std::signbit(got) != std::signbit(ref)) return false;
    if (std::isinf(ref)) return Long(got) == ref;
    if (std::isinf(got)) return std::signbit(got) == std::signbit(ref) && std::abs(ref) + bound >= max_finite<T>;
    return std::abs(Long(got) - ref) <= bound;
}

// Tally::expect with the message written only when the comparison fails (millions pass).
template <class Message>
void expect(Tally& tally, bool ok, const Message& message) {
    tally.expect(ok, ok ? std::string() : message());
}

// What failed: the kernel, the row's length, the element, its inputs (described), what came, what should.
template <class T>
std::string mismatch(const char* kernel, std::size_t n, std::size_t j, const std::string& inputs, T got, Long ref) {
    return fmt::format("{} n={} at {}, {}: got {}, reference {}", kernel, n, j, inputs, describe(got), double(ref));
}

template <class T>
std::string inputs(const char* name, T x) {
    return fmt::format("{} {}", name, describe(x));
}
template <class T>
std::string inputs(const char* name, T x, const char* other, T y) {
    return fmt::format("{} {}, {} {}", name, describe(x), other, describe(y));
}

// ---- GELU's tanh form ----------------------------------------------------------------------------
// y = ½·a·(1 + tanh u), u = c·(a + k·a³), c = √(2/π), k = 0.044715 (ops/gelu.hpp), and
// dy/da = ½(1 + t) + ½·a·(1 − t²)·c·(1 + 3k·a²). With s = ½(1 + tanh u) = σ(2u) and s̄ = 1 − s = σ(−2u)
// (each written without the cancellation of 1 ± tanh u, which in long double would leave no digit of
// s below a ≈ −7): y = a·s, dy/da = s + term, term = a·2s·s̄·c·(1 + 3k·a²). At a = −inf (y) and ±inf
// (dy/da) the formula is ∞·0 = NaN, as the op's generic loop gives in every scalar type: the
// library promises nothing else there, and the tape's NaN check names the node.
struct GeluReference {
    Long u, s, s_bar, value, term, slope;
};

GeluReference gelu_reference(Long a) {
    const Long c = std::sqrt(2 / std::acos(Long(-1))), k = Long(0.044715);
    GeluReference r;
    r.u = c * (a + k * a * a * a);
    r.s = 1 / (1 + std::exp(-2 * r.u));
    r.s_bar = 1 / (1 + std::exp(2 * r.u));
    r.value = a * r.s;
    r.term = a * 2 * r.s * r.s_bar * c * (1 + 3 * k * a * a);
    r.slope = r.s + r.term;
    return r;
}

// Bounds. The kernel's u carries 7 roundings (c and k rounded to T, three products, a sum, the
// product by c): relative 7u, so e^{−2u} is off by a relative 14|u|·u (the exponent's absolute error)
// and Eigen's exp adds ≤ 2 ulps (4u). That relative error of e^{−2u} reaches s scaled by s̄ (s =
// 1/(1 + e^{−2u}): where s ≈ 1 it is damped by e^{−2u} ≈ s̄); 1 + e, the division and a·s add 3u.
// So y is within (14|u|·s̄ + 11)·u relative, taken as (16 + 16|u|·s̄)·u.
// Floor: where e^{−2u} passes T's largest finite (2|u| > 88.72 in float, 709.78 in double) it becomes
// inf and s exactly 0, while the true s lies below 1/max ≈ min_normal/4: |y| there is at most
// |a|·min_normal/4, with |a| ≤ 10.4 (float) or 21.5 (double) at that edge (beyond it y underflows
// anyway): ≤ 5.4·min_normal, taken as 8·min_normal. (Subnormal s rounds to denorm_min/2, far below.)
template <class T>
Long gelu_value_bound(const GeluReference& r) {
    return times((16 + 16 * std::abs(r.u) * r.s_bar) * u<T>, std::abs(r.value)) + 8 * min_normal<T>;
}

// dy/da: s and the term's factor s carry the same relative error as y, on |s| + |term| (the sum
// cancels near dy/da's zero, a ≈ −0.75). 1 − s, formed from a rounded s near 1, is off by ≤ 2u
// absolute where the true s̄ ≥ u/2, and is exactly 0 (off by s̄) below: the term is off by
// |term|·min(4, 2u/s̄) from it. Floor: at the edge above, s flushed to 0 drops s·(1 + 2|a|c(1 + 3k·a²))
// ≤ (min_normal/4)·(1 + 2·21.5·0.8·63) ≈ 541·min_normal (double; 65 in float): 1024·min_normal.
// The product by g, one rounding, adds u relative and `underflow` absolute.
template <class T>
Long gelu_slope_bound(const GeluReference& r) {
    const Long cancellation = r.s_bar == 0 ? Long(0) : std::min(Long(4), 2 * u<T> / r.s_bar);
    return times((16 + 16 * std::abs(r.u) * r.s_bar) * u<T>, std::abs(r.s) + std::abs(r.term)) +
           times(cancellation, std::abs(r.term)) + 1024 * min_normal<T>;
}

template <class T>
void check_gelu_row(const OpKernels<T>& k, const std::vector<T>& a, const std::vector<T>& g, Tally& tally) {
    const std::size_t n = a.size();
    std::vector<T> y(n), da(n);
    k.gelu_tanh(a.data(), n, y.data());
    k.gelu_tanh_vjp(a.data(), g.data(), n, da.data());
    for (std::size_t j = 0; j < n; ++j) {
        const GeluReference r = gelu_reference(a[j]);
        expect(tally, agrees(y[j], r.value, gelu_value_bound<T>(r), Sign::exact),
               [&] { return mismatch("gelu_tanh", n, j, inputs("a", a[j]), y[j], r.value); });
        const Long G = g[j], want = G * r.slope;
        const Long bound = times(gelu_slope_bound<T>(r), std::abs(G)) + times(u<T>, std::abs(want)) + underflow<T>;
        expect(tally, agrees(da[j], want, bound, Sign::free),
               [&] { return mismatch("gelu_tanh_vjp", n, j, inputs("a", a[j], "g", g[j]), da[j], want); });
    }
}

// ---- silu ---------------------------------------------------------------------------------------
// y = a·σ(a), dy/da = σ(a) + a·σ'(a), σ'(a) = σ(a)·σ(−a) (ops/silu.hpp), σ(a) = 1/(1 + e^{−a}) with no
// cancellation at either sign in long double. At a = −inf (y) and ±inf (dy/da) the formula is ∞·0.
// Bounds: the kernel takes e = (e^{−|a|/2})², the argument exact, two exps' 4u and the square: 9u;
// r = 1/(1 + e): 2u more; σ = r or e·r: ≤ 12u; y = a·σ: 13u, taken as 16u. σ' = e·r²: ≤ 15u, a·σ':
// 16u; σ + a·σ' cancels near a ≈ −1.28, so on |σ| + |a·σ'|: ≤ 17u, taken as 32u. Floor: e is
// subnormal for |a| in about [87, 104] (float) or [708, 745] (double), off by denorm_min/2, times
// |a| ≤ 745: far below 8·min_normal (which still rejects the −5e-305 that Eigen's exp clamp gave
// silu(−1e4) before e was squared, src/cpu/level_kernels.hpp). The product by g, as GELU's: u
// relative and `underflow` absolute.
struct SiluReference {
    Long sigma, slope_of_sigma, value, slope;
};

SiluReference silu_reference(Long a) {
    SiluReference r;
    r.sigma = 1 / (1 + std::exp(-a));
    r.slope_of_sigma = r.sigma / (1 + std::exp(a));
    r.value = a * r.sigma;
    r.slope = r.sigma + a * r.slope_of_sigma;
    return r;
}

template <class T>
void check_silu_row(const OpKernels<T>& k, const std::vector<T>& a, const std::vector<T>& g, Tally& tally) {
    const std::size_t n = a.size();
    std::vector<T> y(n), da(n);
    k.silu(a.data(), n, y.data());
    k.silu_vjp(a.data(), g.data(), n, da.data());
    for (std::size_t j = 0; j < n; ++j) {
        const SiluReference r = silu_reference(a[j]);
        expect(tally, agrees(y[j], r.value, times(16 * u<T>, std::abs(r.value)) + 8 * min_normal<T>, Sign::exact),
               [&] { return mismatch("silu", n, j, inputs("a", a[j]), y[j], r.value); });
        const Long G = g[j], want = G * r.slope;
        const Long magnitude = std::abs(r.sigma) + std::abs(Long(a[j]) * r.slope_of_sigma);
        const Long bound =
            times(32 * u<T> * magnitude + 8 * min_normal<T>, std::abs(G)) + times(u<T>, std::abs(want)) + underflow<T>;
        expect(tally, agrees(da[j], want, bound, Sign::free),
               [&] { return mismatch("silu_vjp", n, j, inputs("a", a[j], "g", g[j]), da[j], want); });
    }
}

// ---- softmax rows ---------------------------------------------------------------------------------
// weights_j = e^{s_j − m} / Σ_k e^{s_k − m} (OpKernels::softmax_row), −inf scores giving exactly +0.
// The op passes finite-or-−inf scores with m their finite maximum (it refuses NaN and +inf by index,
// and zeroes a fully hidden row itself, ops/softmax.hpp); outside that contract the formula still
// holds and is held: a NaN score makes Σ NaN and so every weight NaN (a NaN is never laundered into
// finite weights), and a +inf score makes m = +inf and e^{inf − inf} NaN.
// Bound: each numerator carries the rounding of x_k = s_k − m (relative |x_k|·u once exponentiated)
// and Eigen's exp (4u); the sum, in any order, (n − 1)·u; the division u: weight j within
// (n + 8 + |x_j| + X)·u relative, X = Σ_k e^{x_k}|x_k| / Σ_k e^{x_k}. Floor: Eigen's exp clamps its
// argument at −88.72 (float) or −709.78 (double) and returns at most min_normal/4 there instead of
// ≈ 0, divided by a sum ≥ 1 (the maximum's e^0): min_normal.
template <class T>
void check_softmax_row(const OpKernels<T>& k, const std::vector<T>& scores, Tally& tally) {
    const std::size_t n = scores.size();
    T row_max = -std::numeric_limits<T>::infinity();
    for (const T s : scores)
        if (s > row_max) row_max = s;  // the largest non-NaN score
    std::vector<T> weights(n);
    k.softmax_row(scores.data(), n, row_max, weights.data());
    std::vector<Long> numerator(n);
    Long total = 0, weighted_shift = 0;
    for (std::size_t j = 0; j < n; ++j) {
        const Long x = Long(scores[j]) - Long(row_max);
        total += numerator[j] = std::exp(x);
        weighted_shift += times(std::abs(x), numerator[j]);
    }
    for (std::size_t j = 0; j < n; ++j) {
        const Long want = numerator[j] / total;
        const Long x = std::abs(Long(scores[j]) - Long(row_max));
        const Long bound = times((Long(n + 8) + x + weighted_shift / total) * u<T>, want) + min_normal<T>;
        expect(tally, agrees(weights[j], want, bound, Sign::exact), [&] {
            return mismatch("softmax_row", n, j, inputs("score", scores[j], "max", row_max), weights[j], want);
        });
        if (scores[j] == -std::numeric_limits<T>::infinity() && !std::isnan(total)) {
            expect(tally, same_bits(weights[j], T(0)),
                   [&] { return mismatch("softmax_row hidden", n, j, inputs("score", scores[j]), weights[j], want); });
        }
    }
}

// dS_k = w_k·(g_k − Σ_j g_j·w_j) (OpKernels::softmax_vjp_row). Bound as tests/test_kernel_remainders.cpp
// derives it: n products and a sum of n terms, a difference and a product: (n + 8)·u of
// w_k·(|g_k| + Σ|g_j|·w_j). Floor: products that underflow (subnormal weights) are off by
// denorm_min/2 each, n of them in the mean: below min_normal.
template <class T>
void check_softmax_vjp_row(const OpKernels<T>& k, const std::vector<T>& weights, const std::vector<T>& upstream,
                           Tally& tally) {
    const std::size_t n = weights.size();
    std::vector<T> dS(n);
    k.softmax_vjp_row(weights.data(), upstream.data(), n, dS.data());
    Long mean = 0, magnitude = 0;
    for (std::size_t j = 0; j < n; ++j) {
        mean += Long(upstream[j]) * Long(weights[j]);
        magnitude += std::abs(Long(upstream[j])) * Long(weights[j]);
    }
    for (std::size_t j = 0; j < n; ++j) {
        const Long w = weights[j], want = w * (Long(upstream[j]) - mean);
        const Long bound = times(Long(n + 8) * u<T>, std::abs(w) * (std::abs(Long(upstream[j])) + magnitude));
        expect(tally, agrees(dS[j], want, bound + min_normal<T>, Sign::free), [&] {
            return mismatch("softmax_vjp_row", n, j, inputs("w", weights[j], "g", upstream[j]), dS[j], want);
        });
    }
}

// ---- fused attention's tile-row kernels -------------------------------------------------------------
// exp_shifted: x_k = e^{x_k − shift}: the difference rounded (|x − shift|·u once exponentiated) and
// Eigen's exp (4u); floor min_normal, Eigen's exp clamp as in softmax_row (it gives e^{−inf} as a
// tiny number, which callers never pass: fused attention skips hidden keys).
template <class T>
void check_exp_shifted(const OpKernels<T>& k, const std::vector<T>& x, T shift, Tally& tally) {
    std::vector<T> y = x;
    k.exp_shifted(y.data(), y.size(), shift);
    for (std::size_t j = 0; j < x.size(); ++j) {
        const Long d = Long(x[j]) - Long(shift), want = std::exp(d);
        const Long bound = times((std::abs(d) + 4) * u<T>, want) + min_normal<T>;
        expect(tally, agrees(y[j], want, bound, Sign::exact),
               [&] { return mismatch("exp_shifted", x.size(), j, inputs("x", x[j], "shift", shift), y[j], want); });
    }
}

// scale_row: x_k = c·x_k, one IEEE product: equal bit for bit to c·x rounded once (computed here in
// double, exact for two floats before the one rounding to float), NaN where it is NaN; and the kernel
// reports whether every result is finite.
template <class T>
void check_scale_row(const OpKernels<T>& k, const std::vector<T>& x, T c, Tally& tally) {
    std::vector<T> y = x;
    const bool finite = k.scale_row(y.data(), y.size(), c);
    bool all_finite = true;
    for (std::size_t j = 0; j < x.size(); ++j) {
        const T want = T(double(c) * double(x[j]));
        all_finite = all_finite && std::isfinite(want);
        expect(tally, std::isnan(want) ? std::isnan(y[j]) : same_bits(y[j], want),
               [&] { return mismatch("scale_row", x.size(), j, inputs("x", x[j], "c", c), y[j], want); });
    }
    expect(tally, finite == all_finite, [&] {
        return fmt::format("scale_row n={} c={}: reported finite={} for {}", x.size(), c, finite, fmt::join(x, " "));
    });
}

// max_of: exact (comparisons round nothing), NaN when any element is NaN, whatever its payload and
// sign. The sign of a zero maximum is not promised (−0 == +0 to every comparison; a caller subtracts
// it): compared with ==. sum_of: in any order within γ_n·Σ|x_k| (γ_n = n·u/(1 − n·u)); no floor
// (a sum of subnormals is exact); a zero's sign is IEEE's for a sum (Sign::free).
template <class T>
void check_reductions(const OpKernels<T>& k, const std::vector<T>& x, Tally& tally) {
    const std::size_t n = x.size();
    bool any_nan = false;
    Long largest = -std::numeric_limits<Long>::infinity(), total = 0, magnitude = 0;
    for (const T v : x) {
        any_nan = any_nan || std::isnan(v);
        if (Long(v) > largest) largest = v;
        total += v;
        magnitude += std::abs(Long(v));
    }
    const T got_max = k.max_of(x.data(), n);
    expect(tally, any_nan ? std::isnan(got_max) : Long(got_max) == largest, [&] {
        return mismatch("max_of", n, 0, fmt::format("x {}", fmt::join(x, " ")), got_max,
                        any_nan ? std::numeric_limits<Long>::quiet_NaN() : largest);
    });
    const T got_sum = k.sum_of(x.data(), n);
    const Long gamma = Long(n) * u<T> / (1 - Long(n) * u<T>);
    expect(tally, agrees(got_sum, total, times(gamma, magnitude), Sign::free),
           [&] { return mismatch("sum_of", n, 0, fmt::format("x {}", fmt::join(x, " ")), got_sum, total); });
}

// score_gradient_row: p_k = c·(p_k·(dp_k − mean)), three roundings: 4u of |c|·|p_k|·(|dp_k| + |mean|)
// (the difference's rounding is relative to its operands). Floor: an underflowing product is off by
// denorm_min/2 before the product by |c| ≤ 1: below min_normal. A product of three factors whose
// signs the formula fixes (dp − mean is an exact +0 only where dp == mean, in T and in long double
// alike): Sign::exact.
template <class T>
void check_score_gradient_row(const OpKernels<T>& k, const std::vector<T>& p, const std::vector<T>& dp, T mean, T c,
                              Tally& tally) {
    std::vector<T> out = p;
    k.score_gradient_row(out.data(), dp.data(), p.size(), mean, c);
    for (std::size_t j = 0; j < p.size(); ++j) {
        const Long want = Long(c) * (Long(p[j]) * (Long(dp[j]) - Long(mean)));
        const Long scale = std::abs(Long(c) * Long(p[j])) * (std::abs(Long(dp[j])) + std::abs(Long(mean)));
        expect(tally, agrees(out[j], want, times(4 * u<T>, scale) + min_normal<T>, Sign::exact), [&] {
            return mismatch("score_gradient_row", p.size(), j,
                            fmt::format("p {}, dp {}, mean {}, c {}", describe(p[j]), describe(dp[j]), mean, c), out[j],
                            want);
        });
    }
}

// ---- the engine's elementwise kernels -------------------------------------------------------------
// any_nan: whether any element is NaN, every payload and sign counted, ±inf not.
template <class T>
void check_any_nan(const EngineKernels<T>& k, const std::vector<T>& x, Tally& tally) {
    bool want = false;
    for (const T v : x) want = want || std::isnan(v);
    expect(tally, k.any_nan(x.data(), x.size()) == want,
           [&] { return fmt::format("any_nan n={}: should be {} for {}", x.size(), want, fmt::join(x, " ")); });
}

// The dual planes: deinterleave and interleave are copies, bit for bit (NaN payloads, signalling ones
// too, and the sign of zero kept: moves and shuffles change no bit); interleave with accumulate adds,
// one IEEE sum per element: bit for bit equal to the sum in T, NaN where it is NaN (which of the
// operands' payloads a NaN sum carries IEEE 754 leaves open).
template <class T>
void check_planes(const EngineKernels<T>& k, const std::vector<T>& pairs, Tally& tally) {
    const std::size_t n = pairs.size() / 2;
    std::vector<T> first(n), second(n), copied(2 * n), summed = pairs;
    k.deinterleave(pairs.data(), n, first.data(), second.data());
    for (std::size_t j = 0; j < n; ++j) {
        expect(tally, same_bits(first[j], pairs[2 * j]), [&] {
            return mismatch("deinterleave first", n, j, inputs("pair value", pairs[2 * j]), first[j],
                            Long(pairs[2 * j]));
        });
        expect(tally, same_bits(second[j], pairs[2 * j + 1]), [&] {
            return mismatch("deinterleave second", n, j, inputs("pair tangent", pairs[2 * j + 1]), second[j],
                            Long(pairs[2 * j + 1]));
        });
    }
    k.interleave(first.data(), second.data(), n, copied.data(), false);
    for (std::size_t j = 0; j < 2 * n; ++j) {
        expect(tally, same_bits(copied[j], pairs[j]),
               [&] { return mismatch("interleave", n, j, inputs("plane", pairs[j]), copied[j], Long(pairs[j])); });
    }
    // Accumulated onto the pairs reversed, so each number is added to another position's: a special
    // value to an ordinary one, and in the rows of special values only, special values to each other.
    std::reverse(summed.begin(), summed.end());
    const std::vector<T> before = summed;
    k.interleave(first.data(), second.data(), n, summed.data(), true);
    for (std::size_t j = 0; j < 2 * n; ++j) {
        const T added = j % 2 == 0 ? first[j / 2] : second[j / 2], want = before[j] + added;
        expect(tally, std::isnan(want) ? std::isnan(summed[j]) : same_bits(summed[j], want), [&] {
            return mismatch("interleave accumulate", n, j, inputs("pair", before[j], "plane", added), summed[j],
                            Long(want));
        });
    }
}

// ---- bfloat16 rounding ------------------------------------------------------------------------------
// Written from the definition on the float's bits: keep the top 16 bits, and add one to them when the
// dropped 16 bits exceed half of the kept last place, or equal it with the kept last bit odd (nearest,
// ties to even); a carry runs into the exponent (the largest floats round to inf, the largest
// subnormals to the smallest normal). NaN: autodiff/low_precision.hpp promises "NaN becomes the quiet
// NaN of its sign" (bfloat16_from_float, which the kernel round_to_bf16 documents as its rounding):
// 0x7fc0 with the input's sign bit, the payload not kept and a signalling NaN made quiet. Held exactly.
std::uint16_t bfloat16_reference(std::uint32_t bits) {
    const std::uint32_t sign = bits & 0x80000000u, exponent = bits & 0x7f800000u, fraction = bits & 0x007fffffu;
    if (exponent == 0x7f800000u && fraction != 0) return std::uint16_t((sign >> 16) | 0x7fc0u);
    std::uint32_t kept = bits >> 16;
    const std::uint32_t dropped = bits & 0xffffu;
    if (dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u) != 0)) ++kept;
    return std::uint16_t(kept);
}

// Float patterns at bfloat16's rounding boundaries, both signs: below, at and above a tie with the
// kept bit even and odd, in normals, subnormals and at the top of the range (a tie there rounds to
// inf), and the largest subnormal (to the smallest normal).
std::vector<float> bfloat16_boundaries() {
    std::vector<float> values;
    for (const std::uint32_t b : {0x3f807fffu, 0x3f808000u, 0x3f808001u, 0x3f817fffu, 0x3f818000u, 0x3f818001u,
                                  0x00008000u, 0x00018000u, 0x00017fffu, 0x007fffffu, 0x007f8000u, 0x00800000u,
                                  0x7f7f7fffu, 0x7f7f8000u, 0x7f7effffu, 0x7f7e8000u, 0x7f7fffffu}) {
        values.push_back(std::bit_cast<float>(b));
        values.push_back(std::bit_cast<float>(b | 0x80000000u));
    }
    return values;
}

void check_round_to_bf16(const EngineKernels<float>& k, const std::vector<float>& x, Tally& tally) {
    std::vector<std::uint16_t> out(x.size());
    k.round_to_bf16(x.data(), x.size(), out.data());
    for (std::size_t j = 0; j < x.size(); ++j) {
        const std::uint16_t want = bfloat16_reference(bits_of(x[j]));
        expect(tally, out[j] == want, [&] {
            return fmt::format("round_to_bf16 n={} at {}: {} gives {:#06x}, want {:#06x}", x.size(), j, describe(x[j]),
                               out[j], want);
        });
    }
}

// Ordinary floats with all 16 dropped bits busy, both signs, for the rounding's background.
std::vector<float> rounding_background() {
    std::vector<float> v(longest_row);
    for (std::size_t j = 0; j < v.size(); ++j) {
        const std::uint32_t b = 0x3e000000u + std::uint32_t(j) * 0x0001a3c5u;
        v[j] = std::bit_cast<float>(j % 2 == 0 ? b : b | 0x80000000u);
    }
    return v;
}

// ---- the sweeps ---------------------------------------------------------------------------------

template <class T>
Tally sweep_op_kernels(const OpKernels<T>& k) {
    Tally tally;
    const std::vector<T> specials = special_values<T>(), probabilities = probability_values<T>();
    const std::vector<T> mixed = mixed_values<T>(), upstream = upstream_values<T>(), weights = weight_values<T>();
    const auto prefix = [](const std::vector<T>& v, std::size_t n) {
        return std::vector<T>(v.begin(), v.begin() + long(n));
    };
    // GELU and silu: the special value in a (g ordinary), then in g (a ordinary: the product by g).
    sweep(specials, mixed, tally, [&](const std::vector<T>& a) {
        check_gelu_row(k, a, prefix(upstream, a.size()), tally);
        check_silu_row(k, a, prefix(upstream, a.size()), tally);
    });
    sweep(specials, upstream, tally, [&](const std::vector<T>& g) {
        check_gelu_row(k, prefix(mixed, g.size()), g, tally);
        check_silu_row(k, prefix(mixed, g.size()), g, tally);
    });
    all_special_rows(specials, [&](const std::vector<T>& a) {
        check_gelu_row(k, a, prefix(upstream, a.size()), tally);
        check_silu_row(k, a, prefix(upstream, a.size()), tally);
    });
    // Softmax rows: special scores; the VJP with a special upstream and with special weights.
    sweep(specials, mixed, tally, [&](const std::vector<T>& s) { check_softmax_row(k, s, tally); });
    sweep(specials, upstream, tally,
          [&](const std::vector<T>& g) { check_softmax_vjp_row(k, prefix(weights, g.size()), g, tally); });
    sweep(probabilities, weights, tally,
          [&](const std::vector<T>& w) { check_softmax_vjp_row(k, w, prefix(upstream, w.size()), tally); });
    // Fused attention's rows: exponentials shifted by positive, zero and negative shifts; scaling by
    // c of both signs, −0 and 4 (which overflows the largest values); the reductions; the score
    // gradient with special dp and special probabilities, for means and scales of both signs.
    sweep(specials, mixed, tally, [&](const std::vector<T>& x) {
        for (const T shift : {T(1.5), T(0), T(-3.25)}) check_exp_shifted(k, x, shift, tally);
        for (const T c : {T(0.375), T(-2.5), T(-0.0), T(4)}) check_scale_row(k, x, c, tally);
        check_reductions(k, x, tally);
    });
    sweep(specials, upstream, tally, [&](const std::vector<T>& dp) {
        check_score_gradient_row(k, prefix(weights, dp.size()), dp, T(0.3), T(-0.7), tally);
        check_score_gradient_row(k, prefix(weights, dp.size()), dp, T(-1.25), T(0.375), tally);
    });
    sweep(probabilities, weights, tally, [&](const std::vector<T>& p) {
        check_score_gradient_row(k, p, prefix(upstream, p.size()), T(0.3), T(-0.7), tally);
        check_score_gradient_row(k, p, prefix(upstream, p.size()), T(-1.25), T(0.375), tally);
    });
    all_special_rows(specials, [&](const std::vector<T>& x) {
        for (const T shift : {T(1.5), T(-3.25)}) check_exp_shifted(k, x, shift, tally);
        for (const T c : {T(0.375), T(-2.5)}) check_scale_row(k, x, c, tally);
        check_score_gradient_row(k, prefix(weights, x.size()), x, T(-1.25), T(0.375), tally);
    });
    // The row's scalars special: every shift, scale, mean and scale factor over ordinary rows.
    for (const std::size_t n : {1u, 7u, 16u, 17u, 33u, 65u}) {
        for (const T v : specials) {
            check_exp_shifted(k, prefix(mixed, n), v, tally);
            check_scale_row(k, prefix(mixed, n), v, tally);
            check_score_gradient_row(k, prefix(weights, n), prefix(upstream, n), v, T(0.375), tally);
            check_score_gradient_row(k, prefix(weights, n), prefix(upstream, n), T(-1.25), v, tally);
        }
    }
    return tally;
}

template <class T>
Tally sweep_engine_kernels(const EngineKernels<T>& k) {
    Tally tally;
    const std::vector<T> specials = special_values<T>(), mixed = mixed_values<T>();
    sweep(specials, mixed, tally, [&](const std::vector<T>& x) { check_any_nan(k, x, tally); });
    all_special_rows(specials, [&](const std::vector<T>& x) { check_any_nan(k, x, tally); });
    std::vector<T> no_nan;
    for (const T v : specials)
        if (!std::isnan(v)) no_nan.push_back(v);
    all_special_rows(no_nan, [&](const std::vector<T>& x) { check_any_nan(k, x, tally); });
    // The planes: the special value at the first, middle and last of the 2n numbers of the pairs.
    std::vector<T> background(2 * longest_row);
    for (std::size_t j = 0; j < background.size(); ++j) background[j] = mixed[j % longest_row] + T(0.125);
    for (const std::size_t n : row_lengths())
        for (const std::size_t at : positions(2 * n))
            for (const T v : specials) {
                std::vector<T> pairs(background.begin(), background.begin() + long(2 * n));
                pairs[at] = v;
                check_planes(k, pairs, tally);
            }
    for (const std::size_t n : row_lengths()) {
        std::vector<T> pairs(2 * n);
        for (std::size_t j = 0; j < 2 * n; ++j) pairs[j] = specials[(j + 7 * n) % specials.size()];
        check_planes(k, pairs, tally);
    }
    return tally;
}

Tally sweep_bfloat16_rounding(const EngineKernels<float>& k) {
    Tally tally;
    std::vector<float> specials = special_values<float>();
    for (const float v : bfloat16_boundaries()) specials.push_back(v);
    sweep(specials, rounding_background(), tally,
          [&](const std::vector<float>& x) { check_round_to_bf16(k, x, tally); });
    all_special_rows(specials, [&](const std::vector<float>& x) { check_round_to_bf16(k, x, tally); });
    return tally;
}

template <class T>
void report(const char* what, const Tally& tally) {
    BOOST_TEST_MESSAGE(fmt::format("{} {} at {}: {} comparisons", what, std::is_same_v<T, float> ? "float" : "double",
                                   cpu_level_name(cpu_level()), tally.comparisons));
    BOOST_TEST(tally.failures == 0u, what << " at " << cpu_level_name(cpu_level()) << ": " << tally.summary());
}

}  // namespace

BOOST_AUTO_TEST_CASE(op_kernels_agree_with_references_on_special_values_double) {
    report<double>("op kernels", sweep_op_kernels(op_kernels<double>()));
}

BOOST_AUTO_TEST_CASE(op_kernels_agree_with_references_on_special_values_float) {
    report<float>("op kernels", sweep_op_kernels(op_kernels<float>()));
}

BOOST_AUTO_TEST_CASE(engine_kernels_agree_with_references_on_special_values) {
    report<double>("engine kernels", sweep_engine_kernels(engine_kernels<double>()));
    report<float>("engine kernels", sweep_engine_kernels(engine_kernels<float>()));
}

BOOST_AUTO_TEST_CASE(bfloat16_rounding_matches_the_definition_bit_for_bit) {
    report<float>("round_to_bf16", sweep_bfloat16_rounding(engine_kernels<float>()));
}

// ---- the documented promises, one by one ------------------------------------------------------------

// ops/fast/kernels.hpp: "−inf scores giving exactly 0": +0, whatever the −inf's place, how many there
// are, and when one visible score is left (its weight then 1 within the bound above). ops/softmax.hpp:
// "scores of ±1e4 and beyond never overflow" (the maximum is subtracted): finite weights summing to 1.
// The sum: weight j within (n + 8 + |x_j| + X)·u relative (check_softmax_row), X ≤ max|x|, so the
// weights' sum within (n + 8 + 2·max|x|)·u of 1, max|x| over the visible scores' x = s − m.
template <class T>
void hidden_scores_get_exactly_zero() {
    const T hidden = -std::numeric_limits<T>::infinity();
    for (const std::size_t n : row_lengths()) {
        std::vector<T> scores = mixed_values<T>();
        scores.resize(n);
        for (const std::size_t at : positions(n)) scores[at] = hidden;
        std::vector<T> alone(n, hidden);
        alone[n / 2] = T(-2.5);
        for (const std::vector<T>* row : {&scores, &alone}) {
            T row_max = hidden;
            for (const T s : *row) row_max = std::max(row_max, s);
            if (row_max == hidden) continue;  // a row hidden entirely is the op's to zero (n = 1 here)
            std::vector<T> weights(n);
            op_kernels<T>().softmax_row(row->data(), n, row_max, weights.data());
            Long total = 0, widest = 0;
            for (std::size_t j = 0; j < n; ++j) {
                total += weights[j];
                if ((*row)[j] == hidden) {
                    BOOST_TEST(same_bits(weights[j], T(0)), "n=" << n << " at " << j);
                } else {
                    widest = std::max(widest, std::abs(Long((*row)[j]) - Long(row_max)));
                }
            }
            BOOST_TEST(std::abs(total - 1) <= (Long(n + 8) + 2 * widest) * u<T>,
                       "n=" << n << ": weights sum to " << double(total));
        }
        std::vector<T> huge(n);
        for (std::size_t j = 0; j < n; ++j) huge[j] = T(j % 2 == 0 ? 1e4 : -1e4) * T(1 + j);
        T row_max = huge[0];
        for (const T s : huge) row_max = std::max(row_max, s);
        std::vector<T> weights(n);
        op_kernels<T>().softmax_row(huge.data(), n, row_max, weights.data());
        // Every score but the maximum lies ≥ 1e4 below it: weights e^{−1e4} = 0 to T's range, each
        // within the exp clamp's min_normal/4 (check_softmax_row), so the sum is the maximum's e^0/Σ.
        Long total = 0;
        for (const T w : weights) {
            BOOST_TEST(std::isfinite(w));
            total += w;
        }
        BOOST_TEST(std::abs(total - 1) <= Long(n + 8) * u<T> + Long(n) * min_normal<T>,
                   "n=" << n << ": huge scores' weights sum to " << double(total));
    }
}

BOOST_AUTO_TEST_CASE(softmax_row_gives_hidden_scores_exactly_zero_and_never_overflows) {
    hidden_scores_get_exactly_zero<double>();
    hidden_scores_get_exactly_zero<float>();
}

// autodiff/cpu.hpp: any_nan is "whether any of x[0..n) is NaN" and ops/fast/kernels.hpp: max_of is
// "NaN when any element is NaN": every NaN pattern at every position of every length, alone among
// ordinary values; and neither reacts to ±inf, the largest finite or subnormals (the NaN scan
// answers whether, not where: no position is promised).
template <class T>
void every_nan_is_found() {
    const std::vector<T> mixed = mixed_values<T>();
    for (const std::size_t n : row_lengths()) {
        std::vector<T> x(mixed.begin(), mixed.begin() + long(n));
        BOOST_TEST(!engine_kernels<T>().any_nan(x.data(), n));
        for (const T v : {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                          std::numeric_limits<T>::max(), std::numeric_limits<T>::denorm_min()}) {
            x[n - 1] = v;
            BOOST_TEST(!engine_kernels<T>().any_nan(x.data(), n), "n=" << n << ": " << describe(v) << " taken for NaN");
            BOOST_TEST(!std::isnan(op_kernels<T>().max_of(x.data(), n)));
        }
        x.assign(mixed.begin(), mixed.begin() + long(n));
        for (std::size_t at = 0; at < n; ++at)
            for (const T nan : nan_patterns<T>()) {
                const T kept = x[at];
                x[at] = nan;
                BOOST_TEST(engine_kernels<T>().any_nan(x.data(), n),
                           "n=" << n << ": " << describe(nan) << " at " << at);
                BOOST_TEST(std::isnan(op_kernels<T>().max_of(x.data(), n)),
                           "n=" << n << ": " << describe(nan) << " at " << at);
                x[at] = kept;
            }
    }
}

BOOST_AUTO_TEST_CASE(nan_scan_and_row_max_find_every_nan_payload_and_no_infinity) {
    every_nan_is_found<double>();
    every_nan_is_found<float>();
}

// ops/silu.hpp: "silu(−1e4) is −0·… = −0 in double, with derivative 0, never NaN" (and in float);
// src/cpu/level_kernels.hpp's GELU: "a huge e^{−2u} … gives s ≈ 0, never NaN": for every finite
// input, however large, neither value nor derivative is NaN or infinite, and far out the derivative
// is exactly 1 (a ≫ 0) or 0 (a ≪ 0), the value a or −0.
template <class T>
void far_out_gelu_and_silu_are_exact() {
    const OpKernels<T>& k = op_kernels<T>();
    std::vector<T> a, g;
    for (const T m : finite_magnitudes<T>()) {
        a.push_back(m);
        a.push_back(-m);
    }
    g.assign(a.size(), T(1));
    const std::size_t n = a.size();
    std::vector<T> y(n), da(n), sy(n), sda(n);
    k.gelu_tanh(a.data(), n, y.data());
    k.gelu_tanh_vjp(a.data(), g.data(), n, da.data());
    k.silu(a.data(), n, sy.data());
    k.silu_vjp(a.data(), g.data(), n, sda.data());
    for (std::size_t j = 0; j < n; ++j) {
        BOOST_TEST(std::isfinite(y[j]), "gelu(" << describe(a[j]) << ") = " << y[j]);
        BOOST_TEST(std::isfinite(da[j]), "gelu'(" << describe(a[j]) << ") = " << da[j]);
        BOOST_TEST(std::isfinite(sy[j]), "silu(" << describe(a[j]) << ") = " << sy[j]);
        BOOST_TEST(std::isfinite(sda[j]), "silu'(" << describe(a[j]) << ") = " << sda[j]);
        if (std::abs(a[j]) >= T(1e4)) {
            const bool positive = a[j] > 0;
            BOOST_TEST(same_bits(y[j], positive ? a[j] : T(-0.0)),
                       "gelu(" << describe(a[j]) << ") = " << describe(y[j]));
            BOOST_TEST(da[j] == T(positive ? 1 : 0), "gelu'(" << describe(a[j]) << ") = " << describe(da[j]));
            BOOST_TEST(same_bits(sy[j], positive ? a[j] : T(-0.0)),
                       "silu(" << describe(a[j]) << ") = " << describe(sy[j]));
            BOOST_TEST(sda[j] == T(positive ? 1 : 0), "silu'(" << describe(a[j]) << ") = " << describe(sda[j]));
        }
    }
}

BOOST_AUTO_TEST_CASE(gelu_and_silu_are_never_nan_on_finite_inputs_and_exact_far_out) {
    far_out_gelu_and_silu_are_exact<double>();
    far_out_gelu_and_silu_are_exact<float>();
}

// autodiff/low_precision.hpp: bfloat16_from_float makes "NaN … the quiet NaN of its sign": 0x7fc0 or
// 0xffc0 for every NaN, signalling ones made quiet, payloads not kept (a rounding carry must not run
// through a payload: 0x7f800001 would become inf, 0x7fffffff −0); ±inf and ±0 kept.
BOOST_AUTO_TEST_CASE(bfloat16_rounding_makes_every_nan_the_quiet_nan_of_its_sign) {
    for (const std::size_t n : row_lengths()) {
        for (const float nan : nan_patterns<float>()) {
            const std::vector<float> x(n, nan);
            std::vector<std::uint16_t> out(n);
            engine_kernels<float>().round_to_bf16(x.data(), n, out.data());
            const std::uint16_t want = std::signbit(nan) ? 0xffc0 : 0x7fc0;
            for (std::size_t j = 0; j < n; ++j) BOOST_TEST(out[j] == want, describe(nan) << " n=" << n << " at " << j);
        }
        const float inf = std::numeric_limits<float>::infinity();
        const std::vector<float> x{inf, -inf, 0.0f, -0.0f};
        std::vector<std::uint16_t> out(x.size());
        engine_kernels<float>().round_to_bf16(x.data(), x.size(), out.data());
        BOOST_TEST((out == std::vector<std::uint16_t>{0x7f80, 0xff80, 0x0000, 0x8000}));
    }
}

// ops/fast/kernels.hpp: scale_row "returns whether every result is finite": false for a NaN or an
// infinity anywhere (first, middle, last), or a product that overflows, or inf·0; true otherwise.
template <class T>
void scale_row_reports_non_finite() {
    const std::vector<T> mixed = mixed_values<T>();
    for (const std::size_t n : row_lengths())
        for (const std::size_t at : positions(n)) {
            for (const auto& [v, c] : {std::pair{std::numeric_limits<T>::quiet_NaN(), T(1)},
                                       std::pair{-std::numeric_limits<T>::infinity(), T(0.5)},
                                       std::pair{std::numeric_limits<T>::max(), T(-2)},
                                       std::pair{std::numeric_limits<T>::infinity(), T(0)}}) {
                std::vector<T> x(mixed.begin(), mixed.begin() + long(n));
                x[at] = v;
                BOOST_TEST(!op_kernels<T>().scale_row(x.data(), n, c),
                           "n=" << n << " at " << at << ": " << v << "·" << c);
            }
            std::vector<T> x(mixed.begin(), mixed.begin() + long(n));
            x[at] = std::numeric_limits<T>::max();
            BOOST_TEST(op_kernels<T>().scale_row(x.data(), n, T(-1)), "n=" << n << " at " << at);
        }
}

BOOST_AUTO_TEST_CASE(scale_row_reports_every_non_finite_result) {
    scale_row_reports_non_finite<double>();
    scale_row_reports_non_finite<float>();
}
