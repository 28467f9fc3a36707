/// \file
/// The 16-bit floating-point formats, bfloat16 and IEEE binary16 (float16), as bit patterns: a
/// double rounded once to the format, round-to-nearest-even as IEEE 754 defines it, and a pattern
/// read back exactly. One definition for every place that stores or reads 16-bit values (the
/// safetensors reader and writer, the precision audit's simulated storage).
///   format     sign  exponent (bias)  fraction  smallest subnormal  smallest normal  largest finite
///   bfloat16   1     8 (127)          7         2⁻¹³³              2⁻¹²⁶             (2 − 2⁻⁷)·2¹²⁷
///   float16    1     5 (15)           10        2⁻²⁴               2⁻¹⁴              65504
/// Rounding from double directly (not through float, which would round twice): the nearest
/// representable value, ties to the even fraction; subnormals kept (gradual underflow), a value
/// at or above the largest finite plus half its spacing becomes ±inf, the sign of zero is kept,
/// ±inf stays, NaN becomes the format's quiet NaN with the sign of its input (payloads are not
/// kept: a double's payload has no place in 7 or 10 bits).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tapegrad {

/// A 16-bit format's layout.
struct HalfFormat {
    int fraction_bits;  ///< stored fraction bits: 7 (bfloat16) or 10 (float16)
    int bias;           ///< exponent bias: 127 or 15

    constexpr int min_exponent() const { return 1 - bias; }      ///< of the smallest normal
    constexpr int max_exponent() const { return bias; }          ///< of the largest finite
    constexpr std::uint16_t exponent_mask() const { return std::uint16_t(0x7fff & ~((1u << fraction_bits) - 1)); }
};

inline constexpr HalfFormat bfloat16_format{7, 127};
inline constexpr HalfFormat float16_format{10, 15};

/// `x` rounded to the nearest value of `f` (ties to even), as a double; ±inf past the largest
/// finite's half spacing; NaN as it came.
inline double round_to_half(HalfFormat f, double x) {
    if (!std::isfinite(x) || x == 0) return x;
    const int exponent = std::max(std::ilogb(x), f.min_exponent());  // subnormals share the smallest quantum
    const double quantum = std::ldexp(1.0, exponent - f.fraction_bits);
    const double rounded = std::nearbyint(x / quantum) * quantum;  // x / quantum is exact (a power of 2)
    const double largest = std::ldexp(2.0 - std::ldexp(1.0, -f.fraction_bits), f.max_exponent());
    return std::fabs(rounded) > largest ? std::copysign(std::numeric_limits<double>::infinity(), x) : rounded;
}

/// The bit pattern of `x` rounded to `f`.
inline std::uint16_t half_bits(HalfFormat f, double x) {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (std::isnan(x)) return std::uint16_t(sign | f.exponent_mask() | (1u << (f.fraction_bits - 1)));  // quiet NaN
    const double r = std::fabs(round_to_half(f, x));
    if (std::isinf(r)) return std::uint16_t(sign | f.exponent_mask());
    if (r == 0) return sign;
    const int exponent = std::ilogb(r);
    if (exponent < f.min_exponent()) {  // subnormal: the fraction counts the smallest quanta
        return std::uint16_t(sign | std::uint16_t(std::ldexp(r, f.fraction_bits - f.min_exponent())));
    }
    const auto fraction = std::uint16_t(std::ldexp(r, f.fraction_bits - exponent) - std::ldexp(1.0, f.fraction_bits));
    return std::uint16_t(sign | std::uint16_t((exponent + f.bias) << f.fraction_bits) | fraction);
}

/// The value of a bit pattern of `f`, exactly (subnormals, ±0, ±inf, NaN).
inline double half_value(HalfFormat f, std::uint16_t bits) {
    const int biased = (bits & f.exponent_mask()) >> f.fraction_bits;
    const int fraction = bits & ((1 << f.fraction_bits) - 1);
    const int all_ones = f.exponent_mask() >> f.fraction_bits;
    double magnitude;
    if (biased == 0) magnitude = std::ldexp(double(fraction), f.min_exponent() - f.fraction_bits);
    else if (biased == all_ones) magnitude = fraction == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
    else magnitude = std::ldexp(double(fraction + (1 << f.fraction_bits)), biased - f.bias - f.fraction_bits);
    return (bits & 0x8000) != 0 ? -magnitude : magnitude;
}

inline std::uint16_t bfloat16_bits(double x) { return half_bits(bfloat16_format, x); }
inline std::uint16_t float16_bits(double x) { return half_bits(float16_format, x); }
inline double bfloat16_value(std::uint16_t bits) { return half_value(bfloat16_format, bits); }
inline double float16_value(std::uint16_t bits) { return half_value(float16_format, bits); }

}  // namespace tapegrad
