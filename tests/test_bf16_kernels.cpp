// The bfloat16 product (kernels::gemm_bf16, autodiff/kernels.hpp): bfloat16 A and B, float32 C, in
// vdpbf16ps's arithmetic at every CPU level, or widened to float32 where the level lacks vdpbf16ps
// (Bf16Arithmetic::fastest, the default). vdpbf16ps's arithmetic held here, at the active level
// (CTest runs this file under TAPEGRAD_CPU=<level> for every level built in, tests/CMakeLists.txt):
//  - bit for bit to a scalar reference written from the definition alone (an independent
//    formulation: long double sums and a 24-bit rounding by scaling, not the library's threshold),
//    in every form, with and without accumulate, at sizes crossing every remainder of both tile
//    shapes (emulated 4×16, native 8×48) and of the cache blocks (256 pairs of k, 192 rows, 1024
//    columns), k odd and even, on an inner block of C (what lies outside must stay);
//  - within the derived error bound of a float64 sum of the exact products;
//  - on bfloat16 subnormals, signed zeros, infinities, NaN, overflow, and the flush-to-zero edges,
//    each outcome as autodiff/kernels.hpp documents it;
//  - on any number of threads (the splits of autodiff/kernels.hpp), bit for bit;
// and across every available level in one run (set_cpu_level), bit for bit. Fault controls: a
// kernel that rounds each product to bfloat16, and one that accumulates in bfloat16, fail both the
// bitwise and the bound checks. The widened path, at every level without vdpbf16ps: bit for bit
// gemm<float> of the widened operands, within its own bound, with IEEE's subnormals (each
// documented outcome that differs from vdpbf16ps's, so each arithmetic is shown to be the one
// running), on any number of threads; fastest is vdpbf16ps itself at the avx512_bf16 level; and
// TAPEGRAD_BF16 chooses at start-up (its CTest reruns, tests/CMakeLists.txt). Operands given as
// floats (rounded as the product packs them): the bits of the product of their rounded copies.
#define BOOST_TEST_MODULE bf16_kernels
#include "support.hpp"
#include "tally.hpp"

#include "autodiff/low_precision.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

using namespace tapegrad;
using kernels::Form;

namespace {

constexpr std::array<Form, 3> forms{Form::ab, Form::abT, Form::aTb};

// ---- The reference: the definition of autodiff/kernels.hpp, one scalar step at a time ----------

float flush_subnormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

// c + a·b: DAZ on the three inputs, the exact sum in long double (a·b is exact there, and rounding
// the sum to 64 bits then to 24 is the same as rounding it once to 24: 64 ≥ 2·24 + 2), rounded to
// float; a sum whose 24-bit rounding (found on the sum scaled by 2¹⁰⁰, where float has no
// subnormals in the way) lies below 2⁻¹²⁶ becomes a zero of its sign.
float reference_step(float c, float a, float b) {
    const long double sum = (long double)flush_subnormal(c) + (long double)flush_subnormal(a) * flush_subnormal(b);
    if (!std::isfinite(sum) || sum == 0 || std::fabs(sum) >= 0x1p-100L) return float(sum);
    const float scaled = float(sum * 0x1p100L);  // 24-bit rounding, exponent in float's normal range
    return std::fabs(scaled) < 0x1p-26f ? std::copysign(0.0f, scaled) : std::ldexp(scaled, -100);
}

float value(std::uint16_t bits) { return float(bfloat16_value(bits)); }

struct Operands {
    Form form;
    std::size_t m, n, k;
    std::vector<std::uint16_t> A, B;
    float a(std::size_t i, std::size_t p) const {
        return p < k ? value(form == Form::aTb ? A[p * m + i] : A[i * k + p]) : 0.0f;
    }
    float b(std::size_t p, std::size_t j) const {
        return p < k ? value(form == Form::abT ? B[j * k + p] : B[p * n + j]) : 0.0f;
    }
};

using Step = float (*)(float c, float a, float b);

// One element: from C (accumulate) or +0, the pairs in order, the second product of each first
// (+0·+0 past k). `step` is reference_step but in the fault controls.
float reference_element(const Operands& op, std::size_t i, std::size_t j, float c, bool accumulate,
                        Step step = &reference_step) {
    if (op.k == 0) return accumulate ? c : 0.0f;
    float sum = accumulate ? c : 0.0f;
    for (std::size_t p = 0; p < op.k; p += 2) {
        sum = step(sum, op.a(i, p + 1), op.b(p + 1, j));
        sum = step(sum, op.a(i, p), op.b(p, j));
    }
    return sum;
}

// Equal bits, or NaN on both sides (a NaN's bits are not promised).
bool same(float x, float y) {
    return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y) || (std::isnan(x) && std::isnan(y));
}

std::string bits(float x) { return fmt::format("{:a} ({:08x})", x, std::bit_cast<std::uint32_t>(x)); }

using testing::Tally;

// ---- Inputs ---------------------------------------------------------------------------------------

