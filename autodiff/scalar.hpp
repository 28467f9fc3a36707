/// \file
/// Scalar types tapegrad computes in, and the few math helpers that must work for all of them:
/// float, double, Boost.Multiprecision's numbers (mp50, the checker's 50-digit reference type, is
/// autodiff/mp50.hpp), and Dual over any of them (a value and a tangent, forward mode:
/// autodiff/dual.hpp), once or twice. This header does not include Boost.Multiprecision: a program that records
/// and checks tapes of float or double compiles nothing of it (the light headers, tapegrad_record.hpp).
#pragma once

#include "autodiff/dual.hpp"

#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace tapegrad {

/// A real scalar: a built-in floating type, or a Boost.Multiprecision number (recognised by its
/// backend type and numeric_limits, so that this header need not include Boost.Multiprecision).
template <class T>
concept RealScalar = std::floating_point<T> ||
                     (requires { typename T::backend_type; } && std::numeric_limits<T>::is_specialized &&
                      !std::numeric_limits<T>::is_integer);

/// A real scalar, a Dual over one (forward mode), or a Dual over a Dual over one (second order in
/// forward mode: certified Hessian-vector products, check/certify.hpp).
template <class T>
concept Scalar = RealScalar<T> || (is_dual_v<T> && RealScalar<typename T::value_type>) ||
                 (is_dual_v<T> && is_dual_v<typename T::value_type> && RealScalar<typename T::value_type::value_type>);

/// The numbers a scalar is stored as: a `Dual<U>` is its value then its tangent, two U's in a row
/// (standard layout, no padding: asserted below), so a scan over a whole array (the tape's NaN
/// check) may read n duals as 2n numbers of U, as `std::complex<U>` is read as `U[2]`.
template <class T>
struct StoredAs {
    using type = T;
    static constexpr std::size_t count = 1;
};
template <class T>
    requires is_dual_v<T>
struct StoredAs<T> {
    using type = typename T::value_type;
    static constexpr std::size_t count = 2;
    static_assert(std::is_standard_layout_v<T> && sizeof(T) == 2 * sizeof(type));
};

/// n duals as the 2n numbers they are stored as (value, tangent, value, ...), for the kernels that
/// split them into planes and merge them back (autodiff/dual_kernels.hpp, ops/fast/softmax_rows.hpp).
template <class T>
    requires is_dual_v<T>
const typename StoredAs<T>::type* pairs_of(const T* duals) {
    return reinterpret_cast<const typename StoredAs<T>::type*>(duals);
}
template <class T>
    requires is_dual_v<T>
typename StoredAs<T>::type* pairs_of(T* duals) {
    return reinterpret_cast<typename StoredAs<T>::type*>(duals);
}

/// Unit roundoff of T (half the machine epsilon).
template <Scalar T>
T unit_roundoff() {
    return std::numeric_limits<T>::epsilon() / 2;
}

/// Converts any supported scalar to double (rounding), for reports and comparisons in double; a
/// dual number gives its value.
template <Scalar T>
double to_double(const T& x) {
    if constexpr (std::floating_point<T>) {
        return static_cast<double>(x);
    } else if constexpr (is_dual_v<T>) {
        return to_double(x.value());
    } else {
        return x.template convert_to<double>();
    }
}

/// 1/sqrt(n) computed in T's own precision (the attention scale 1/sqrt(d)); computing it in
/// double and converting would cap a 50-digit graph at 16 digits.
template <Scalar T>
T inv_sqrt(std::size_t n) {
    using std::sqrt;
    return T(1) / T(sqrt(T(n)));
}

/// |x| for any supported scalar (std::abs for builtins, Boost's for multiprecision).
template <Scalar T>
T magnitude(const T& x) {
    using std::abs;
    return T(abs(x));
}

/// (Boost.Multiprecision's isnan and isfinite are found by argument-dependent lookup.)
template <Scalar T>
bool is_nan(const T& x) {
    using std::isnan;
    return isnan(x);
}

template <Scalar T>
bool is_finite(const T& x) {
    using std::isfinite;
    return isfinite(x);
}

}  // namespace tapegrad
