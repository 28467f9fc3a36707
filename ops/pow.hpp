/// \file
/// pow: a power with a constant exponent, elementwise, Y = A^p (squares, cubes, inverse square
/// roots p = −1/2, fractional powers of positive quantities).
///   A [...] -> Y [...];  p a constant scalar held in the tape's own precision (Settings).
/// VJP: dA = G ∘ p·A^(p−1). For a > 0, a^p = e^(p ln a) gives d/da = (p/a)·a^p = p·a^(p−1); for an
/// integer p the same power rule holds at every a ≠ 0. A^(p−1) is computed directly, not as Y/A,
/// which would divide by zero at a = 0.
/// Domain, by the exponent:
///   * p not an integer: a^p is real only for a ≥ 0; a negative value raises value_error.
///   * p < 0: 0^p is infinite; a value 0 raises value_error.
///   * p > 0: 0^p = 0, with derivative p·0^(p−1): 0 for p > 1, 1 for p = 1 (0^0 = 1), and
///     infinite for 0 < p < 1 (√a at 0). There, as in ops/sqrt.hpp, the VJP raises value_error
///     when the upstream gradient is non-zero and gives 0 when it is zero. For a non-integer p the
///     derivative at 0 is the one-sided one (a^p is undefined to the left).
///   * p = 0: Y = 1 everywhere (0^0 = 1, as std::pow), derivative 0.
/// A power that overflows to +inf (1e200² in double) raises value_error, as in ops/exp.hpp.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <type_traits>

namespace tapegrad {

struct Pow {
    static constexpr std::string_view name = "pow";
    static constexpr Arity arity{1};

    /// The exponent in the tape's own precision (p = 1/3 rounded to double would cap a 50-digit
    /// graph at 16 digits).
    template <Scalar T>
    struct Settings {
        T p;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("p", s.p)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return pow(in[0], s.p);
    }

    template <Scalar T>
    static bool is_integer(const T& p) {
        using std::floor;
        return T(floor(p)) == p;
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::pow;
        const Tensor<T>& A = *in[0];
        const bool integer_p = is_integer(s.p);
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) {
            const T& a = A[k];
            if ((a < T(0) && !integer_p) || (a == T(0) && s.p < T(0))) {
                throw value_error(fmt::format("pow: value {} at {} of shape {} {} exponent {}", to_double(a),
                                              index_string(A.shape(), k), A.shape().to_string(),
                                              a < T(0) ? "is negative: no real power for the non-integer"
                                                       : "is zero: no finite power for the negative",
                                              to_double(s.p)));
            }
            Y[k] = pow(a, s.p);
            if (!is_finite(Y[k]) && is_finite(a)) {
                throw value_error(fmt::format("pow: value {} at {} of shape {} to the power {} overflows to +inf",
                                              to_double(a), index_string(A.shape(), k), A.shape().to_string(),
                                              to_double(s.p)));
            }
        }
    }

    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        using std::pow;
        const Tensor<T>& A = *at.in[0];
        const T p_minus_1 = s.p - 1;
        for (std::size_t k = 0; k < at.G.size(); ++k) {
            if (s.p == T(0) || at.G[k] == T(0)) {
                dA[k] = T(0);
            } else if (A[k] == T(0) && s.p < T(1)) {
                throw value_error(fmt::format("pow: the derivative p·a^(p−1) with p = {} is infinite at value 0 at "
                                              "{} of shape {}",
                                              to_double(s.p), index_string(A.shape(), k), A.shape().to_string()));
            } else {
                dA[k] = at.G[k] * s.p * T(pow(A[k], p_minus_1));
            }
        }
    }
};

/// p is not deduced, so pow(X, 2) and pow(X, 0.5) work on any tape; an exponent such as 1/3 should
/// be computed in the tape's precision (T(1) / T(3)).
template <Scalar T>
Var<T> pow(const Var<T>& A, const std::type_identity_t<T>& p) {
    checks::non_empty(Pow::name, "A", A);
    return A.tape().template record<Pow>({A}, Pow::Settings<T>{checks::finite(Pow::name, "exponent", p)});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> pow<T>(const Var<T>&, const std::type_identity_t<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