std::vector<std::uint16_t> bf16_draws(std::size_t count, std::mt19937_64& rng) {
    std::normal_distribution<double> normal;
    std::vector<std::uint16_t> x(count);
    for (std::uint16_t& v : x) v = bfloat16_bits(normal(rng));
    return x;
}

std::vector<float> float_draws(std::size_t count, std::mt19937_64& rng) {
    std::normal_distribution<float> normal;
    std::vector<float> x(count);
    for (float& v : x) v = normal(rng);
    return x;
}

Operands draw_operands(Form form, std::size_t m, std::size_t n, std::size_t k, std::mt19937_64& rng) {
    return {form, m, n, k, bf16_draws(m * k, rng), bf16_draws(k * n, rng)};
}

// ---- The checks, on any kernel of the table's signature -------------------------------------------

// An inner block of C (a row and a column left on each side where there are more than two).
kernels::Block inner_block(std::size_t m, std::size_t n) {
    return {m > 2 ? 1u : 0u, m > 2 ? m - 2 : m, n > 2 ? 1u : 0u, n > 2 ? n - 2 : n};
}

bool inside(const kernels::Block& b, std::size_t i, std::size_t j) {
    return i >= b.first_row && i < b.first_row + b.rows && j >= b.first_col && j < b.first_col + b.cols;
}

// The kernel on the inner block of C, from C0: inside, bit for bit the reference; outside, C0.
void check_bitwise(kernels::Bf16GemmBlock kernel, const Operands& op, const std::vector<float>& C0, bool accumulate,
                   Tally& tally) {
    std::vector<float> C = C0;
    const kernels::Block block = inner_block(op.m, op.n);
    kernel(op.form, op.m, op.n, op.k, op.A.data(), op.B.data(), C.data(), accumulate, block);
    for (std::size_t i = 0; i < op.m; ++i)
        for (std::size_t j = 0; j < op.n; ++j) {
            const float c0 = C0[i * op.n + j];
            const float expected = inside(block, i, j) ? reference_element(op, i, j, c0, accumulate) : c0;
            tally.expect(same(C[i * op.n + j], expected),
                         fmt::format("form {} m={} n={} k={} accumulate={} at ({}, {}): {} instead of {}", int(op.form),
                                     op.m, op.n, op.k, accumulate, i, j, bits(C[i * op.n + j]), bits(expected)));
        }
}

// C0 + Σ_p a_p·b_p for element (i, j) as a float64 sum of the exact products (each exact in double),
// and C0's and the products' magnitudes summed: what the bound checks hold a result to.
struct ExactSum {
    double value, magnitude;
};
ExactSum exact_sum(const Operands& op, std::size_t i, std::size_t j, double c0) {
    ExactSum sum{c0, std::fabs(c0)};
    for (std::size_t p = 0; p < op.k; ++p) {
        const double product = double(op.a(i, p)) * double(op.b(p, j));
        sum.value += product;
        sum.magnitude += std::fabs(product);
    }
    return sum;
}

// The kernel on all of C against a float64 sum of the exact products (each exact in double), within
// autodiff/kernels.hpp's bound: γ_s·(|C0| + Σ|a·b|) + (s + 1)·2⁻¹²⁶, s = 2⌈k/2⌉ steps. (The float64
// sum's own error, k·2⁻⁵³ relative, is 2⁻²⁹ of the bound.)
void check_bound(kernels::Bf16GemmBlock kernel, const Operands& op, const std::vector<float>& C0, bool accumulate,
                 Tally& tally) {
    std::vector<float> C = C0;
    kernel(op.form, op.m, op.n, op.k, op.A.data(), op.B.data(), C.data(), accumulate, {0, op.m, 0, op.n});
    const double steps = double(2 * ((op.k + 1) / 2)), u = 0x1p-24, gamma = steps * u / (1 - steps * u);
    for (std::size_t i = 0; i < op.m; ++i)
        for (std::size_t j = 0; j < op.n; ++j) {
            const ExactSum exact = exact_sum(op, i, j, accumulate ? C0[i * op.n + j] : 0.0);
            const double error = std::fabs(double(C[i * op.n + j]) - exact.value);
            tally.expect(error <= gamma * exact.magnitude + (steps + 1) * 0x1p-126,
                         fmt::format("form {} m={} n={} k={} at ({}, {}): error {:.3e}, bound {:.3e}", int(op.form),
                                     op.m, op.n, op.k, i, j, error, gamma * exact.magnitude));
        }
}

