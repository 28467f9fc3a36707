// Shape checks shared by the ops' public functions. Each raises shape_error with a message that
// names the op, the argument and its shape, so a user sees "matmul: inner dimensions differ:
// A is [2x3], B is [4x2]" rather than a crash or an out-of-bounds read.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tape.hpp"

#include <fmt/format.h>

#include <string_view>

namespace tapegrad::checks {

// Non-empty, rank 2 or more (a matrix or a batch of matrices).
template <Scalar T>
void matrix(std::string_view op, std::string_view argument, const Var<T>& x) {
    const Shape& shape = x.shape();
    if (shape.rank() < 2) {
        throw shape_error(fmt::format("{}: {} must be a matrix (rank 2 or more), got shape {}", op, argument,
                                      shape.to_string()));
    }
    if (shape.size() == 0) {
        throw shape_error(fmt::format("{}: {} is empty (shape {})", op, argument, shape.to_string()));
    }
}

template <Scalar T>
void non_empty(std::string_view op, std::string_view argument, const Var<T>& x) {
    if (x.shape().size() == 0) {
        throw shape_error(fmt::format("{}: {} is empty (shape {})", op, argument, x.shape().to_string()));
    }
}

template <Scalar T>
void same_shape(std::string_view op, const Var<T>& a, const Var<T>& b) {
    non_empty(op, "the first argument", a);
    if (!(a.shape() == b.shape())) {
        throw shape_error(fmt::format("{}: shapes differ: {} and {}", op, a.shape().to_string(),
                                      b.shape().to_string()));
    }
}

}  // namespace tapegrad::checks
