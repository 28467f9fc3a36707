/// \file
/// fused_attention_bf16: fused attention (ops/fused_attention.hpp) whose tile products read
/// bfloat16 and sum in float32, as matmul_bf16 reads and sums. A float tape records it for every
/// fused_attention once Tape::set_product_precision(ProductPrecision::bfloat16) is set, so the
/// fused path follows the policy as the composed one does (its Q·Kᵀ and A·V are matmul_bf16 there).
///   shapes and settings as fused_attention: Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r] -> O [..., Tq, r]
/// The function is fused_attention's, O = softmax(Q·Kᵀ/√d + mask + bias)·V; bfloat16 is how a float
/// tape computes it, not part of it. On a Tape<float>: each of the seven tile products (the
/// forward's S = Q_i·K_jᵀ and P·V_j; the VJP's S again, dP = dO_i·V_jᵀ, Pᵀ·dO_i, dSᵀ·Q_i, dS·K_j)
/// reads its two operands rounded to bfloat16 (nearest, ties to even) and sums in float32
/// (kernels::gemm_bf16: vdpbf16ps where the CPU has AVX512_BF16, widened elsewhere); Q, K, V and
/// dO are rounded once per call and dS once per tile, not once per product (Dims::read_once);
/// everything between the products (the scale, exp, the running max and sum l, D, dS's
/// elementwise formula) stays float32. So P is rounded where it meets V and dO, but l sums the
/// unrounded P: the same split FlashAttention makes in bfloat16. On every other scalar type (double,
/// 50 digits, duals): fused_attention itself, which is what a check re-runs and what the
/// precision audit holds the bfloat16 run to.
/// VJP: fused_attention's (G = dO), its tile products read in bfloat16 on a float tape:
///   dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ∘ (dP − D),  dQ = c·dS·K,  dK = c·dSᵀ·Q.
/// `input_format` (autodiff/op.hpp) tells the precision estimate that this op reads bfloat16.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/low_precision.hpp"
#include "autodiff/tape.hpp"
#include "ops/fused_attention.hpp"

#include <span>
#include <string_view>
#include <type_traits>

namespace tapegrad {

struct FusedAttentionBf16 {
    static constexpr std::string_view name = "fused_attention_bf16";
    static constexpr Arity arity{3};
    using Settings = FusedAttention::Settings;
    static constexpr HalfFormat input_format = bfloat16_format;
    using hooks_of = FusedAttentionBf16;  ///< the one-pass vjp_all below
    static constexpr auto fields(auto& s) { return FusedAttention::fields(s); }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return fused_attention_bf16(in[0], in[1], in[2], s);
    }

    template <Scalar T>
    static void forward(const Settings& settings, Inputs<T> in, Tensor<T>& O, Tensor<T>& saved) {
        fused_detail::attend(dims<T>(settings, in), in, O, saved);
    }

    template <Scalar T>
    static void vjp_all(const Settings& settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        fused_detail::backward(dims<T>(settings, at.in), at, grads);
    }

    template <Scalar T>
    static OpCost cost(const Settings& settings, Inputs<T> in) {
        return FusedAttention::cost<T>(settings, in);
    }

private:
    /// bfloat16 tile products on a float tape; the exact ones (fused_attention's) on any other.
    template <Scalar T>
    static fused_detail::Dims<T> dims(const Settings& settings, Inputs<T> in) {
        constexpr ProductPrecision products =
            std::is_same_v<T, float> ? ProductPrecision::bfloat16 : ProductPrecision::tape;
        return fused_detail::Dims<T>(settings, in, name, products);
    }
};

/// fused_attention recorded with bfloat16 tile products (see the top of this file), whatever the
/// tape's policy; fused_attention records this on a float tape under the bfloat16 policy.
template <Scalar T>
Var<T> fused_attention_bf16(const Var<T>& Q, const Var<T>& K, const Var<T>& V,
                            const FusedAttention::Settings& settings) {
    fused_detail::check_call(FusedAttentionBf16::name, Q, K, V, settings);
    return Q.tape().template record<FusedAttentionBf16>({Q, K, V}, settings);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T)                                                                  \
    TAPEGRAD_INSTANCE Var<T> fused_attention_bf16<T>(const Var<T>&, const Var<T>&, const Var<T>&, \
                                                     const FusedAttention::Settings&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