// (m, n, k) crossing every remainder of the tiles (4×16 emulated, 8×48 native, narrower last
// panels of 16 and 32 columns) and of the cache blocks (256 pairs of k, 192 rows, 1024 columns):
// each dimension swept with the other two fixed off any multiple, k odd and even (the native
// level reads A's rows in place when k is even and a tile's rows are all there, else packs them).
std::vector<std::array<std::size_t, 3>> swept_sizes() {
    std::vector<std::array<std::size_t, 3>> sizes;
    for (std::size_t m = 1; m <= 18; ++m)
        for (const std::size_t k : {7u, 8u}) sizes.push_back({m, 50, k});
    for (std::size_t n = 1; n <= 100; ++n)
        for (const std::size_t k : {5u, 6u}) sizes.push_back({9, n, k});
    for (std::size_t k = 0; k <= 40; ++k) sizes.push_back({9, 49, k});
    for (const std::size_t k : {511u, 512u, 513u, 514u, 515u, 1027u}) sizes.push_back({9, 49, k});
    for (const std::size_t m : {191u, 192u, 193u, 200u, 385u})
        for (const std::size_t k : {3u, 4u}) sizes.push_back({m, 17, k});
    for (const std::size_t n : {1023u, 1024u, 1025u, 1100u}) sizes.push_back({3, n, 3});
    return sizes;
}

// Every form, accumulate on and off, every swept size (every `stride`-th for the fault controls,
// whose scalar kernels are slow): bitwise and bound checks of `kernel`.
std::pair<Tally, Tally> check_kernel(kernels::Bf16GemmBlock kernel, std::uint64_t seed, std::size_t stride = 1) {
    Tally bitwise, bound;
    std::mt19937_64 rng(seed);
    const std::vector<std::array<std::size_t, 3>> sizes = swept_sizes();
    for (const Form form : forms)
        for (std::size_t s = 0; s < sizes.size(); s += stride) {
            const auto [m, n, k] = sizes[s];
            const Operands op = draw_operands(form, m, n, k, rng);
            const std::vector<float> C0 = float_draws(m * n, rng);
            for (const bool accumulate : {false, true}) {
                check_bitwise(kernel, op, C0, accumulate, bitwise);
                check_bound(kernel, op, C0, accumulate, bound);
            }
        }
    return {bitwise, bound};
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_active_level_matches_the_reference_bit_for_bit_and_the_bound) {
    const auto [bitwise, bound] = check_kernel(engine_kernels<float>().gemm_bf16_block, 51);
    BOOST_TEST_MESSAGE(fmt::format("{}: {} bitwise and {} bound comparisons", cpu_level_name(cpu_level()),
                                   bitwise.comparisons, bound.comparisons));
    BOOST_TEST(bitwise.failures == 0u, cpu_level_name(cpu_level()) << " bitwise: " << bitwise.summary());
    BOOST_TEST(bound.failures == 0u, cpu_level_name(cpu_level()) << " bound: " << bound.summary());
}

namespace {

// ---- Special values ----------------------------------------------------------------------------------

// bfloat16 patterns, mostly ordinary, with signed zeros, subnormals, infinities, NaN, the largest
// and smallest normals, and magnitudes whose products land near the flush threshold 2⁻¹²⁶.
std::vector<std::uint16_t> special_bf16_draws(std::size_t count, std::mt19937_64& rng) {
    std::normal_distribution<double> normal;
    std::uniform_int_distribution<int> kind(0, 39), fraction(0, 127), exponent(-70, -56);
    std::vector<std::uint16_t> x(count);
    for (std::uint16_t& v : x) {
        const std::uint16_t sign = (rng() & 1) != 0 ? 0x8000 : 0;
        switch (kind(rng)) {
            case 0:
                v = sign;
                break;  // ±0
            case 1:
                v = std::uint16_t(sign | std::max(1, fraction(rng)));
                break;  // subnormal
            case 2:
                v = std::uint16_t(sign | 0x7f80);
                break;  // ±inf
            case 3:
                v = 0x7fc0;
                break;  // NaN
            case 4:
                v = std::uint16_t(sign | 0x7f7f);
                break;  // the largest
            case 5:
                v = std::uint16_t(sign | 0x0080 | fraction(rng));
                break;  // the smallest normals
            case 6:
            case 7:
            case 8:
            case 9:  // products near 2⁻¹²⁶
                v = bfloat16_bits(std::ldexp(normal(rng), exponent(rng)));
                break;
            default:
                v = bfloat16_bits(normal(rng));
        }
    }
    return x;
}

std::vector<float> special_float_draws(std::size_t count, std::mt19937_64& rng) {
    const std::array<float, 8> specials{0.0f,
                                        -0.0f,
                                        0x1p-130f,
                                        -0x1p-149f,
                                        0x1p-126f,
                                        -std::numeric_limits<float>::infinity(),
                                        std::numeric_limits<float>::quiet_NaN(),
                                        std::numeric_limits<float>::max()};
    std::uniform_int_distribution<std::size_t> kind(0, 4 * specials.size() - 1);
    std::vector<float> x = float_draws(count, rng);
    for (float& v : x)
        if (const std::size_t which = kind(rng); which < specials.size()) v = specials[which];
    return x;
}

// An operand's n elements as bfloat16 bit patterns: its own, or its floats rounded one by one
// (round_to_bfloat16, the scalar rounding the level's vectorised one is held to).
std::vector<std::uint16_t> bits_of(kernels::Bf16Operand x, std::size_t n) {
    if (x.bits() != nullptr) return {x.bits(), x.bits() + n};
    std::vector<std::uint16_t> bits(n);
    round_to_bfloat16(std::span(x.floats(), n), bits);
    return bits;
}

// Floats whose rounding to bfloat16 bites: a special_bf16_draws value's bits as the high half, and
// a low half that makes a tie (0x8000: to even, so up or down by the kept bit; on 0x7f7f, the
// largest, up to inf; on a fraction of all ones, a carry into the exponent), falls just either side
// of one (0x7fff, 0x8001), is exact (0), or is anything (a NaN on inf's high half, a subnormal on
// zero's).
std::vector<float> rounding_float_draws(std::size_t count, std::mt19937_64& rng) {
    constexpr std::array<std::uint32_t, 4> lows{0x8000u, 0x7fffu, 0x8001u, 0u};
    const std::vector<std::uint16_t> high = special_bf16_draws(count, rng);
    std::vector<float> x(count);
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t draw = rng();
        const std::uint32_t low = draw % 5 < 4 ? lows[draw % 5] : std::uint32_t(draw >> 32) & 0xffffu;
        x[i] = std::bit_cast<float>(std::uint32_t{high[i]} << 16 | low);
    }
    return x;
}

