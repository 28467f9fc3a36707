// Trains the small causal retrieval model (examples/retrieval.hpp) with Adam on the tape's
// gradients: token + position embeddings, multi-head causal attention, output projection,
// cross-entropy. Seeded and deterministic; prints the loss as it goes and ends with the accuracy
// on held-out sequences (drawn from a generator the training never touches).
//   usage: train_retrieval [steps] [composed|fused]   (the attention kernel; composed by default)
#include "examples/retrieval.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
    using namespace tapegrad;
    try {
        const std::size_t steps = argc > 1 ? std::stoul(argv[1]) : 1000;
        const std::size_t batch_size = 64;
        RetrievalConfig config{};  // 32 keys, 32 values, 12 pairs, D = 32, 4 heads
        const std::string kernel = argc > 2 ? argv[2] : "composed";
        if (kernel != "composed" && kernel != "fused") {
            fmt::print(stderr, "train_retrieval: kernel must be 'composed' or 'fused', not '{}'\n", kernel);
            return EXIT_FAILURE;
        }
        config.kernel = kernel == "fused" ? AttentionKernel::fused : AttentionKernel::composed;
        const auto start = std::chrono::steady_clock::now();

        RetrievalTrainer trainer(config, AdamSettings{.learning_rate = 1e-2});
        std::mt19937_64 training_data(2026);
        std::mt19937_64 held_out_data(11);  // disjoint stream: held-out sequences
        const RetrievalBatch held_out = make_retrieval_batch(config, 2000, held_out_data);

        fmt::print("retrieval task: {} pairs, {} keys, {} values (chance {:.1f}%), D = {}, {} heads, batch {}, {} kernel\n",
                   config.pairs, config.keys, config.values, 100.0 / static_cast<double>(config.values), config.width,
                   config.heads, batch_size, kernel);
        double running = 0;
        const double peak_rate = trainer.optimizer().learning_rate();
        for (std::size_t step = 1; step <= steps; ++step) {
            // Linear decay to a tenth of the peak: once the loss is near zero, a large Adam step
            // (m̂/√v̂ ≈ 1 whatever the gradient's size) would throw the model off the solution.
            const double progress = static_cast<double>(step - 1) / static_cast<double>(steps);
            trainer.optimizer().set_learning_rate(peak_rate * (1.0 - 0.9 * progress));
            running += trainer.step(make_retrieval_batch(config, batch_size, training_data));
            if (step % 50 == 0 || step == steps) {
                const std::size_t window = step % 50 == 0 ? 50 : step % 50;
                fmt::print("step {:5d}  mean training loss (last {}) {:.4f}\n", step, window,
                           running / static_cast<double>(window));
                running = 0;
            }
        }
        const auto [loss, accuracy] = trainer.evaluate(held_out);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fmt::print("held-out: {} sequences, loss {:.4f}, accuracy {:.2f}%  ({:.1f} s)\n", held_out.size, loss,
                   100.0 * accuracy, seconds);
        return accuracy >= 0.95 ? EXIT_SUCCESS : EXIT_FAILURE;
    } catch (const std::exception& e) {
        fmt::print(stderr, "train_retrieval: {}\n", e.what());
        return EXIT_FAILURE;
    }
}
