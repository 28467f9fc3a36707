/// \file
/// Arithmetic operators on Var<T>, so a graph reads as a formula: a * b + c, (x - mu) / sigma,
/// 1.0 - p. Each operator records exactly the named ops below, nothing else, so a graph written
/// with operators has the same nodes, DOT picture and checker branch names ("x via mul") as the
/// same graph written with named calls:
///   a + b -> add(a, b)     a - b -> sub(a, b)     a * b -> mul(a, b)     a / b -> div(a, b)
///            (Var with Var, NumPy broadcasting: ops/broadcast.hpp)
///   -a    -> neg(a)
///   a + c, c + a -> shift(a, c)      a - c -> shift(a, -c)       c - a -> shift(neg(a), c)
///   a * c, c * a -> scale(a, c)      a / c -> scale(a, 1/c)      c / a -> scale(reciprocal(a), c)
/// A constant c is a T or any arithmetic type (double, float, int): `a * 2.0` works on a 50-digit
/// tape. It is converted to T first (a double is exact in mp50), and −c and 1/c are computed in T,
/// so a / 3.0 on a 50-digit tape scales by a 50-digit 1/3. Note that a / c multiplies by the
/// rounded 1/c, which on a double tape can differ from a true division in the last bit.
/// Errors are those of the named ops (shapes that do not broadcast, a zero divisor, a non-finite
/// constant), plus a / 0 for a constant 0, refused with value_error; an operator that records two
/// ops checks its constant before recording the first, so a refused operator records nothing.
#pragma once

#include "ops/add.hpp"
#include "ops/checks.hpp"
#include "ops/div.hpp"
#include "ops/mul.hpp"
#include "ops/neg.hpp"
#include "ops/reciprocal.hpp"
#include "ops/scale.hpp"
#include "ops/shift.hpp"
#include "ops/sub.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <concepts>
#include <string_view>
#include <type_traits>

namespace tapegrad {

/// A plain number an operator accepts beside a Var<T>: T itself, or an arithmetic type other than
/// bool. A Var is neither, so Var ⊕ Var never matches the constant overloads (no ambiguity).
template <class C, class T>
concept ConstantFor = std::same_as<C, T> || (std::is_arithmetic_v<C> && !std::same_as<C, bool>);


template <Scalar T>
Var<T> operator+(const Var<T>& a, const Var<T>& b) {
    return add(a, b);
}
template <Scalar T>
Var<T> operator-(const Var<T>& a, const Var<T>& b) {
    return sub(a, b);
}
template <Scalar T>
Var<T> operator*(const Var<T>& a, const Var<T>& b) {
    return mul(a, b);
}
template <Scalar T>
Var<T> operator/(const Var<T>& a, const Var<T>& b) {
    return div(a, b);
}
template <Scalar T>
Var<T> operator-(const Var<T>& a) {
    return neg(a);
}

template <Scalar T, ConstantFor<T> C>
Var<T> operator+(const Var<T>& a, const C& c) {
    return shift(a, T(c));
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator+(const C& c, const Var<T>& a) {
    return shift(a, T(c));
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator-(const Var<T>& a, const C& c) {
    return shift(a, T(-T(c)));
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator-(const C& c, const Var<T>& a) {
    const T constant = checks::finite("operator-", "constant", T(c));
    return shift(neg(a), constant);
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator*(const Var<T>& a, const C& c) {
    return scale(a, T(c));
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator*(const C& c, const Var<T>& a) {
    return scale(a, T(c));
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator/(const Var<T>& a, const C& c) {
    const T constant = checks::finite("operator/", "constant", T(c));
    if (constant == T(0)) throw value_error("operator/: division by zero: a / c with the constant c = 0");
    return scale(a, T(T(1) / constant));
}
template <Scalar T, ConstantFor<T> C>
Var<T> operator/(const C& c, const Var<T>& a) {
    const T constant = checks::finite("operator/", "constant", T(c));
    return scale(reciprocal(a), constant);
}

}  // namespace tapegrad