// A 1 × 1 product of k = A.size() as autodiff/kernels.hpp documents its outcome, at the active level.
float one_element(std::vector<std::uint16_t> A, std::vector<std::uint16_t> B, float C, bool accumulate) {
    kernels::gemm_bf16(Form::ab, 1, 1, A.size(), A.data(), B.data(), &C, accumulate);
    return C;
}

std::uint16_t bf(double x) { return bfloat16_bits(x); }

}  // namespace

BOOST_AUTO_TEST_CASE(special_values_match_the_reference_at_the_active_level) {
    std::mt19937_64 rng(52);
    Tally tally;
    for (const Form form : forms)
        for (const std::size_t k : {1u, 2u, 3u, 7u, 16u, 33u})
            for (const bool accumulate : {false, true}) {
                const Operands op{form, 9, 50, k, special_bf16_draws(9 * k, rng), special_bf16_draws(k * 50, rng)};
                check_bitwise(engine_kernels<float>().gemm_bf16_block, op, special_float_draws(9 * 50, rng), accumulate,
                              tally);
            }
    BOOST_TEST(tally.failures == 0u, cpu_level_name(cpu_level()) << ": " << tally.summary());
}

// Each documented outcome, by its own case (1 × 1 products; the last pair of an odd k is padded with
// +0·+0), in vdpbf16ps's arithmetic.
BOOST_AUTO_TEST_CASE(documented_outcomes_at_the_active_level) {
    const testing::UseBf16Arithmetic exact(Bf16Arithmetic::vdpbf16ps);
    const float inf = std::numeric_limits<float>::infinity();
    // DAZ: a bfloat16 subnormal (2⁻¹³³) times 2¹⁰⁰ adds nothing; a subnormal C is read as +0.
    BOOST_TEST(same(one_element({0x0001}, {bf(0x1p100)}, 0.0f, false), 0.0f));
    BOOST_TEST(same(one_element({bf(0.0)}, {bf(1.0)}, 0x1p-130f, true), 0.0f));
    BOOST_TEST(same(one_element({}, {}, 0x1p-130f, true), 0x1p-130f));  // k = 0: no step, C stays
    // FTZ, the sign kept: −2⁻¹²⁷ becomes −0.
    BOOST_TEST(same(one_element({bf(-0x1p-63)}, {bf(0x1p-64)}, 0.0f, false), -0.0f));
    // Tininess after rounding: 2⁻¹²⁶ − 2⁻¹⁵² rounds (24 bits) to 2⁻¹²⁶ and stays; 2⁻¹²⁶ − 1.5·2⁻¹⁵¹
    // rounds to 2⁻¹²⁶ − 2⁻¹⁵⁰, tiny, and is flushed (a conversion to float with subnormals gives 2⁻¹²⁶).
    BOOST_TEST(same(one_element({bf(0x1p-76)}, {bf(-0x1p-76)}, 0x1p-126f, true), 0x1p-126f));
    BOOST_TEST(same(one_element({bf(0x1.8p-75)}, {bf(-0x1p-76)}, 0x1p-126f, true), 0.0f));
    // The second product of a pair first: 1 + (−1) + 2⁻²⁴ = 2⁻²⁴, where 1 + 2⁻²⁴ − 1 would be 0.
    BOOST_TEST(same(one_element({bf(0x1p-24), bf(-1.0)}, {bf(1.0), bf(1.0)}, 1.0f, true), 0x1p-24f));
    // Signed zeros: −0 + (−0) + (−0) stays −0 at even k; at odd k the padding's +0 comes first.
    BOOST_TEST(same(one_element({0x8000, 0x8000}, {bf(1.0), bf(1.0)}, -0.0f, true), -0.0f));
    BOOST_TEST(same(one_element({0x8000}, {bf(1.0)}, -0.0f, true), 0.0f));
    BOOST_TEST(same(one_element({0x8000, 0x8000}, {bf(1.0), bf(1.0)}, 0.0f, false), 0.0f));
    // Infinities and NaN: IEEE 754's.
    BOOST_TEST(same(one_element({bf(0x1p100)}, {bf(0x1p100)}, 0.0f, false), inf));  // overflow
    BOOST_TEST(same(one_element({0x7f80}, {bf(-2.0)}, 0.0f, false), -inf));
    BOOST_TEST(std::isnan(one_element({0x7f80}, {bf(0.0)}, 0.0f, false)));  // inf·0
    BOOST_TEST(std::isnan(one_element({0x7f80}, {0x0001}, 0.0f, false)));   // inf·subnormal: inf·0 after DAZ
    BOOST_TEST(std::isnan(one_element({0x7f80, 0xff80}, {bf(1.0), bf(1.0)}, 0.0f, false)));  // inf − inf
    BOOST_TEST(std::isnan(one_element({bf(1.0)}, {bf(1.0)}, std::numeric_limits<float>::quiet_NaN(), true)));
    BOOST_TEST(std::isnan(one_element({0x7fc0}, {bf(1.0)}, 1.0f, true)));
}

