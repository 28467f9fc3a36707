// Adam (Kingma & Ba, 2015) on the tape's gradients: parameters live outside the tape as tensors,
// each step reads their gradients from the tape and updates them in place.
//   m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²,   θ ← θ − lr·m̂ / (√v̂ + ε)
// with the bias corrections m̂ = m/(1−β1^t), v̂ = v/(1−β2^t) for the first steps, when m and v
// are still pulled towards their zero start.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tensor.hpp"

#include <fmt/format.h>

#include <cmath>
#include <span>
#include <vector>

namespace tapegrad {

struct AdamSettings {
    double learning_rate = 1e-2;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-8;
};

class Adam {
public:
    explicit Adam(AdamSettings settings = {}) : settings_(settings) {
        if (!(settings.learning_rate > 0) || !(settings.beta1 >= 0 && settings.beta1 < 1) ||
            !(settings.beta2 >= 0 && settings.beta2 < 1) || !(settings.epsilon > 0)) {
            throw value_error(fmt::format("Adam: settings out of range (learning rate {}, beta1 {}, beta2 {}, "
                                          "epsilon {}); need lr > 0, 0 <= beta < 1, epsilon > 0",
                                          settings.learning_rate, settings.beta1, settings.beta2, settings.epsilon));
        }
    }

    // One update of every parameter from its gradient (same order and shapes on every call).
    void step(std::span<Tensor<double>* const> parameters, std::span<const Tensor<double>* const> gradients) {
        if (parameters.size() != gradients.size()) {
            throw usage_error(fmt::format("Adam::step: {} parameters but {} gradients", parameters.size(),
                                          gradients.size()));
        }
        if (first_.empty()) {
            for (const Tensor<double>* p : parameters) {
                first_.emplace_back(p->shape());
                second_.emplace_back(p->shape());
            }
        }
        if (first_.size() != parameters.size()) {
            throw usage_error(fmt::format("Adam::step: {} parameters, but the optimizer was started with {}",
                                          parameters.size(), first_.size()));
        }
        ++steps_;
        const double correction1 = 1 - std::pow(settings_.beta1, static_cast<double>(steps_));
        const double correction2 = 1 - std::pow(settings_.beta2, static_cast<double>(steps_));
        for (std::size_t i = 0; i < parameters.size(); ++i) {
            Tensor<double>& theta = *parameters[i];
            const Tensor<double>& g = *gradients[i];
            if (!(theta.shape() == g.shape()) || !(theta.shape() == first_[i].shape())) {
                throw shape_error(fmt::format("Adam::step: parameter {} is {}, its gradient {}, its state {}", i,
                                              theta.shape().to_string(), g.shape().to_string(),
                                              first_[i].shape().to_string()));
            }
            for (std::size_t k = 0; k < theta.size(); ++k) {
                double& m = first_[i][k];
                double& v = second_[i][k];
                m = settings_.beta1 * m + (1 - settings_.beta1) * g[k];
                v = settings_.beta2 * v + (1 - settings_.beta2) * g[k] * g[k];
                theta[k] -= settings_.learning_rate * (m / correction1) / (std::sqrt(v / correction2) + settings_.epsilon);
            }
        }
    }

    std::size_t steps() const { return steps_; }
    double learning_rate() const { return settings_.learning_rate; }
    // For a schedule (decay): the rate used by the following steps.
    void set_learning_rate(double rate) {
        if (!(rate > 0)) throw value_error(fmt::format("Adam: learning rate {} must be positive", rate));
        settings_.learning_rate = rate;
    }

private:
    AdamSettings settings_;
    std::vector<Tensor<double>> first_, second_;
    std::size_t steps_ = 0;
};

}  // namespace tapegrad
