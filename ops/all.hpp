/// \file
/// Every op header, and the one list of the library's op structs (LibraryOps). tapegrad.hpp includes it for users; `src/instances/<type>.cpp`
/// include it with TAPEGRAD_INSTANTIATE_FOR defined, so each header's instance list
/// (autodiff/instances.hpp) compiles its entry points for that type. (operators.hpp forwards to
/// add, sub, mul, div, neg, shift and scale, and has no instances of its own.)
#pragma once

#include "ops/abs.hpp"
#include "ops/add.hpp"
#include "ops/add_bias.hpp"
#include "ops/clamp.hpp"
#include "ops/concat.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/div.hpp"
#include "ops/dropout.hpp"
#include "ops/embedding.hpp"
#include "ops/exp.hpp"
#include "ops/fused_attention.hpp"
#include "ops/fused_attention_bf16.hpp"
#include "ops/gelu.hpp"
#include "ops/layer_norm.hpp"
#include "ops/log.hpp"
#include "ops/log1p.hpp"
#include "ops/log_softmax.hpp"
#include "ops/logsumexp.hpp"
#include "ops/mask.hpp"
#include "ops/matmul.hpp"
#include "ops/matmul_bf16.hpp"
#include "ops/max.hpp"
#include "ops/mean.hpp"
#include "ops/merge_heads.hpp"
#include "ops/mul.hpp"
#include "ops/neg.hpp"
#include "ops/operators.hpp"
#include "ops/permute.hpp"
#include "ops/pow.hpp"
#include "ops/reciprocal.hpp"
#include "ops/relu.hpp"
#include "ops/repeat_heads.hpp"
#include "ops/reshape.hpp"
#include "ops/rms_norm.hpp"
#include "ops/rope.hpp"
#include "ops/scale.hpp"
#include "ops/shift.hpp"
#include "ops/sigmoid.hpp"
#include "ops/silu.hpp"
#include "ops/slice.hpp"
#include "ops/softmax.hpp"
#include "ops/split_heads.hpp"
#include "ops/sqrt.hpp"
#include "ops/sub.hpp"
#include "ops/sum.hpp"
#include "ops/sum_axis.hpp"
#include "ops/tanh.hpp"
#include "ops/transpose.hpp"

namespace tapegrad {

/// The library's ops: every op struct of the headers above, once. The registry of ops
/// (src/instances/registry.cpp: each op's siblings and saved form, made from its struct; an op here
/// without arity, record or fields does not compile) and the tests' coverage checks
/// (tests/support.hpp's library_op_names) are made from it, so a new op struct goes here and
/// nowhere else of those.
using LibraryOps =
    OpList<Abs, Add, Clamp, Concat, CrossEntropy, Div, Dropout, Embedding, Exp, FusedAttention, FusedAttentionBf16,
           Gelu, LayerNorm, Log, Log1p, LogSoftmax, LogSumExp, Mask, MatMul, MatMulBf16, Max, Mean, MergeHeads, Mul,
           Neg, Permute, Pow, Reciprocal, Relu, RepeatHeads, Reshape, RmsNorm, Rope, Scale, Shift, Sigmoid, Silu, Slice,
           Softmax, SplitHeads, Sqrt, Sub, Sum, SumAxis, Tanh, Transpose>;

}  // namespace tapegrad