BOOST_AUTO_TEST_CASE(every_level_gives_the_same_bits_in_vdpbf16ps_arithmetic) {
    const testing::RestoreCpuLevel restore;
    const testing::UseBf16Arithmetic exact(Bf16Arithmetic::vdpbf16ps);
    std::mt19937_64 rng(53);
    struct Case {
        Operands op;
        std::vector<float> C0;
    };
    std::vector<Case> cases;
    for (const Form form : forms) {
        cases.push_back({draw_operands(form, 67, 131, 301, rng), float_draws(67 * 131, rng)});
        cases.push_back({Operands{form, 13, 97, 37, special_bf16_draws(13 * 37, rng), special_bf16_draws(37 * 97, rng)},
                         special_float_draws(13 * 97, rng)});
    }
    std::vector<std::vector<float>> first;
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        Tally tally;
        for (std::size_t c = 0; c < cases.size(); ++c) {
            const Operands& op = cases[c].op;
            std::vector<float> C = cases[c].C0;
            kernels::gemm_bf16(op.form, op.m, op.n, op.k, op.A.data(), op.B.data(), C.data(), c % 3 == 0);
            if (first.size() == c) first.push_back(C);
            for (std::size_t x = 0; x < C.size(); ++x)
                tally.expect(same(C[x], first[c][x]),
                             fmt::format("case {} at {}: {} against {}'s {}", c, x, bits(C[x]),
                                         cpu_level_name(available_cpu_levels().front()), bits(first[c][x])));
        }
        BOOST_TEST_MESSAGE(
            fmt::format("{}: {} comparisons with the first level", cpu_level_name(level), tally.comparisons));
        BOOST_TEST(tally.failures == 0u, cpu_level_name(level) << ": " << tally.summary());
    }
}

// Split over threads by rows (m = 256) and by columns (m = 64, n = 600): the same bits on 1, 2 and 3
// threads, in both arithmetics.
BOOST_AUTO_TEST_CASE(threads_change_no_bit) {
    std::mt19937_64 rng(54);
    for (const Bf16Arithmetic arithmetic : all_bf16_arithmetics)
        for (const auto& [m, n, k] :
             {std::array<std::size_t, 3>{256, 128, 130}, std::array<std::size_t, 3>{64, 600, 121}}) {
            const testing::UseBf16Arithmetic use(arithmetic);
            BOOST_TEST_REQUIRE((kernels::split_of(m, n, k) != kernels::Split::none));
            for (const Form form : forms) {
                const Operands op = draw_operands(form, m, n, k, rng);
                std::vector<std::vector<float>> results;
                for (const unsigned threads : {1u, 2u, 3u}) {
                    set_threads(threads);
                    results.emplace_back(m * n);
                    kernels::gemm_bf16(form, m, n, k, op.A.data(), op.B.data(), results.back().data(), false);
                }
                set_threads(0);
                BOOST_TEST((results[1] == results[0] && results[2] == results[0]),
                           bf16_arithmetic_name(arithmetic) << " m=" << m << " n=" << n << " form " << int(form));
            }
        }
}

