/// \file
/// The compiled part of models/optimizer.hpp: clip_by_global_norm for double and float gradients,
/// kept out of the header so that every program including the models (the quickstart among them)
/// does not compile its loops and its message again.
#include "models/optimizer.hpp"

#include <fmt/core.h>

#include <cmath>
#include <span>

namespace tapegrad {

namespace detail {
template <std::floating_point T>
double clip_by_global_norm(std::span<Tensor<T>* const> gradients, double max_norm) {
    if (!(max_norm > 0)) throw value_error(fmt::format("clip_by_global_norm: max_norm {} must be positive", max_norm));
    double norms_squared = 0;
    for (const Tensor<T>* g : gradients) {
        double squares = 0;
        for (const T x : g->data()) squares += static_cast<double>(x) * static_cast<double>(x);
        const double norm = std::sqrt(squares);
        norms_squared += norm * norm;
    }
    const double norm = std::sqrt(norms_squared);
    const double coefficient = max_norm / (norm + 1e-6);
    if (coefficient < 1) {
        const T c = static_cast<T>(coefficient);
        for (Tensor<T>* g : gradients)
            for (T& x : g->data()) x *= c;
    }
    return norm;
}
}  // namespace detail

double clip_by_global_norm(std::span<Tensor<double>* const> gradients, double max_norm) {
    return detail::clip_by_global_norm<double>(gradients, max_norm);
}
double clip_by_global_norm(std::span<Tensor<float>* const> gradients, double max_norm) {
    return detail::clip_by_global_norm<float>(gradients, max_norm);
}

}  // namespace tapegrad
