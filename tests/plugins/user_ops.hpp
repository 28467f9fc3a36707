// A user's op for the registry's tests (tests/test_registry.cpp) and the shared libraries they load
// (tests/plugins/*.cpp): affine(x; a, b) = a·x + b, with settings in the tape's precision, declared
// as any op is (autodiff/op.hpp: name, arity, Settings, fields, record, forward, VJP).
//   VJP: dx = a·G  (∂y_i/∂x_i = a).
#pragma once

#include <tapegrad.hpp>

#include <span>
#include <string_view>

namespace user_ops {

using tapegrad::Inputs;
using tapegrad::Scalar;
using tapegrad::Tensor;
using tapegrad::Var;
using tapegrad::VjpArgs;

template <Scalar T>
Var<T> affine(const Var<T>& x, const T& a, const T& b);

struct Affine {
    static constexpr std::string_view name = "affine";
    static constexpr tapegrad::Arity arity{1};
    template <Scalar T>
    struct Settings {
        T a, b;
    };
    static constexpr auto fields(auto& s) { return std::tuple{tapegrad::field("a", s.a), tapegrad::field("b", s.b)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return affine(in[0], s.a, s.b);
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& y, Tensor<T>&) {
        y.resize(in[0]->shape());
        for (std::size_t k = 0; k < y.size(); ++k) y[k] = s.a * (*in[0])[k] + s.b;
    }
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dx) {
        for (std::size_t k = 0; k < dx.size(); ++k) dx[k] = s.a * at.G[k];
    }
};

template <Scalar T>
Var<T> affine(const Var<T>& x, const T& a, const T& b) {
    return x.tape().template record<Affine>({x}, Affine::Settings<T>{a, b});
}

}  // namespace user_ops