// Floats rounded as the product packs them (a Bf16Operand of floats): the bits of the product of
// their rounded copies, with A, B or both given as floats, in every form and both arithmetics, at
// every swept size (the tiles' and cache blocks' remainders, k odd and even, the native level's A
// rows read in place or packed) and two that split over threads, with and without accumulate, on
// floats that round by ties both ways, to inf, by a carry, or are NaN, ±inf, subnormal or negative.
BOOST_AUTO_TEST_CASE(floats_rounded_as_packed_give_the_bits_of_their_rounded_copies) {
    std::mt19937_64 rng(56);
    std::vector<std::array<std::size_t, 3>> sizes = swept_sizes();
    sizes.push_back({256, 128, 130});
    sizes.push_back({64, 600, 121});
    for (const Bf16Arithmetic arithmetic : all_bf16_arithmetics) {
        const testing::UseBf16Arithmetic use(arithmetic);
        Tally tally;
        for (const Form form : forms)
            for (std::size_t s = 0; s < sizes.size(); ++s) {
                const auto [m, n, k] = sizes[s];
                const std::vector<float> A = rounding_float_draws(m * k, rng), B = rounding_float_draws(k * n, rng);
                const std::vector<std::uint16_t> A16 = bits_of(A.data(), A.size()), B16 = bits_of(B.data(), B.size());
                const std::vector<float> C0 = special_float_draws(m * n, rng);
                const bool accumulate = s % 2 == 0;
                std::vector<float> expected = C0;
                kernels::gemm_bf16(form, m, n, k, A16.data(), B16.data(), expected.data(), accumulate);
                for (const auto& [name, a, b] :
                     {std::tuple{"A floats", kernels::Bf16Operand(A.data()), kernels::Bf16Operand(B16.data())},
                      std::tuple{"B floats", kernels::Bf16Operand(A16.data()), kernels::Bf16Operand(B.data())},
                      std::tuple{"both floats", kernels::Bf16Operand(A.data()), kernels::Bf16Operand(B.data())}}) {
                    std::vector<float> C = C0;
                    kernels::gemm_bf16(form, m, n, k, a, b, C.data(), accumulate);
                    for (std::size_t x = 0; x < C.size(); ++x)
                        tally.expect(same(C[x], expected[x]),
                                     fmt::format("{}, form {} m={} n={} k={} at {}: {} instead of {}", name, int(form),
                                                 m, n, k, x, bits(C[x]), bits(expected[x])));
                }
            }
        BOOST_TEST_MESSAGE(fmt::format("{}: {} comparisons", bf16_arithmetic_name(arithmetic), tally.comparisons));
        BOOST_TEST(tally.failures == 0u, bf16_arithmetic_name(arithmetic) << ": " << tally.summary());
    }
}

namespace {

// ---- Fault controls: kernels that keep bfloat16 where the definition keeps float32 --------------

float step_rounding_the_product_to_bf16(float c, float a, float b) {
    return reference_step(c, value(bfloat16_bits(double(a) * double(b))), 1.0f);
}

float step_accumulating_in_bf16(float c, float a, float b) { return value(bfloat16_bits(reference_step(c, a, b))); }

// A kernel of the table's signature that computes each element of the block with `step`.
template <Step step>
void scalar_kernel(Form form, std::size_t m, std::size_t n, std::size_t k, kernels::Bf16Operand A,
                   kernels::Bf16Operand B, float* C, bool accumulate, kernels::Block block) {
    const Operands op{form, m, n, k, bits_of(A, m * k), bits_of(B, k * n)};
    for (std::size_t i = block.first_row; i < block.first_row + block.rows; ++i)
        for (std::size_t j = block.first_col; j < block.first_col + block.cols; ++j)
            C[i * n + j] = reference_element(op, i, j, C[i * n + j], accumulate, step);
}

}  // namespace

BOOST_AUTO_TEST_CASE(kernels_rounding_to_bf16_are_rejected_by_both_checks) {
    constexpr std::size_t stride = 5;
    const auto [good_bitwise, good_bound] = check_kernel(&scalar_kernel<&reference_step>, 51, stride);
    BOOST_TEST((good_bitwise.failures == 0u && good_bound.failures == 0u),
               "the reference kernel itself: " << good_bitwise.summary() << "; " << good_bound.summary());
    for (const auto& [name, kernel] :
         {std::pair{"product rounded to bfloat16", &scalar_kernel<&step_rounding_the_product_to_bf16>},
          std::pair{"accumulated in bfloat16", &scalar_kernel<&step_accumulating_in_bf16>}}) {
        const auto [bitwise, bound] = check_kernel(kernel, 51, stride);
        BOOST_TEST_MESSAGE(name << ": bitwise " << bitwise.summary() << "\n" << name << ": bound " << bound.summary());
        BOOST_TEST(bitwise.failures > 0u, name);
        BOOST_TEST(bound.failures > 0u, name);
    }
}

