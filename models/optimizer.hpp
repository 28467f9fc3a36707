/// \file
/// The optimizer on the tape's gradients: Adam (Kingma & Ba, 2015) with decoupled weight decay
/// (AdamW, Loshchilov & Hutter, 2019), a warm-up + cosine learning-rate schedule, and clipping of
/// all gradients by their global norm. Parameters live outside the tape as tensors; each step
/// reads their gradients and updates them in place. Every formula is PyTorch's (torch.optim.AdamW,
/// torch.nn.utils.clip_grad_norm_, 1.13), in the same order of operations, so a float64 PyTorch
/// run from the same parameters on the same batches follows the same trajectory.
///
/// AdamW step t (t = 1, 2, ...), for each parameter θ with gradient g, lr the current rate, λ the
/// weight decay (0: plain Adam):
///   θ ← θ·(1 − lr·λ)                       decoupled decay, only for parameters of rank ≥ 2 when
///                                          DecayScope::matrices (nanoGPT's rule: weight matrices
///                                          and embeddings decay; gains and biases do not)
///   m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²
///   θ ← θ − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)
/// The bias corrections undo m's and v's pull towards their zero start in the first steps.
///
/// Precision (BasicAdam<T>, T = double or float; Adam is BasicAdam<double>): as PyTorch trains a
/// float32 model, the parameters, the gradients and the moments m and v are T, and every per-entry
/// operation above is done in T. The per-step scalars (lr, the bias corrections 1 − β^t and their
/// root, lr / (1 − β1^t), 1 − lr·λ, 1 − β) are computed in double, as PyTorch computes them in
/// Python floats, and rounded to T once where they meet the tensors (PyTorch's CPU kernels round a
/// Python scalar to the tensor's type).
///
/// Roundings, per entry, as PyTorch's CPU kernels make them (its add_(g, alpha) and addcmul_ are a
/// fused multiply-add, addcdiv_ multiplies before it divides):
///   m ← fma(1−β1, g, β1·m),   v ← fma((1−β2)·g, g, β2·v),   θ ← θ + (−step·m) / (√v / c2 + ε)
/// With them the trajectories equal torch.optim.AdamW's to the last bit, in float32 and float64,
/// whenever clipping does not act (tests/test_optimizer_torch.cpp, 6 steps of 8 such cases; with
/// clipping, the global norm is summed in another order and the parameters differ by < 1 ulp).
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tensor.hpp"

#include <fmt/core.h>

#include <cmath>
#include <concepts>
#include <numbers>
#include <span>
#include <vector>

namespace tapegrad {

/// Which parameters weight decay applies to.
enum class DecayScope {
    matrices,  ///< rank >= 2 only (weights, embeddings), not gains and biases
    all,
};

struct AdamSettings {
    double learning_rate = 1e-2;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-8;
    double weight_decay = 0.0;  ///< λ; > 0 makes this AdamW
    DecayScope decay_scope = DecayScope::matrices;
};

/// Adam's moments and step count, for saving and resuming a run exactly.
template <std::floating_point T>
struct BasicAdamState {
    std::vector<Tensor<T>> first, second;  ///< m and v, one per parameter, in the parameters' type
    std::size_t steps = 0;
};
using AdamState = BasicAdamState<double>;

template <std::floating_point T>
class BasicAdam {
public:
    using State = BasicAdamState<T>;

    explicit BasicAdam(AdamSettings settings = {}) : settings_(settings) {
        if (!(settings.learning_rate > 0) || !(settings.beta1 >= 0 && settings.beta1 < 1) ||
            !(settings.beta2 >= 0 && settings.beta2 < 1) || !(settings.epsilon > 0) || !(settings.weight_decay >= 0)) {
            throw value_error(fmt::format("Adam: settings out of range (learning rate {}, beta1 {}, beta2 {}, "
                                          "epsilon {}, weight decay {}); need lr > 0, 0 <= beta < 1, epsilon > 0, "
                                          "weight decay >= 0",
                                          settings.learning_rate, settings.beta1, settings.beta2, settings.epsilon,
                                          settings.weight_decay));
        }
    }

    /// One update of every parameter from its gradient (same order and shapes on every call).
    void step(std::span<Tensor<T>* const> parameters, std::span<const Tensor<T>* const> gradients) {
        if (parameters.size() != gradients.size()) {
            throw usage_error(fmt::format("Adam::step: {} parameters but {} gradients", parameters.size(),
                                          gradients.size()));
        }
        if (state_.first.empty()) {
            for (const Tensor<T>* p : parameters) {
                state_.first.emplace_back(p->shape());
                state_.second.emplace_back(p->shape());
            }
        }
        if (state_.first.size() != parameters.size()) {
            throw usage_error(fmt::format("Adam::step: {} parameters, but the optimizer was started with {}",
                                          parameters.size(), state_.first.size()));
        }
        ++state_.steps;
        for (std::size_t i = 0; i < parameters.size(); ++i) update(i, *parameters[i], *gradients[i]);
    }

