/// \file
/// transpose: swaps the last two dimensions, per matrix of a batch.
///   X [..., m, n] -> Y [..., n, m],  Y_ji = X_ij
/// VJP: dX = Gᵀ  (each output coordinate is one input coordinate, moved back).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <algorithm>

namespace tapegrad {

struct Transpose {
    static constexpr std::string_view name = "transpose";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return transpose(in[0]);
    }

    template <Scalar T>
    static void swap_last_two(const Tensor<T>& x, Tensor<T>& y) {
        const std::size_t m = x.rows(), n = x.cols(), batch = x.shape().batch();
        y.resize(x.shape().with_matrix(n, m));
        const T* source = x.data().data();
        T* target = y.data().data();
        for (std::size_t b = 0; b < batch; ++b, source += m * n, target += m * n) copy_transposed(source, m, n, target);
    }

    /// target (n×m) = sourceᵀ (m×n), tile by tile: a tile's 16 rows copied one by one would write
    /// 16 elements a target row apart, and at m = 256 doubles those fall into a few cache sets (7%
    /// of an attention step at T = 256). Inside a tile, the side with the longer rows is walked
    /// contiguously and the other one with the stride: at m = 1024 floats (Kᵀ in attention at
    /// T = 1024) stepping the writes by m took 200 µs, the reads by n = 64 23 µs.
    template <Scalar T>
    static void copy_transposed(const T* source, std::size_t m, std::size_t n, T* target) {
        constexpr std::size_t tile = 16;
        for (std::size_t i0 = 0; i0 < m; i0 += tile)
            for (std::size_t j0 = 0; j0 < n; j0 += tile) {
                const std::size_t i1 = std::min(i0 + tile, m), j1 = std::min(j0 + tile, n);
                if (m > n) {  // target rows are the longer: write them contiguously
                    for (std::size_t j = j0; j < j1; ++j)
                        for (std::size_t i = i0; i < i1; ++i) target[j * m + i] = source[i * n + j];
                } else {  // source rows are the longer (or as long): read them contiguously
                    for (std::size_t i = i0; i < i1; ++i)
                        for (std::size_t j = j0; j < j1; ++j) target[j * m + i] = source[i * n + j];
                }
            }
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        swap_last_two(*in[0], out);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        swap_last_two(at.G, grad);
    }
};

template <Scalar T>
Var<T> transpose(const Var<T>& X) {
    checks::matrix(Transpose::name, "X", X);
    return X.tape().template record<Transpose>({X});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> transpose<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