namespace {

// ---- The widened path: Bf16Arithmetic::fastest at a level without vdpbf16ps ------------------------

// The available levels without vdpbf16ps, where the fastest arithmetic widens to float32.
std::vector<CpuLevel> widening_levels() {
    std::vector<CpuLevel> levels;
    for (const CpuLevel level : available_cpu_levels())
        if (level != CpuLevel::avx512_bf16) levels.push_back(level);
    return levels;
}

// gemm_bf16 (at the active level and arithmetic) on C0 against (1) gemm<float> of the widened
// operands, bit for bit (the widened path's definition), and (2) a float64 sum of the exact products
// within autodiff/kernels.hpp's widened bound, γ_k·(|C0| + Σ|a·b|) + k·2⁻¹⁴⁹ (the float64 sum's
// own error, k·2⁻⁵³ relative, is 2⁻²⁹ of the relative part; its absolute part is none, every
// product and sum of these operands being far above double's subnormals).
void check_widened(const Operands& op, const std::vector<float>& C0, bool accumulate, Tally& bitwise, Tally& bound) {
    std::vector<float> C = C0, expected = C0, A(op.A.size()), B(op.B.size());
    for (std::size_t x = 0; x < A.size(); ++x) A[x] = value(op.A[x]);
    for (std::size_t x = 0; x < B.size(); ++x) B[x] = value(op.B[x]);
    kernels::gemm_bf16(op.form, op.m, op.n, op.k, op.A.data(), op.B.data(), C.data(), accumulate);
    kernels::gemm<float>(op.form, op.m, op.n, op.k, A.data(), B.data(), expected.data(), accumulate);
    const double u = 0x1p-24, gamma = double(op.k) * u / (1 - double(op.k) * u);
    for (std::size_t i = 0; i < op.m; ++i)
        for (std::size_t j = 0; j < op.n; ++j) {
            const std::size_t x = i * op.n + j;
            const std::string where =
                fmt::format("{} form {} m={} n={} k={} accumulate={} at ({}, {})", cpu_level_name(cpu_level()),
                            int(op.form), op.m, op.n, op.k, accumulate, i, j);
            bitwise.expect(same(C[x], expected[x]),
                           fmt::format("{}: {} instead of {}", where, bits(C[x]), bits(expected[x])));
            const ExactSum exact = exact_sum(op, i, j, accumulate ? C0[x] : 0.0);
            const double error = std::fabs(double(C[x]) - exact.value),
                         allowed = gamma * exact.magnitude + double(op.k) * 0x1p-149;
            bound.expect(error <= allowed, fmt::format("{}: error {:.3e}, bound {:.3e}", where, error, allowed));
        }
}

// Operands scaled by 2^-70 each, so that every product lies near 2⁻¹⁴⁰, among float's subnormals:
// where vdpbf16ps flushes and the widened path must not.
Operands tiny(Operands op) {
    for (std::uint16_t& a : op.A) a = bfloat16_bits(std::ldexp(bfloat16_value(a), -70));
    for (std::uint16_t& b : op.B) b = bfloat16_bits(std::ldexp(bfloat16_value(b), -70));
    return op;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_widened_path_is_the_float32_product_of_the_widened_operands_within_its_bound) {
    const testing::RestoreCpuLevel restore;
    const testing::UseBf16Arithmetic fastest(Bf16Arithmetic::fastest);
    BOOST_TEST_REQUIRE(!widening_levels().empty());  // baseline is always there
    for (const CpuLevel level : widening_levels()) {
        set_cpu_level(level);
        BOOST_TEST_REQUIRE(bf16_products_widened());
        std::mt19937_64 rng(55);
        Tally bitwise, bound;
        const std::vector<std::array<std::size_t, 3>> sizes = swept_sizes();
        for (const Form form : forms)
            for (std::size_t s = 0; s < sizes.size(); s += 3) {  // every third size: k from 0 to 1027 still
                const auto [m, n, k] = sizes[s];
                const Operands op = draw_operands(form, m, n, k, rng);
                const std::vector<float> C0 = float_draws(m * n, rng);
                for (const bool accumulate : {false, true}) {
                    check_widened(op, C0, accumulate, bitwise, bound);
                    check_widened(tiny(op), std::vector<float>(m * n, 0x1p-140f), accumulate, bitwise, bound);
                }
            }
        BOOST_TEST_MESSAGE(fmt::format("{}: {} bitwise and {} bound comparisons", cpu_level_name(level),
                                       bitwise.comparisons, bound.comparisons));
        BOOST_TEST(bitwise.failures == 0u, cpu_level_name(level) << " bitwise: " << bitwise.summary());
        BOOST_TEST(bound.failures == 0u, cpu_level_name(level) << " bound: " << bound.summary());
    }
}

// The widened bound bites: vdpbf16ps's arithmetic (which flushes what lies below 2⁻¹²⁶) on the
// tiny operands breaks it, as a kernel that flushed in the widened path would.
BOOST_AUTO_TEST_CASE(a_flushing_product_fails_the_widened_bound) {
    const testing::UseBf16Arithmetic exact(Bf16Arithmetic::vdpbf16ps);
    std::mt19937_64 rng(56);
    Tally bitwise, bound;
    check_widened(tiny(draw_operands(Form::ab, 9, 17, 40, rng)), std::vector<float>(9 * 17, 0.0f), false, bitwise,
                  bound);
    BOOST_TEST(bound.failures > 0u, bound.summary());
}

// Each documented outcome of the widened path that differs from vdpbf16ps's, at every level that
// widens, in both arithmetics: the arithmetic chosen is the one that runs.
BOOST_AUTO_TEST_CASE(widened_outcomes_keep_subnormals_where_vdpbf16ps_flushes) {
    const testing::RestoreCpuLevel restore;
    for (const CpuLevel level : widening_levels()) {
        set_cpu_level(level);
        for (const Bf16Arithmetic arithmetic : all_bf16_arithmetics) {
            const testing::UseBf16Arithmetic use(arithmetic);
            const bool widened = arithmetic == Bf16Arithmetic::fastest;
            BOOST_TEST(bf16_products_widened() == widened);
            const std::string where{cpu_level_name(level)};
            // A bfloat16 subnormal (2⁻¹³³) times 2¹⁰⁰: 2⁻³³ (vdpbf16ps: DAZ, 0).
            BOOST_TEST(same(one_element({0x0001}, {bf(0x1p100)}, 0.0f, false), widened ? 0x1p-33f : 0.0f), where);
            // A subnormal C (2⁻¹³⁰) added to: kept (vdpbf16ps: read as +0).
            BOOST_TEST(same(one_element({bf(0.0)}, {bf(1.0)}, 0x1p-130f, true), widened ? 0x1p-130f : 0.0f), where);
            // A product below 2⁻¹²⁶: −2⁻¹²⁷, a subnormal (vdpbf16ps: FTZ, −0).
            BOOST_TEST(same(one_element({bf(-0x1p-63)}, {bf(0x1p-64)}, 0.0f, false), widened ? -0x1p-127f : -0.0f),
                       where);
            // What both share: k = 0 leaves C or gives +0, overflow is inf, inf·0 is NaN.
            BOOST_TEST(same(one_element({}, {}, 3.0f, true), 3.0f), where);
            BOOST_TEST(same(one_element({}, {}, 3.0f, false), 0.0f), where);
            BOOST_TEST(
                same(one_element({bf(0x1p100)}, {bf(0x1p100)}, 0.0f, false), std::numeric_limits<float>::infinity()),
                where);
            BOOST_TEST(std::isnan(one_element({0x7f80}, {bf(0.0)}, 0.0f, false)), where);
        }
    }
}

// At the avx512_bf16 level the fastest arithmetic is vdpbf16ps itself: nothing widens.
BOOST_AUTO_TEST_CASE(fastest_is_vdpbf16ps_where_the_cpu_has_it) {
    if (!cpu_level_available(CpuLevel::avx512_bf16)) {
        BOOST_TEST_MESSAGE("this CPU lacks AVX512_BF16: nothing to compare");
        return;
    }
    const testing::RestoreCpuLevel restore;
    const testing::UseBf16Arithmetic fastest(Bf16Arithmetic::fastest);
    set_cpu_level(CpuLevel::avx512_bf16);
    BOOST_TEST(!bf16_products_widened());
    std::mt19937_64 rng(57);
    Tally bitwise;
    for (const Form form : forms) {  // kernels::gemm_bf16 itself, C += op(A)·op(B), against the reference
        const Operands op = draw_operands(form, 37, 53, 41, rng);
        const std::vector<float> C0 = float_draws(op.m * op.n, rng);
        std::vector<float> C = C0;
        kernels::gemm_bf16(op.form, op.m, op.n, op.k, op.A.data(), op.B.data(), C.data(), true);
        for (std::size_t i = 0; i < op.m; ++i)
            for (std::size_t j = 0; j < op.n; ++j) {
                const float expected = reference_element(op, i, j, C0[i * op.n + j], true);
                bitwise.expect(same(C[i * op.n + j], expected),
                               fmt::format("form {} at ({}, {}): {} instead of {}", int(form), i, j,
                                           bits(C[i * op.n + j]), bits(expected)));
            }
    }
    BOOST_TEST(bitwise.failures == 0u, bitwise.summary());
}

// The arithmetic at start-up is TAPEGRAD_BF16's (fastest when unset), and it is the one that runs:
// a bfloat16 subnormal counts in the widened path only. CTest reruns this case under
// TAPEGRAD_BF16=vdpbf16ps, =fastest and = (empty: fastest) at the avx2 level, and refuses words
// next to the valid ones (tests/CMakeLists.txt).
BOOST_AUTO_TEST_CASE(the_arithmetic_at_start_up_is_TAPEGRAD_BF16s) {
    const char* const word = std::getenv("TAPEGRAD_BF16");
    const bool asks_exact = word != nullptr && std::string_view(word) == "vdpbf16ps";
    BOOST_TEST_MESSAGE("TAPEGRAD_BF16=" << (word ? word : "(unset)") << ", level " << cpu_level_name(cpu_level()));
    BOOST_TEST((bf16_arithmetic() == (asks_exact ? Bf16Arithmetic::vdpbf16ps : Bf16Arithmetic::fastest)));
    const bool widened = !asks_exact && cpu_level() != CpuLevel::avx512_bf16;
    BOOST_TEST(bf16_products_widened() == widened);
    BOOST_TEST(same(one_element({0x0001}, {bf(0x1p100)}, 0.0f, false), widened ? 0x1p-33f : 0.0f));
}
