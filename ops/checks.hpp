/// \file
/// Argument checks shared by the ops' public functions (and by the models built on them). Each raises
/// shape_error (value_error for a constant that is not finite) with a message that names the op, the
/// argument and its shape, so a user sees "matmul: inner dimensions differ: A is [2x3], B is [4x2]"
/// rather than a crash or an out-of-bounds read.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <string_view>

namespace tapegrad::checks {

/// The checks run on every op recorded: each test stays small enough to inline, and its message
/// is built out of line.
[[noreturn]] inline void throw_empty(std::string_view op, std::string_view argument, const Shape& shape) {
    throw shape_error(fmt::format("{}: {} is empty (shape {})", op, argument, shape.to_string()));
}

/// Non-empty, rank 2 or more (a matrix or a batch of matrices).
template <Scalar T>
void matrix(std::string_view op, std::string_view argument, const Var<T>& x) {
    const Shape& shape = x.shape();
    if (shape.rank() < 2) [[unlikely]] {
        throw shape_error(fmt::format("{}: {} must be a matrix (rank 2 or more), got shape {}", op, argument,
                                      shape.to_string()));
    }
    if (shape.size() == 0) [[unlikely]] throw_empty(op, argument, shape);
}

/// A constant an op holds (scale's factor, shift's constant, pow's exponent, an operator's
/// constant), refused with value_error when it is not finite; returned for use in place.
template <Scalar T>
const T& finite(std::string_view op, std::string_view what, const T& c) {
    if (!is_finite(c)) [[unlikely]] {
        throw value_error(fmt::format("{}: the {} {} is not finite", op, what, to_double(c)));
    }
    return c;
}

template <Scalar T>
void non_empty(std::string_view op, std::string_view argument, const Var<T>& x) {
    if (x.shape().size() == 0) [[unlikely]] throw_empty(op, argument, x.shape());
}

template <Scalar T>
void same_shape(std::string_view op, const Var<T>& a, const Var<T>& b) {
    non_empty(op, "the first argument", a);
    if (!(a.shape() == b.shape())) {
        throw shape_error(fmt::format("{}: shapes differ: {} and {}", op, a.shape().to_string(),
                                      b.shape().to_string()));
    }
}

/// Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r]: matrices with the same leading dimensions, one
/// width d for queries and keys, one value row per key. Used by fused_attention and by every
/// attention composition in models/, so both refuse the same inputs with the same words.
template <Scalar T>
void attention_inputs(std::string_view op, const Var<T>& Q, const Var<T>& K, const Var<T>& V) {
    matrix(op, "Q", Q);
    matrix(op, "K", K);
    matrix(op, "V", V);
    const Shape& q = Q.shape();
    const Shape& k = K.shape();
    const Shape& v = V.shape();
    if (!q.same_batch(k) || !k.same_batch(v)) {
        throw shape_error(fmt::format("{}: Q, K and V need the same leading dimensions: Q is {}, K is {}, V is {}", op,
                                      q.to_string(), k.to_string(), v.to_string()));
    }
    if (q.cols() != k.cols()) {
        throw shape_error(fmt::format("{}: queries and keys need one width d: Q is {}, K is {}", op, q.to_string(),
                                      k.to_string()));
    }
    if (k.rows() != v.rows()) {
        throw shape_error(fmt::format("{}: one value per key: K is {}, V is {}", op, k.to_string(), v.to_string()));
    }
}

/// value_error when `x` holds an exact 0, naming `op`, the argument, the index and the shape (div
/// and reciprocal share it, so both refuse a zero divisor with the same words).
template <Scalar T>
void no_zero_divisor(std::string_view op, std::string_view argument, const Var<T>& x) {
    const Tensor<T>& values = x.value();
    for (std::size_t k = 0; k < values.size(); ++k) {
        if (values[k] == T(0)) {
            throw value_error(fmt::format("{}: division by zero: {} is 0 at {} of shape {}", op, argument,
                                          index_string(values.shape(), k), values.shape().to_string()));
        }
    }
}

}  // namespace tapegrad::checks
