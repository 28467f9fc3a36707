// A small trainable causal model for the spec's retrieval step, made real.
//
// Task: a sequence of `pairs` (key, value) positions, then one query position. Each position
// carries its key and its value together (the sum of a key embedding and a value embedding, plus a
// learned position embedding); the query position carries a key and the "ask" token in place of
// a value. The target is the value stored under the query's key earlier in the sequence. Keys in
// a sequence are distinct, so the answer is unique; chance accuracy is 1/values.
// Carrying key and value on one position is what lets ONE attention layer solve it: the last
// query matches the earlier key (Q·Kᵀ) and reads that same position's value (A·V). With keys and
// values on separate tokens, one layer cannot read "the token after the match".
//
// Model (every step an op with a hand-derived VJP; the loss is cross-entropy):
//   X = E[key tokens] + E[value tokens] + P[positions]              [B, T, D]
//   Y = multihead causal attention(X; W_Q, W_K, W_V, W_O)           [B, T, D]
//   logits = Y[last position of each sequence]·W_U                   [B, values]
//   J = cross_entropy(logits, targets)
// Parameters live as tensors outside the tape and are updated by Adam (models/optimizer.hpp).
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
#include <vector>

namespace tapegrad {

struct RetrievalConfig {
    std::size_t keys = 32;    // distinct keys
    std::size_t values = 32;  // distinct values (the classes of the answer)
    std::size_t pairs = 12;   // stored (key, value) positions before the query
    std::size_t width = 32;   // model width D
    std::size_t heads = 4;
    std::uint64_t seed = 1;   // parameter initialisation
    AttentionKernel kernel = AttentionKernel::composed;  // or fused (ops/fused_attention.hpp)

    std::size_t length() const { return pairs + 1; }
    std::size_t vocabulary() const { return keys + values + 1; }  // keys, values, the ask token
    std::size_t ask_token() const { return keys + values; }
};

// B sequences, sequence-major token lists for the embedding gathers.
struct RetrievalBatch {
    std::size_t size = 0;    // B
    std::size_t length = 0;  // T
    std::vector<std::size_t> key_tokens, value_tokens, positions;  // B·T each
    std::vector<std::size_t> last_rows;  // row b·T + T − 1 of the flattened [B·T, D] output
    std::vector<std::size_t> targets;    // B answers in [0, values)
};

namespace detail {

// An integer in [0, n) from the generator's raw output (portable across standard libraries,
// unlike std::uniform_int_distribution; the modulo bias of n ≤ 2^10 out of 2^64 is negligible).
inline std::size_t draw_below(std::mt19937_64& generator, std::size_t n) {
    return static_cast<std::size_t>(generator() % n);
}

// Uniform in [−a, a), portable.
inline double draw_uniform(std::mt19937_64& generator, double a) {
    return (static_cast<double>(generator() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a;
}

}  // namespace detail

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
            std::swap(keys[i], keys[i + detail::draw_below(generator, config.keys - i)]);
        }
        std::vector<std::size_t> values(config.pairs);
        for (std::size_t& v : values) v = detail::draw_below(generator, config.values);
        const std::size_t asked = detail::draw_below(generator, config.pairs);
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

// The parameters, as plain tensors (what the optimizer updates).
struct RetrievalParameters {
    Tensor<double> E;    // token embeddings [vocabulary × D]
    Tensor<double> P;    // position embeddings [T × D]
    Tensor<double> W_Q, W_K, W_V, W_O;  // [D × D] each
    Tensor<double> W_U;  // read-out [D × values]

    static RetrievalParameters initial(const RetrievalConfig& config) {
        check_retrieval_config(config);
        std::mt19937_64 generator(config.seed);
        const std::size_t D = config.width;
        // Uniform with variance 1/3·a²: a = 1 for embeddings (entries of order one), and
        // a = √(3/D) for projections, so a projection keeps the variance of its input.
        const auto random = [&](Shape shape, double a) {
            Tensor<double> t(shape);
            for (double& x : t.data()) x = detail::draw_uniform(generator, a);
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

// The parameters as leaves of one tape.
template <Scalar T>
struct RetrievalVars {
    Var<T> E, P, W_Q, W_K, W_V, W_O, W_U;
};

// logits [B × values] for the last position of each sequence.
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

// Fraction of rows whose largest logit is the target.
inline double accuracy_of(const Tensor<double>& logits, std::span<const std::size_t> targets) {
    const std::size_t classes = logits.cols();
    std::size_t right = 0;
    for (std::size_t r = 0; r < targets.size(); ++r) {
        const double* row = logits.data().data() + r * classes;
        right += static_cast<std::size_t>(std::max_element(row, row + classes) - row) == targets[r];
    }
    return static_cast<double>(right) / static_cast<double>(targets.size());
}

// Owns the parameters, the optimizer and one tape reused by every step.
class RetrievalTrainer {
public:
    explicit RetrievalTrainer(const RetrievalConfig& config, AdamSettings settings = {})
        : config_(config), parameters_(RetrievalParameters::initial(config)), adam_(settings) {}

    // One Adam step on `batch`; returns the loss before the step.
    double step(const RetrievalBatch& batch) {
        const RetrievalVars<double> vars = record_parameters();
        const Var<double> J = retrieval_loss(vars, batch, config_.heads, config_.kernel);
        tape_.backward(J);
        const double loss = J.value().item();
        const std::array<const Tensor<double>*, 7> gradients{&vars.E.grad(),   &vars.P.grad(),   &vars.W_Q.grad(),
                                                             &vars.W_K.grad(), &vars.W_V.grad(), &vars.W_O.grad(),
                                                             &vars.W_U.grad()};
        std::array<Tensor<double>*, 7> parameters = parameters_.all();
        adam_.step(parameters, gradients);
        return loss;
    }

    // Loss and accuracy on `batch`, without updating anything.
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
};

}  // namespace tapegrad