    std::size_t steps() const { return state_.steps; }
    double learning_rate() const { return settings_.learning_rate; }
    /// For a schedule (decay): the rate used by the following steps.
    void set_learning_rate(double rate) {
        if (!(rate > 0)) throw value_error(fmt::format("Adam: learning rate {} must be positive", rate));
        settings_.learning_rate = rate;
    }
    const State& state() const { return state_; }
    /// Resumes from a saved state (the moments' shapes are checked against the parameters at the next step).
    void restore(State state) {
        if (state.first.size() != state.second.size()) {
            throw usage_error(fmt::format("Adam::restore: {} first moments but {} second moments", state.first.size(),
                                          state.second.size()));
        }
        state_ = std::move(state);
    }

private:
    void update(std::size_t i, Tensor<T>& theta, const Tensor<T>& g) {
        if (!(theta.shape() == g.shape()) || !(theta.shape() == state_.first[i].shape()) ||
            !(theta.shape() == state_.second[i].shape())) {
            throw shape_error(fmt::format("Adam::step: parameter {} is {}, its gradient {}, its state {}", i,
                                          theta.shape().to_string(), g.shape().to_string(),
                                          state_.first[i].shape().to_string()));
        }
        const AdamSettings& s = settings_;
        // The step's scalars in double, each rounded to T once (see the header comment).
        const double t = static_cast<double>(state_.steps);
        const T negative_step_size = static_cast<T>(-(s.learning_rate / (1 - std::pow(s.beta1, t))));
        const T correction2_root = static_cast<T>(std::sqrt(1 - std::pow(s.beta2, t)));
        const bool decays = s.weight_decay > 0 && (s.decay_scope == DecayScope::all || theta.rank() >= 2);
        const T shrink = static_cast<T>(1 - s.learning_rate * s.weight_decay);
        const T beta1 = static_cast<T>(s.beta1), rest1 = static_cast<T>(1 - s.beta1);
        const T beta2 = static_cast<T>(s.beta2), rest2 = static_cast<T>(1 - s.beta2);
        const T epsilon = static_cast<T>(s.epsilon);
        for (std::size_t k = 0; k < theta.size(); ++k) {
            T& m = state_.first[i][k];
            T& v = state_.second[i][k];
            if (decays) theta[k] *= shrink;
            m = std::fma(rest1, g[k], T(m * beta1));  // the header says why fma: PyTorch's roundings
            v = std::fma(T(rest2 * g[k]), g[k], T(v * beta2));
            theta[k] += T(negative_step_size * m) / (std::sqrt(v) / correction2_root + epsilon);
        }
    }

    AdamSettings settings_;
    State state_;
};

/// The double optimizer every existing caller names; AdamW is Adam with AdamSettings::weight_decay
/// > 0 (decoupled: θ shrinks by lr·λ·θ each step).
using Adam = BasicAdam<double>;
using AdamW = Adam;

/// Linear warm-up, then cosine decay to a floor (nanoGPT's schedule). For step s = 0, 1, ...:
///   s < W:           lr = peak · (s + 1) / W
///   W <= s < S:      lr = floor + ½ (peak − floor) (1 + cos(π (s − W) / (S − W))),  floor = peak·floor_ratio
///   s >= S:          lr = floor
/// with W = warmup_steps and S = total_steps.
struct WarmupCosine {
    double peak = 1e-3;
    std::size_t warmup_steps = 100;
    std::size_t total_steps = 1000;
    double floor_ratio = 0.1;

    double rate(std::size_t s) const {
        const double floor = peak * floor_ratio;
        if (s < warmup_steps) return peak * static_cast<double>(s + 1) / static_cast<double>(warmup_steps);
        if (s >= total_steps) return floor;
        const double progress =
            static_cast<double>(s - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
        return floor + 0.5 * (peak - floor) * (1 + std::cos(std::numbers::pi * progress));
    }
};

/// Scales all gradients together so that their global norm ‖g‖ (the 2-norm over every entry of
/// every tensor) is at most max_norm, as torch.nn.utils.clip_grad_norm_: ‖g‖ is the norm of the
/// per-tensor norms (PyTorch's order of summation), and with c = max_norm / (‖g‖ + 1e-6) every entry
/// is multiplied by c when c < 1. Returns ‖g‖ before clipping. The update keeps its direction; only
/// a step of exploding size is shortened. For float gradients the squares are summed in double (a
/// float sum over 10⁵ entries would lose digits the coefficient does not need to lose, and the norm
/// is a figure the user reads) and c, computed in double, is rounded to float where it is applied.
/// Overloads rather than a template, so that a std::array or std::vector of pointers still converts.
/// Compiled in the library (src/models/optimizer.cpp): a program that includes the models does not
/// compile the loops and the message again.
double clip_by_global_norm(std::span<Tensor<double>* const> gradients, double max_norm);
double clip_by_global_norm(std::span<Tensor<float>* const> gradients, double max_norm);

}  // namespace tapegrad
