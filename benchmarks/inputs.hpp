// Inputs shared by the benchmark programs: seeded normal tensors, the spec's attention inputs
// (X, W_Q, W_K, W_V and the probe G), and, when LibTorch is found, the copy of a tensor that
// LibTorch times on.
#pragma once

#include "autodiff/tensor.hpp"

#include <random>

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif

namespace tapegrad::bench {

inline Tensor<double> random_tensor(const Shape& shape, std::mt19937_64& rng) {
    std::normal_distribution<double> normal(0.0, 1.0);
    Tensor<double> t(shape);
    for (double& x : t.data()) x = normal(rng);
    return t;
}

struct AttentionInputs {
    Tensor<double> X, W_Q, W_K, W_V, G;
};

inline AttentionInputs make_inputs(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    return {random_tensor(Shape{T, D}, rng), random_tensor(Shape{D, d}, rng), random_tensor(Shape{D, d}, rng),
            random_tensor(Shape{D, d}, rng), random_tensor(Shape{T, d}, rng)};
}

#ifdef TAPEGRAD_HAVE_TORCH
// A LibTorch copy of a matrix, in double unless `dtype` says otherwise (float32 for the float runs).
inline torch::Tensor to_torch(const Tensor<double>& t, bool requires_grad, torch::ScalarType dtype = torch::kDouble) {
    const auto options = torch::TensorOptions().dtype(torch::kDouble);
    torch::Tensor copy = torch::from_blob(const_cast<double*>(t.data().data()),
                                          {static_cast<long>(t.rows()), static_cast<long>(t.cols())}, options)
                             .to(dtype, false, true);
    return copy.requires_grad_(requires_grad);
}
#endif

}  // namespace tapegrad::bench
