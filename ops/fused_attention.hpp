// fused_attention: attention as one op, O = softmax(Q·Kᵀ/√d + causal mask)·V, that never stores the
// T×T matrices. PLACEHOLDER: the signature is fixed here so models can be written against it;
// the implementation is being written now and this declaration throws until it lands.
//   Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r] -> O [..., Tq, r] (same leading dimensions)
//   causal: query i sees key j only when j <= query_offset + i.
#pragma once

#include "autodiff/tape.hpp"

namespace tapegrad {

template <Scalar T>
Var<T> fused_attention(const Var<T>&, const Var<T>&, const Var<T>&, bool /*causal*/, std::size_t /*query_offset*/) {
    throw usage_error("fused_attention: not implemented yet");
}

}  // namespace tapegrad
