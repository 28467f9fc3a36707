/// \file
/// add_bias: adds a bias vector to every row, Y = X + b (the affine layers' "+ b").
///   X [..., D], b [D] -> Y [..., D],  Y_{..., j} = X_{..., j} + b_j
/// Not an op of its own: this is add (ops/add.hpp) under a name that says what it is for, with a
/// stricter argument check. add's NumPy broadcasting already stretches a [D] operand over the rows,
/// and its VJP already sums G over the stretched rows: dX = G, db_j = Σ_rows G_{..., j}. A second
/// op with the same forward and VJP would be duplicated code; the tape records one `add` node.
/// What add_bias adds is the check: b must be exactly [D], so a [1 × D] or [D × 1] bias (which add
/// would broadcast into something else) is refused with the op's name and both shapes.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/add.hpp"
#include "ops/checks.hpp"

#include <fmt/core.h>

namespace tapegrad {

template <Scalar T>
Var<T> add_bias(const Var<T>& X, const Var<T>& bias) {
    checks::non_empty("add_bias", "X", X);
    if (X.shape().rank() == 0 || bias.shape().rank() != 1 || bias.shape()[0] != X.shape().cols()) {
        throw shape_error(fmt::format("add_bias: bias is {} but X is {}: the bias must be [{}], one per column",
                                      bias.shape().to_string(), X.shape().to_string(),
                                      X.shape().rank() == 0 ? std::size_t{0} : X.shape().cols()));
    }
    return add(X, bias);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> add_bias<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
