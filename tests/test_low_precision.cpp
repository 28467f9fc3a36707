// Tests of autodiff/low_precision.hpp: rounding a double to bfloat16 and float16 and reading a
// pattern back, at every boundary the standard defines (ties to even both ways, the largest finite
// and the overflow threshold, the smallest normal, subnormals and their underflow to zero, signed
// zeros, infinities, NaN), and exhaustively: every one of the 65,536 patterns of each format reads
// back to a value that rounds to the same pattern, and every double between two neighbours rounds
// to the nearer one (the even one at the midpoint). A fault control (rounding half away from zero,
// as a truncating + 0.5 implementation does) is rejected by the same tie checks.
#define BOOST_TEST_MODULE low_precision
#include "support.hpp"

#include "autodiff/low_precision.hpp"

#include <bit>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

using namespace tapegrad;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// The format's next pattern up in magnitude (for positive finite patterns).
double next_up(HalfFormat f, std::uint16_t bits) { return half_value(f, std::uint16_t(bits + 1)); }

// Half away from zero at ties (the fault control): round_to_half's result, moved to the larger
// neighbour wherever x was exactly halfway.
double round_half_away(HalfFormat f, double x) {
    const double r = round_to_half(f, x);
    if (!std::isfinite(r) || r == 0) return r;
    const std::uint16_t bits = half_bits(f, std::fabs(x));
    const double below = half_value(f, bits), above = next_up(f, bits);
    if (std::fabs(x) - below == above - std::fabs(x) && std::fabs(x) > below) return std::copysign(above, x);
    return r;
}

// Whether `round` sends each midpoint between neighbouring patterns [lo, hi) to the even one.
template <class Round>
bool ties_go_to_even(HalfFormat f, Round round) {
    for (std::uint32_t bits = 0; bits < f.exponent_mask(); ++bits) {  // positive finite, below the largest
        const double lo = half_value(f, std::uint16_t(bits)), hi = next_up(f, std::uint16_t(bits));
        if (std::isinf(hi)) continue;
        const double even = (bits & 1) == 0 ? lo : hi;
        if (round(f, lo + (hi - lo) / 2) != even) return false;
    }
    return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(layouts_are_the_standards) {
    BOOST_TEST(bfloat16_value(0x3f80) == 1.0);
    BOOST_TEST(bfloat16_value(0x4049) == 3.140625);            // π in bfloat16
    BOOST_TEST(bfloat16_value(0x7f7f) == std::ldexp(255.0, 120));  // largest finite (2 − 2⁻⁷)·2¹²⁷
    BOOST_TEST(bfloat16_value(0x0080) == std::ldexp(1.0, -126));   // smallest normal
    BOOST_TEST(bfloat16_value(0x0001) == std::ldexp(1.0, -133));   // smallest subnormal
    BOOST_TEST(float16_value(0x3c00) == 1.0);
    BOOST_TEST(float16_value(0x7bff) == 65504.0);
    BOOST_TEST(float16_value(0x0400) == std::ldexp(1.0, -14));
    BOOST_TEST(float16_value(0x0001) == std::ldexp(1.0, -24));
    BOOST_TEST(float16_value(0xc000) == -2.0);
    BOOST_TEST(bfloat16_value(0x7f80) == inf);
    BOOST_TEST(float16_value(0xfc00) == -inf);
    BOOST_TEST(std::isnan(bfloat16_value(0x7fc0)));
    BOOST_TEST(std::isnan(float16_value(0x7e00)));
    // bfloat16 is float32's upper half: each pattern's value is that float's.
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
        const float as_float = std::bit_cast<float>(bits << 16);
        const double value = bfloat16_value(std::uint16_t(bits));
        if (std::isnan(as_float)) BOOST_TEST(std::isnan(value));
        else if (value != double(as_float)) BOOST_FAIL("bfloat16 pattern " << bits << " is not float32's upper half");
    }
}

