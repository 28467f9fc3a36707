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
/// The bfloat16 policy of a float32 tape's products (ProductPrecision, below) rounds with
/// bfloat16_from_float, the same rounding done on a float's bits, fast enough for every product.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

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

/// bfloat16_bits(x) for a float, on its bits: adding 0x7fff plus the kept part's lowest bit and
/// dropping the low 16 bits rounds to nearest, ties to even (carries run into the exponent, so
/// the largest float's neighbours become inf and a subnormal may become the smallest normal, as
/// they should); ±inf stays; NaN becomes the quiet NaN of its sign. Equal to bfloat16_bits(double(x))
/// for every float (tests/test_low_precision.cpp holds them together at every boundary).
inline std::uint16_t bfloat16_from_float(float x) {
    const auto bits = std::bit_cast<std::uint32_t>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t(((bits >> 16) & 0x8000u) | 0x7fc0u);
    return std::uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/// A bfloat16 pattern as the float it is exactly (every bfloat16 is a float: its top 16 bits).
inline float float_from_bfloat16(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

/// Every element of `from` rounded to bfloat16 into `to` (as long), by bfloat16_from_float: the
/// copy a product reads under ProductPrecision::bfloat16 (a loop the compiler vectorises).
inline void round_to_bfloat16(std::span<const float> from, std::span<std::uint16_t> to) {
    for (std::size_t k = 0; k < from.size(); ++k) to[k] = bfloat16_from_float(from[k]);
}

/// What a float32 tape's matrix products read (Tape::set_product_precision): the tape's own
/// scalars, or bfloat16 copies accumulated in float32, as PyTorch's CPU autocast to bfloat16 runs
/// its matmuls (ops/matmul_bf16.hpp; docs/design.md says what stays float32 and why).
enum class ProductPrecision {
    tape,      ///< the tape's own type (the default)
    bfloat16,  ///< inputs rounded to bfloat16, products accumulated in float32
};

inline constexpr std::array<std::string_view, 2> product_precision_names{"tape", "bfloat16"};
constexpr std::span<const std::string_view> choices(ProductPrecision) { return product_precision_names; }

}  // namespace tapegrad
