/// \file
/// gelu: the Gaussian error linear unit, elementwise (the transformer MLP's nonlinearity).
///   A [...] -> Y [...], in one of two forms (Settings::form, GeluForm):
///   * GeluForm::tanh (the DEFAULT, as GPT-2 and torch.nn.GELU(approximate='tanh')):
///       y = ½·a·(1 + t),   t = tanh(u),   u = c·(a + k·a³),   c = √(2/π),   k = 0.044715
///       dy/da = ½·(1 + t) + ½·a·(1 − t²)·c·(1 + 3k·a²)
///   * GeluForm::erf (exact, as torch.nn.GELU() by default):
///       y = a·Φ(a) = ½·a·(1 + erf(a/√2))
///       dy/da = Φ(a) + a·φ(a),   φ(a) = exp(−a²/2)/√(2π)   (Φ' = φ)
/// VJP: dA = G ∘ dy/da, recomputed from the input A. Forgetting the a·(...) term (the slope of the
/// gate itself) would give G∘Φ, which is wrong everywhere but at a = 0.
/// Constants are computed in the tape's own precision (π = 4·atan 1), so a 50-digit tape holds them
/// to 50 digits. float/double take the compiled kernels for the tanh form (autodiff/cpu.hpp: the
/// same formulas through ½(1 + tanh u) = 1/(1 + e^{−2u}), vectorised; equal to rounding).
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/cpu.hpp"
#include "autodiff/tape.hpp"
#include "ops/checks.hpp"
#include "ops/fast/kernels.hpp"

#include <array>
#include <span>
#include <string_view>

namespace tapegrad {

enum class GeluForm {
    tanh,  ///< GPT-2's approximation (default)
    erf,   ///< the exact x·Φ(x)
};

/// The forms' names, by value (a saved tape's "form", autodiff/settings.hpp).
inline constexpr std::array<std::string_view, 2> gelu_form_names{"tanh", "erf"};
constexpr std::span<const std::string_view> choices(GeluForm) { return gelu_form_names; }

struct Gelu {
    static constexpr std::string_view name = "gelu";
    static constexpr Arity arity{1};

    struct Settings {
        GeluForm form = GeluForm::tanh;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("form", s.form)}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return gelu(in[0], s.form);
    }

    /// π and √(2/π) in T's precision, computed once per type: at 50 digits an atan costs more than
    /// the rest of an element's GELU (it was most of a 50-digit replay of the char-LM's step).
    template <Scalar T>
    static const T& pi() {
        using std::atan;
        static const T value = T(4) * T(atan(T(1)));
        return value;
    }
    template <Scalar T>
    static const T& root_two_over_pi() {
        using std::sqrt;
        static const T value = sqrt(T(T(2) / pi<T>()));
        return value;
    }

    template <Scalar T>
    static T value(GeluForm form, const T& a) {
        using std::erf;
        using std::sqrt;
        using std::tanh;
        if (form == GeluForm::erf) return T(a * (T(1) + T(erf(a / T(sqrt(T(2)))))) / T(2));
        const T& c = root_two_over_pi<T>();
        const T t = tanh(T(c * (a + T(0.044715) * a * a * a)));
        return T(a * (T(1) + t) / T(2));
    }

    template <Scalar T>
    static T slope(GeluForm form, const T& a) {
        using std::erf;
        using std::exp;
        using std::sqrt;
        using std::tanh;
        if (form == GeluForm::erf) {
            const T Phi = (T(1) + T(erf(a / T(sqrt(T(2)))))) / T(2);
            const T phi = T(exp(T(-a * a / T(2)))) / T(sqrt(T(T(2) * pi<T>())));
            return Phi + a * phi;
        }
        const T& c = root_two_over_pi<T>();
        const T k(0.044715);
        const T t = tanh(T(c * (a + k * a * a * a)));
        return (T(1) + t) / T(2) + a * (T(1) - t * t) * c * (T(1) + T(3) * k * a * a) / T(2);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        if constexpr (has_compiled_kernels<T>) {
            if (s.form == GeluForm::tanh) return op_kernels<T>().gelu_tanh(A.data().data(), A.size(), Y.data().data());
        }
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = value(s.form, A[k]);
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        if constexpr (has_compiled_kernels<T>) {
            if (s.form == GeluForm::tanh) {
                return op_kernels<T>().gelu_tanh_vjp(A.data().data(), at.G.data().data(), A.size(), dA.data().data());
            }
        }
        for (std::size_t k = 0; k < A.size(); ++k) dA[k] = at.G[k] * slope(s.form, A[k]);
    }
};

template <Scalar T>
Var<T> gelu(const Var<T>& A, GeluForm form = GeluForm::tanh) {
    checks::non_empty(Gelu::name, "A", A);
    return A.tape().template record<Gelu>({A}, Gelu::Settings{form});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> gelu<T>(const Var<T>&, GeluForm);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
