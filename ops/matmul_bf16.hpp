/// \file
/// matmul_bf16: the matrix product C = A·B read in bfloat16 and accumulated in float32, the
/// product PyTorch's CPU autocast to bfloat16 runs. A float tape records it for every matmul once
/// Tape::set_product_precision(ProductPrecision::bfloat16) is set (ops/matmul.hpp), or a program
/// calls it by name.
///   shapes as matmul: A [..., m, k] · B [..., k, n] or B [k, n] -> C [..., m, n]
/// The function is the product itself, C = A·B; bfloat16 is how a float tape computes it, not part
/// of it. On a Tape<float>: A and B rounded to bfloat16 (nearest, ties to even: bfloat16_from_float,
/// as the product packs them), their products summed in float32 (kernels::gemm_bf16: vdpbf16ps where
/// the CPU has AVX512_BF16; elsewhere widened to float32 and multiplied by the float32 product, or
/// vdpbf16ps emulated exactly under TAPEGRAD_BF16=vdpbf16ps), C kept in float32. On every other scalar
/// type (double, 50 digits, duals): the exact product, matmul's, which is what a check re-runs
/// and what the precision audit holds the bfloat16 run to.
/// VJP (G = dJ/dC), matmul's, with G, A and B read in bfloat16 on a float tape:
///   dA = G·Bᵀ
///   dB = Aᵀ·G          (summed over the batch when B is shared)
/// `input_format` (autodiff/op.hpp) tells the precision estimate that this op reads bfloat16.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/kernels.hpp"
#include "autodiff/low_precision.hpp"
#include "autodiff/tape.hpp"
#include "ops/matmul.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace tapegrad {

struct MatMulBf16 {
    static constexpr std::string_view name = "matmul_bf16";
    static constexpr Arity arity{2};
    using Settings = NoSettings;
    static constexpr HalfFormat input_format = bfloat16_format;
    using hooks_of = MatMulBf16;  ///< declares vjp_all (both inputs from one rounded G)
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return matmul_bf16(in[0], in[1]);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& C, Tensor<T>& saved) {
        if constexpr (!std::is_same_v<T, float>) {
            MatMul::forward<T>(s, in, C, saved);
        } else {
            const MatMul::Dims d = MatMul::dims(*in[0], *in[1]);
            const float *const a = in[0]->data().data(), *const b = in[1]->data().data();
            C.resize(in[0]->shape().with_matrix(in[0]->rows(), in[1]->cols()));
            for (std::size_t n = 0; n < d.batch; ++n) {
                kernels::gemm_bf16(kernels::Form::ab, d.m, d.n, d.k, a + n * d.m * d.k, b + n * d.k * d.n,
                                   C.data().data() + n * d.m * d.n, false);
            }
        }
    }

    template <Scalar T>
    static void vjp_all(const Settings& s, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        if constexpr (!std::is_same_v<T, float>) {
            MatMul::vjp_all<T>(s, at, grads);
        } else {
            const MatMul::Dims d = MatMul::dims(*at.in[0], *at.in[1]);
            // G feeds both products. When both are wanted it is rounded to bfloat16 once, here, into
            // the bits each product would round it to as it packs it (kernels::round_to_bf16 is that
            // rounding): one pass over G instead of two, and dA's product reads G's rows in place.
            // With one wanted, the floats, which that product rounds. (In this template, not a class
            // of its own: a program that does not instantiate it compiles none of it.)
            std::vector<std::uint16_t> G_bits;
            if (grads[0] != nullptr && grads[1] != nullptr) {
                G_bits.resize(at.G.size());
                kernels::round_to_bf16(at.G.data().data(), at.G.size(), G_bits.data());
            }
            const auto G_at = [&](std::size_t offset) -> kernels::Bf16Operand {
                if (G_bits.empty()) return at.G.data().data() + offset;
                return G_bits.data() + offset;
            };
            if (Tensor<float>* dA = grads[0]; dA != nullptr) {  // dA = G·Bᵀ
                const float* const b = at.in[1]->data().data();
                for (std::size_t n = 0; n < d.batch; ++n) {
                    kernels::gemm_bf16(kernels::Form::abT, d.m, d.k, d.n, G_at(n * d.m * d.n), b + n * d.k * d.n,
                                       dA->data().data() + n * d.m * d.k, false);
                }
            }
            if (Tensor<float>* dB = grads[1]; dB != nullptr) {  // dB = Aᵀ·G
                const float* const a = at.in[0]->data().data();
                for (std::size_t n = 0; n < d.batch; ++n) {
                    kernels::gemm_bf16(kernels::Form::aTb, d.k, d.n, d.m, a + n * d.m * d.k, G_at(n * d.m * d.n),
                                       dB->data().data() + n * d.k * d.n, false);
                }
            }
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings& s, Inputs<T> in) {
        return MatMul::cost<T>(s, in);
    }
};

template <Scalar T>
Var<T> matmul_bf16(const Var<T>& A, const Var<T>& B) {
    MatMul::check_shapes(MatMulBf16::name, A, B);
    return A.tape().template record<MatMulBf16>({A, B});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> matmul_bf16<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
