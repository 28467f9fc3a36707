/// \file
/// fmt support for tapegrad: `fmt::format("{}", tensor)` prints nested rows like Python lists,
/// `[[0.75, 0.25], [0.25, 0.75]]`; `{:.6}` sets the significant digits. Works for float, double
/// and the multiprecision types. Without a precision every value prints so that it reads back
/// exactly: shortest round-trip form for float/double, max_digits10 digits (53 for mp50) for
/// multiprecision types. `{:.0}` is the same as no precision.
/// Shapes print as "[2x3]".
#pragma once

#include "autodiff/tensor.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <string>

namespace tapegrad {

/// One scalar as text: `precision` significant digits when precision > 0; otherwise the
/// round-trip form (shortest for float/double, max_digits10 digits for multiprecision types).
template <Scalar T>
std::string format_scalar(const T& x, int precision = 0) {
    if constexpr (std::floating_point<T>) {
        return precision > 0 ? fmt::format("{:.{}g}", x, precision) : fmt::format("{}", x);
    } else {
        return x.str(precision > 0 ? precision : std::numeric_limits<T>::max_digits10);  // default flags
    }
}

namespace detail {

template <Scalar T>
std::string tensor_text_of(const Tensor<T>& tensor, int precision) {
    const Shape& shape = tensor.shape();
    if (shape.rank() == 0) return format_scalar(tensor[0], precision);
    if (tensor.size() == 0) return std::string(shape.rank(), '[') + std::string(shape.rank(), ']');
    std::string text;
    // Open a bracket at every axis boundary the flat index crosses, close likewise.
    for (std::size_t flat = 0; flat < tensor.size(); ++flat) {
        std::size_t opened = 0, stride = 1;
        for (std::size_t axis = shape.rank(); axis-- > 0;) {
            stride *= shape[axis];
            if (flat % stride == 0) ++opened;
        }
        if (flat > 0) text += ", ";
        text.append(opened, '[');
        text += format_scalar(tensor[flat], precision);
        std::size_t closed = 0;
        stride = 1;
        for (std::size_t axis = shape.rank(); axis-- > 0;) {
            stride *= shape[axis];
            if ((flat + 1) % stride == 0) ++closed;
        }
        text.append(closed, ']');
    }
    return text;
}

}  // namespace detail

/// A tensor as nested rows, each value as format_scalar writes it with `precision`. Compiled once,
/// in the library (src/io/format.cpp), for float, double and mp50 (declared in autodiff/mp50.hpp): fmt's
/// formatting code costs a program that prints a tensor seconds of compile time otherwise. Other
/// types use the template.
std::string tensor_text(const Tensor<float>& tensor, int precision = 0);
std::string tensor_text(const Tensor<double>& tensor, int precision = 0);

template <Scalar T>
std::string tensor_text(const Tensor<T>& tensor, int precision = 0) {
    return detail::tensor_text_of(tensor, precision);
}

}  // namespace tapegrad

/// \cond EXTERNAL_SPECIALIZATIONS (Doxygen cannot place a specialization of an fmt class)
// (The formatters use fmt/core.h only, so that a program printing tensors need not compile
// fmt/format.h; a bad format spec raises fmt::format_error through fmt's own thrower.)
template <>
struct fmt::formatter<tapegrad::Shape> {
    constexpr auto parse(format_parse_context& context) {
        auto it = context.begin();
        if (it != context.end() && *it != '}') fmt::detail::throw_format_error("shape format: expected nothing");
        return it;
    }
    auto format(const tapegrad::Shape& shape, format_context& context) const {
        const std::string text = shape.to_string();
        return std::copy(text.begin(), text.end(), context.out());
    }
};

template <tapegrad::Scalar T>
struct fmt::formatter<tapegrad::Tensor<T>> {
    static constexpr int max_precision = 1000;
    int precision = 0;

    constexpr auto parse(format_parse_context& context) {
        auto it = context.begin();
        if (it != context.end() && *it == '.') {
            ++it;
            int digits = 0;
            while (it != context.end() && *it >= '0' && *it <= '9') {
                digits = digits * 10 + (*it++ - '0');
                // More digits than any supported type holds is a typo; also keeps `digits` from overflowing.
                if (digits > max_precision) fmt::detail::throw_format_error("tensor format: precision above 1000");
            }
            precision = digits;
        }
        if (it != context.end() && *it != '}') fmt::detail::throw_format_error("tensor format: expected '.N' or nothing");
        return it;
    }

    auto format(const tapegrad::Tensor<T>& tensor, format_context& context) const {
        const std::string text = tapegrad::tensor_text(tensor, precision);
        return std::copy(text.begin(), text.end(), context.out());
    }
};
/// \endcond
