/// \file
/// merge_heads: the inverse of split_heads; puts the heads' outputs side by side again before the
/// output projection W_O.
///   X [..., H, T, dh] -> Y [..., T, H·dh]      (X of rank 3 or 4)
///   Y_{b,t,h·dh+c} = X_{b,h,t,c}
/// VJP: dX_{b,h,t,c} = G_{b,t,h·dh+c}: the inverse permutation of G (that is split_heads).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/split_heads.hpp"

namespace tapegrad {

struct MergeHeads {
    static constexpr std::string_view name = "merge_heads";
    static constexpr Arity arity{1};

    static Shape output_shape(const Shape& x) {
        std::vector<std::size_t> dims(x.dims().begin(), x.dims().end() - 3);
        const std::size_t H = x[x.rank() - 3];
        dims.insert(dims.end(), {x.rows(), H * x.cols()});
        return Shape(std::span<const std::size_t>(dims));
    }

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return merge_heads(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const std::size_t H = X.shape()[X.rank() - 3];
        Y.resize(output_shape(X.shape()));
        detail::permute_heads(X.data().data(), Y.data().data(), X.shape().batch() / H, H, X.rows(), X.cols(), false);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& X = *at.in[0];
        const std::size_t H = X.shape()[X.rank() - 3];
        detail::permute_heads(at.G.data().data(), dX.data().data(), X.shape().batch() / H, H, X.rows(), X.cols(), true);
    }
};

template <Scalar T>
Var<T> merge_heads(const Var<T>& X) {
    checks::matrix(MergeHeads::name, "X", X);
    if (X.shape().rank() < 3) {
        throw shape_error(fmt::format("merge_heads: X must be [H, T, dh] or [B, H, T, dh], got {}",
                                      X.shape().to_string()));
    }
    return X.tape().template record<MergeHeads>({X});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> merge_heads<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
