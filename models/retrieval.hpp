/// \file
/// A small trainable causal model for the spec's retrieval step, made real.
///
/// Task: a sequence of `pairs` (key, value) positions, then one query position. Each position
/// carries its key and its value together (the sum of a key embedding and a value embedding, plus a
/// learned position embedding); the query position carries a key and the "ask" token in place of
/// a value. The target is the value stored under the query's key earlier in the sequence. Keys in
/// a sequence are distinct, so the answer is unique; chance accuracy is 1/values.
/// Carrying key and value on one position is what lets ONE attention layer solve it: the last
/// query matches the earlier key (Q·Kᵀ) and reads that same position's value (A·V). With keys and
/// values on separate tokens, one layer cannot read "the token after the match".
///
/// Model (every step an op with a hand-derived VJP; the loss is cross-entropy):
///   X = E[key tokens] + E[value tokens] + P[positions]              [B, T, D]
///   Y = multihead causal attention(X; W_Q, W_K, W_V, W_O)           [B, T, D]
///   logits = Y[last position of each sequence]·W_U                   [B, values]
///   J = cross_entropy(logits, targets)
/// Parameters live as tensors outside the tape and are updated by Adam (models/optimizer.hpp).
#pragma once

#include "models/multihead.hpp"
#include "models/optimizer.hpp"
#include "ops/add.hpp"
#include "ops/operators.hpp"
#include "ops/cross_entropy.hpp"
#include "ops/embedding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace tapegrad {

struct RetrievalConfig {
    std::size_t keys = 32;    ///< distinct keys
    std::size_t values = 32;  ///< distinct values (the classes of the answer)
    std::size_t pairs = 12;   ///< stored (key, value) positions before the query
    std::size_t width = 32;   ///< model width D
    std::size_t heads = 4;
    std::uint64_t seed = 1;   ///< parameter initialisation
    AttentionKernel kernel = AttentionKernel::composed;  ///< or fused (ops/fused_attention.hpp)

    std::size_t length() const { return pairs + 1; }
    std::size_t vocabulary() const { return keys + values + 1; }  // keys, values, the ask token
    std::size_t ask_token() const { return keys + values; }
};

/// B sequences, sequence-major token lists for the embedding gathers.
struct RetrievalBatch {
    std::size_t size = 0;    ///< B
    std::size_t length = 0;  ///< T
    std::vector<std::size_t> key_tokens, value_tokens, positions;  ///< B·T each
    std::vector<std::size_t> last_rows;  ///< row b·T + T − 1 of the flattened [B·T, D] output
    std::vector<std::size_t> targets;    ///< B answers in [0, values)
};

/// An integer in [0, n) from the generator's raw output (portable across standard libraries,
/// unlike std::uniform_int_distribution, so a seed gives the same data everywhere: the PyTorch
/// cross-check and tapegrad-check draw with it too; the modulo bias of n ≤ 2^10 out of 2^64 is
/// negligible).
inline std::size_t draw_below(std::mt19937_64& generator, std::size_t n) {
    return static_cast<std::size_t>(generator() % n);
}

