/// \file
/// mask: hides positions of the scores before softmax.
///   S [..., m, n], M [..., m, n] or M [m, n] (one mask for the whole batch); M_ij = 1 visible, 0 hidden.
///   Y_ij = S_ij where M_ij = 1, −inf where M_ij = 0, so softmax gives hidden positions weight 0
///   (a row hidden entirely gets all-zero weights: see ops/softmax.hpp).
/// VJP: dS_ij = G_ij·M_ij. Y does not depend on S at a hidden position, so no gradient flows there.
/// M is a constant (a boolean pattern); it has no gradient.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tape.hpp"

#include <limits>

namespace tapegrad {

struct Mask {
    static constexpr std::string_view name = "mask";
    static constexpr Arity arity{2};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return mask(in[0], in[1]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& S = *in[0];
        out.resize(S.shape());
        for_each_position(*in[1], S.size(), [&](std::size_t k, bool visible) {
            out[k] = visible ? S[k] : -std::numeric_limits<T>::infinity();
        });
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        for_each_position(*at.in[1], at.G.size(), [&](std::size_t k, bool visible) {
            grad[k] = visible ? at.G[k] : T(0);
        });
    }

    /// Calls visit(k, M_k ≠ 0) for k in [0, size): M repeats over the batch when it is one matrix,
    /// walked with a wrapping index (no division per element); large tensors in chunks over the
    /// library's threads (each position written once, so the result is the single thread's).
    template <Scalar T, class Visit>
    static void for_each_position(const Tensor<T>& M, std::size_t size, const Visit& visit) {
        const std::size_t period = M.size();
        parallel_chunks(size, elementwise_grain, [&](std::size_t first, std::size_t last) {
            std::size_t j = first % period;
            for (std::size_t k = first; k < last; ++k) {
                visit(k, M[j] != T(0));
                if (++j == period) j = 0;
            }
        });
    }
};

template <Scalar T>
Var<T> mask(const Var<T>& S, const Var<T>& M) {
    checks::matrix(Mask::name, "S", S);
    checks::matrix(Mask::name, "M", M);
    const Shape& s = S.shape();
    const Shape& m = M.shape();
    if (!(m == s) && !(m.rank() == 2 && m.rows() == s.rows() && m.cols() == s.cols())) {
        throw shape_error(fmt::format("mask: mask of shape {} does not fit scores of shape {}", m.to_string(),
                                      s.to_string()));
    }
    for (std::size_t k = 0; k < m.size(); ++k) {
        const T& x = M.value()[k];
        if (x != T(0) && x != T(1)) {
            throw value_error(fmt::format("mask: mask value {} at {}; a mask holds 0 (hidden) or 1 (visible)",
                                          to_double(x), index_string(m, k)));
        }
    }
    return S.tape().template record<Mask>({S, M});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> mask<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