BOOST_AUTO_TEST_CASE(boundaries_round_as_the_standard_says) {
    const double one_ulp = std::ldexp(1.0, -7);  // bfloat16's spacing at 1
    BOOST_TEST(bfloat16_bits(1.0 + one_ulp / 2) == 0x3f80);                 // tie, to the even 1.0
    BOOST_TEST(bfloat16_bits(1.0 + 3 * one_ulp / 2) == 0x3f82);             // tie, to the even 1 + 2⁻⁶
    BOOST_TEST(bfloat16_bits(std::nextafter(1.0 + one_ulp / 2, 2.0)) == 0x3f81);  // just past the tie: up
    BOOST_TEST(bfloat16_bits(-(1.0 + one_ulp / 2)) == 0xbf80);              // ties alike below zero
    const double largest = std::ldexp(255.0, 120), half_spacing = std::ldexp(1.0, 119);
    BOOST_TEST(bfloat16_bits(largest) == 0x7f7f);
    BOOST_TEST(bfloat16_bits(std::nextafter(largest + half_spacing, 0.0)) == 0x7f7f);  // below the threshold
    BOOST_TEST(bfloat16_bits(largest + half_spacing) == 0x7f80);                      // the tie: to inf (even)
    BOOST_TEST(bfloat16_bits(-1e300) == 0xff80);
    BOOST_TEST(float16_bits(65504.0 + 15.999) == 0x7bff);
    BOOST_TEST(float16_bits(65520.0) == 0x7c00);  // 65504 + 16: the tie past the largest, to inf
    const double tiny = std::ldexp(1.0, -133);    // bfloat16's smallest subnormal
    BOOST_TEST(bfloat16_bits(tiny) == 0x0001);
    BOOST_TEST(bfloat16_bits(tiny / 2) == 0x0000);                       // tie with 0: to the even 0
    BOOST_TEST(bfloat16_bits(std::nextafter(tiny / 2, 1.0)) == 0x0001);  // past it: up
    BOOST_TEST(bfloat16_bits(-tiny / 4) == 0x8000);                      // underflow keeps the sign
    BOOST_TEST(bfloat16_bits(3 * tiny / 2) == 0x0002);                   // subnormal tie to even
    BOOST_TEST(bfloat16_bits(std::ldexp(1.0, -126) - tiny / 2) == 0x0080);  // rounds up into the normals
    BOOST_TEST(float16_bits(std::ldexp(1.0, -25)) == 0x0000);
    BOOST_TEST(float16_bits(std::ldexp(3.0, -26)) == 0x0001);
    BOOST_TEST(bfloat16_bits(0.0) == 0x0000);
    BOOST_TEST(bfloat16_bits(-0.0) == 0x8000);
    BOOST_TEST(float16_bits(-0.0) == 0x8000);
    BOOST_TEST(bfloat16_bits(inf) == 0x7f80);
    BOOST_TEST(float16_bits(-inf) == 0xfc00);
    BOOST_TEST(bfloat16_bits(std::numeric_limits<double>::quiet_NaN()) == 0x7fc0);
    BOOST_TEST(bfloat16_bits(-std::numeric_limits<double>::quiet_NaN()) == 0xffc0);
    BOOST_TEST(float16_bits(std::numeric_limits<double>::signaling_NaN()) == 0x7e00);  // made quiet
    // A double rounded once, not through float: 1 + 2⁻⁸ + 2⁻³⁰ is just above bfloat16's tie at
    // 1 + 2⁻⁸, so it rounds up; through float32 it would first become the tie 1 + 2⁻⁸ and go down.
    const double above_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
    BOOST_TEST(bfloat16_bits(above_tie) == 0x3f81);
    BOOST_TEST(bfloat16_bits(double(float(above_tie))) == 0x3f80);
}

BOOST_AUTO_TEST_CASE(every_pattern_and_every_neighbourhood_round_trips) {
    for (const HalfFormat f : {bfloat16_format, float16_format}) {
        BOOST_TEST_CONTEXT((f.fraction_bits == 7 ? "bfloat16" : "float16")) {
            std::size_t mismatches = 0;
            for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
                const double v = half_value(f, std::uint16_t(bits));
                if (std::isnan(v)) {
                    mismatches += (half_bits(f, v) & f.exponent_mask()) != f.exponent_mask();
                    continue;
                }
                mismatches += half_bits(f, v) != bits;
            }
            BOOST_TEST(mismatches == 0u);
            // Random doubles between neighbours: the nearer one (ties are the case above).
            std::mt19937_64 rng(f.fraction_bits);
            std::uniform_int_distribution<std::uint32_t> pattern(0, f.exponent_mask() - 2u);
            std::uniform_real_distribution<double> where(0.0, 1.0);
            std::size_t wrong = 0;
            for (int k = 0; k < 200000; ++k) {
                const auto bits = std::uint16_t(pattern(rng));
                const double lo = half_value(f, bits), hi = next_up(f, bits), x = lo + where(rng) * (hi - lo);
                const double nearer = x - lo < hi - x ? lo : (x - lo > hi - x ? hi : ((bits & 1) ? hi : lo));
                wrong += round_to_half(f, x) != nearer || round_to_half(f, -x) != -nearer;
            }
            BOOST_TEST(wrong == 0u);
        }
    }
}

BOOST_AUTO_TEST_CASE(ties_go_to_even_and_the_half_away_fault_is_rejected) {
    for (const HalfFormat f : {bfloat16_format, float16_format}) {
        BOOST_TEST(ties_go_to_even(f, round_to_half));
        BOOST_TEST(!ties_go_to_even(f, round_half_away));  // the control: the check can fail
    }
}