/// Uniform in [−a, a), portable.
inline double draw_uniform(std::mt19937_64& generator, double a) {
    return (static_cast<double>(generator() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a;
}

inline void check_retrieval_config(const RetrievalConfig& c) {
    if (c.pairs == 0 || c.pairs > c.keys || c.values < 2 || c.width == 0 || c.heads == 0 || c.width % c.heads != 0) {
        throw value_error(fmt::format("retrieval: bad config (keys {}, values {}, pairs {}, width {}, heads {}): need "
                                      "1 <= pairs <= keys, values >= 2, width a positive multiple of heads",
                                      c.keys, c.values, c.pairs, c.width, c.heads));
    }
}

inline RetrievalBatch make_retrieval_batch(const RetrievalConfig& config, std::size_t batch_size,
                                           std::mt19937_64& generator) {
    check_retrieval_config(config);
    if (batch_size == 0) throw value_error("make_retrieval_batch: batch size 0");
    const std::size_t T = config.length();
    RetrievalBatch batch;
    batch.size = batch_size;
    batch.length = T;
    std::vector<std::size_t> keys(config.keys);
    for (std::size_t b = 0; b < batch_size; ++b) {
        std::iota(keys.begin(), keys.end(), std::size_t{0});
        for (std::size_t i = 0; i < config.pairs; ++i) {  // partial Fisher–Yates: distinct keys
            std::swap(keys[i], keys[i + draw_below(generator, config.keys - i)]);
        }
        std::vector<std::size_t> values(config.pairs);
        for (std::size_t& v : values) v = draw_below(generator, config.values);
        const std::size_t asked = draw_below(generator, config.pairs);
        for (std::size_t t = 0; t < config.pairs; ++t) {
            batch.key_tokens.push_back(keys[t]);
            batch.value_tokens.push_back(config.keys + values[t]);
        }
        batch.key_tokens.push_back(keys[asked]);
        batch.value_tokens.push_back(config.ask_token());
        for (std::size_t t = 0; t < T; ++t) batch.positions.push_back(t);
        batch.last_rows.push_back(b * T + T - 1);
        batch.targets.push_back(values[asked]);
    }
    return batch;
}

/// Sequences [begin, end) of `batch`: one worker's slice in data-parallel training.
inline RetrievalBatch slice_of(const RetrievalBatch& batch, std::size_t begin, std::size_t end) {
    if (!(begin < end && end <= batch.size)) {
        throw value_error(fmt::format("slice_of: sequences [{}, {}) of a batch of {}", begin, end, batch.size));
    }
    const std::size_t T = batch.length;
    const auto rows = [&](const std::vector<std::size_t>& v, std::size_t per_sequence) {
        return std::vector<std::size_t>(v.begin() + static_cast<std::ptrdiff_t>(begin * per_sequence),
                                        v.begin() + static_cast<std::ptrdiff_t>(end * per_sequence));
    };
    RetrievalBatch slice{end - begin, T, rows(batch.key_tokens, T), rows(batch.value_tokens, T),
                         rows(batch.positions, T), {}, rows(batch.targets, 1)};
    for (std::size_t b = 0; b < slice.size; ++b) slice.last_rows.push_back(b * T + T - 1);
    return slice;
}

/// The parameters, as plain tensors (what the optimizer updates).
struct RetrievalParameters {
    Tensor<double> E;    ///< token embeddings [vocabulary × D]
    Tensor<double> P;    ///< position embeddings [T × D]
    Tensor<double> W_Q, W_K, W_V, W_O;  ///< [D × D] each
    Tensor<double> W_U;  ///< read-out [D × values]

    static RetrievalParameters initial(const RetrievalConfig& config) {
        check_retrieval_config(config);
        std::mt19937_64 generator(config.seed);
        const std::size_t D = config.width;
        // Uniform with variance 1/3·a²: a = 1 for embeddings (entries of order one), and
        // a = √(3/D) for projections, so a projection keeps the variance of its input.
        const auto random = [&](Shape shape, double a) {
            Tensor<double> t(shape);
            for (double& x : t.data()) x = draw_uniform(generator, a);
            return t;
        };
        const double projection = std::sqrt(3.0 / static_cast<double>(D));
        return {random(Shape{config.vocabulary(), D}, 1.0),
                random(Shape{config.length(), D}, 1.0),
                random(Shape{D, D}, projection),
                random(Shape{D, D}, projection),
                random(Shape{D, D}, projection),
                random(Shape{D, D}, projection),
                random(Shape{D, config.values}, projection)};
    }

    std::array<Tensor<double>*, 7> all() { return {&E, &P, &W_Q, &W_K, &W_V, &W_O, &W_U}; }
};

/// The parameters as leaves of one tape.
template <Scalar T>
struct RetrievalVars {
    Var<T> E, P, W_Q, W_K, W_V, W_O, W_U;
};

/// logits [B × values] for the last position of each sequence.
template <Scalar T>
Var<T> retrieval_logits(const RetrievalVars<T>& p, const RetrievalBatch& batch, std::size_t heads,
                        AttentionKernel kernel = AttentionKernel::composed) {
    // Recorded one by one: the operands of an operator expression are evaluated in no fixed order.
    const Var<T> keys = embedding(p.E, std::span<const std::size_t>(batch.key_tokens), batch.size);
    const Var<T> values = embedding(p.E, std::span<const std::size_t>(batch.value_tokens), batch.size);
    const Var<T> positions = embedding(p.P, std::span<const std::size_t>(batch.positions), batch.size);
    const Var<T> X = (keys + values + positions).named("X");
    MultiHeadOptions options;
    options.heads = heads;
    options.causal = true;
    options.kernel = kernel;
    const Var<T> Y = multihead_attention(X, MultiHeadWeights<T>{p.W_Q, p.W_K, p.W_V, p.W_O}, options).Y;
    const Var<T> last = embedding(Y, std::span<const std::size_t>(batch.last_rows)).named("last position");
    return matmul(last, p.W_U).named("logits");
}

template <Scalar T>
Var<T> retrieval_loss(const RetrievalVars<T>& p, const RetrievalBatch& batch, std::size_t heads,
                      AttentionKernel kernel = AttentionKernel::composed) {
    return cross_entropy(retrieval_logits(p, batch, heads, kernel), std::span<const std::size_t>(batch.targets));
}

/// Fraction of rows whose largest logit is the target.
inline double accuracy_of(const Tensor<double>& logits, std::span<const std::size_t> targets) {
    const std::size_t classes = logits.cols();
    std::size_t right = 0;
    for (std::size_t r = 0; r < targets.size(); ++r) {
        const double* row = logits.data().data() + r * classes;
        right += static_cast<std::size_t>(std::max_element(row, row + classes) - row) == targets[r];
    }
    return static_cast<double>(right) / static_cast<double>(targets.size());
}

/// Owns the parameters, the optimizer and one tape reused by every step.
class RetrievalTrainer {
public:
    explicit RetrievalTrainer(const RetrievalConfig& config, AdamSettings settings = {})
        : config_(config), parameters_(RetrievalParameters::initial(config)), adam_(settings) {}

    /// One Adam step on `batch`; returns the loss before the step.
    double step(const RetrievalBatch& batch) {
        return step(batch, 1.0, [](std::span<double>) {});
    }

    /// One data-parallel Adam step: `batch` is this worker's slice of the global batch and `share`
    /// its fraction of the global batch's sequences. The slice's mean loss and its gradients, times
    /// `share`, go into one buffer (every parameter's gradient, then the loss) that
    /// `sum_over_workers` sums in place over the workers (one all-reduce), which makes them the
    /// global batch's mean loss and gradients; every worker then takes the same Adam step.
    /// Returns the global loss before the step.
    template <class SumOverWorkers>
    double step(const RetrievalBatch& batch, double share, SumOverWorkers&& sum_over_workers) {
        const RetrievalVars<double> vars = record_parameters();
        const Var<double> J = retrieval_loss(vars, batch, config_.heads, config_.kernel);
        tape_.backward(J);
        const std::array<const Var<double>*, 7> leaves{&vars.E, &vars.P, &vars.W_Q, &vars.W_K, &vars.W_V, &vars.W_O,
                                                       &vars.W_U};
        buffer_.clear();
        for (const Var<double>* leaf : leaves)
            for (const double g : leaf->grad().data()) buffer_.push_back(share * g);
        buffer_.push_back(share * J.value().item());
        sum_over_workers(std::span<double>(buffer_));
        std::size_t k = 0;
        for (std::size_t p = 0; p < leaves.size(); ++p) {
            summed_[p].resize(leaves[p]->shape());
            for (double& g : summed_[p].data()) g = buffer_[k++];
        }
        const std::array<const Tensor<double>*, 7> gradients{&summed_[0], &summed_[1], &summed_[2], &summed_[3],
                                                             &summed_[4], &summed_[5], &summed_[6]};
        std::array<Tensor<double>*, 7> parameters = parameters_.all();
        adam_.step(parameters, gradients);
        return buffer_.back();
    }

    /// Loss and accuracy on `batch`, without updating anything.
    std::pair<double, double> evaluate(const RetrievalBatch& batch) {
        const RetrievalVars<double> vars = record_parameters();
        const Var<double> logits = retrieval_logits(vars, batch, config_.heads, config_.kernel);
        const Var<double> J = cross_entropy(logits, std::span<const std::size_t>(batch.targets));
        return {J.value().item(), accuracy_of(logits.value(), batch.targets)};
    }

    Adam& optimizer() { return adam_; }
    const RetrievalParameters& parameters() const { return parameters_; }
    const RetrievalConfig& config() const { return config_; }

private:
    RetrievalVars<double> record_parameters() {
        tape_.clear();  // nodes' buffers are reused by the next graph
        return {tape_.leaf(parameters_.E, "E"),     tape_.leaf(parameters_.P, "P"),
                tape_.leaf(parameters_.W_Q, "W_Q"), tape_.leaf(parameters_.W_K, "W_K"),
                tape_.leaf(parameters_.W_V, "W_V"), tape_.leaf(parameters_.W_O, "W_O"),
                tape_.leaf(parameters_.W_U, "W_U")};
    }

    RetrievalConfig config_;
    RetrievalParameters parameters_;
    Adam adam_;
    Tape<double> tape_;
    std::vector<double> buffer_;             ///< weighted gradients and loss, summed over the workers
    std::array<Tensor<double>, 7> summed_;  ///< the summed gradients, shaped like the parameters
};

/// How a training run goes: its length, global batch and data, and the learning-rate schedule
/// (linear decay to a tenth of the peak: once the loss is near zero, a large Adam step, whose
/// m̂/√v̂ ≈ 1 whatever the gradient's size, would throw the model off the solution).
struct TrainingPlan {
    std::size_t steps = 1000;
    std::size_t batch_size = 64;   ///< sequences per step, over all workers
    std::uint64_t data_seed = 2026;
};

/// One worker of `workers`: which of them, and how many.
struct Worker {
    std::size_t rank = 0;
    std::size_t workers = 1;
};

/// Trains for plan.steps steps; every worker draws the same global batch and takes its slice
/// (contiguous sequences, as even as can be). on_step(step, loss) sees each step's global loss.
/// Returns the losses.
template <class SumOverWorkers, class OnStep>
std::vector<double> train(RetrievalTrainer& trainer, const TrainingPlan& plan, const Worker& worker,
                          SumOverWorkers&& sum_over_workers, OnStep&& on_step) {
    if (worker.workers == 0 || worker.workers > plan.batch_size || worker.rank >= worker.workers) {
        throw value_error(fmt::format("train: worker {} of {} for a batch of {}", worker.rank, worker.workers,
                                      plan.batch_size));
    }
    std::mt19937_64 data(plan.data_seed);
    const std::size_t begin = plan.batch_size * worker.rank / worker.workers;
    const std::size_t end = plan.batch_size * (worker.rank + 1) / worker.workers;
    const double share = static_cast<double>(end - begin) / static_cast<double>(plan.batch_size);
    const double peak_rate = trainer.optimizer().learning_rate();
    std::vector<double> losses;
    for (std::size_t step = 1; step <= plan.steps; ++step) {
        const double progress = static_cast<double>(step - 1) / static_cast<double>(plan.steps);
        trainer.optimizer().set_learning_rate(peak_rate * (1.0 - 0.9 * progress));
        const RetrievalBatch batch = make_retrieval_batch(trainer.config(), plan.batch_size, data);
        const RetrievalBatch slice = worker.workers == 1 ? batch : slice_of(batch, begin, end);
        losses.push_back(trainer.step(slice, share, sum_over_workers));
        on_step(step, losses.back());
    }
    return losses;
}

}  // namespace tapegrad
