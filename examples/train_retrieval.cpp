// Trains the small causal retrieval model (models/retrieval.hpp) with Adam on the tape's
// gradients: token + position embeddings, multi-head causal attention, output projection,
// cross-entropy. Seeded and deterministic; prints the loss as it goes and ends with the accuracy
// on held-out sequences (drawn from a generator the training never touches).
// Built with MPI (TAPEGRAD_WITH_MPI), it runs data-parallel under `mpirun -np N`: each rank takes
// its slice of every batch of 64, the gradients are summed with one all-reduce per step
// (models/data_parallel.hpp), and rank 0 prints; the losses are those of one process.
//   usage: train_retrieval [steps] [composed|fused] [threads]
//   (the attention kernel, composed by default; threads per process, 0 = one per core, the default)
#include "models/retrieval.hpp"
#include "tools/options.hpp"

#if TAPEGRAD_WITH_MPI
#include "models/data_parallel.hpp"

#include <boost/mpi/environment.hpp>
#endif

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
    using namespace tapegrad;
#if TAPEGRAD_WITH_MPI
    const boost::mpi::environment environment(argc, argv);
    const boost::mpi::communicator world;
    const Worker worker{static_cast<std::size_t>(world.rank()), static_cast<std::size_t>(world.size())};
    const auto sum_over_workers = sum_over_ranks(world);
#else
    const Worker worker{};
    const auto sum_over_workers = [](std::span<double>) {};
#endif
    const bool printing = worker.rank == 0;
    TrainingPlan plan;
    RetrievalConfig config{};  // 32 keys, 32 values, 12 pairs, D = 32, 4 heads
    unsigned threads = 0;
    try {  // the arguments, read the way every program of the project reads them (tools/options.hpp)
        if (argc > 4) throw cli::usage_error(fmt::format("at most 3 arguments, got {}", argc - 1));
        if (argc > 1) plan.steps = cli::integer_argument("steps (the first argument)", argv[1], std::size_t{1});
        config.kernel = attention_kernel_from(argc > 2 ? argv[2] : "composed");
        if (argc > 3) threads = cli::integer_argument("threads (the third argument)", argv[3], 0u, cli::max_threads);
    } catch (const std::exception& e) {
        if (printing) fmt::print(stderr, "train_retrieval: {} (usage: train_retrieval [steps] [composed|fused] [threads])\n", e.what());
        return cli::exit_usage;
    }
    try {
        if (argc > 3) set_threads(threads);
        const auto start = std::chrono::steady_clock::now();

        RetrievalTrainer trainer(config, AdamSettings{.learning_rate = 1e-2});
        if (printing) {
            // The thread count as the pool has it (the third argument, or one per core): the line
            // says what the run used (tests/cli's option_retrieval_threads reads it).
            fmt::print("retrieval task: {} pairs, {} keys, {} values (chance {:.1f}%), D = {}, {} heads, batch {}, {} "
                       "kernel, {} thread(s) per process, {} process{}\n",
                       config.pairs, config.keys, config.values, 100.0 / static_cast<double>(config.values),
                       config.width, config.heads, plan.batch_size, attention_kernel_name(config.kernel), thread_count(),
                       worker.workers, worker.workers == 1 ? "" : "es");
        }
        double running = 0;
        const auto print_every_50 = [&](std::size_t step, double loss) {
            running += loss;
            if (step % 50 != 0 && step != plan.steps) return;
            const std::size_t window = step % 50 == 0 ? 50 : step % 50;
            if (printing) {
                fmt::print("step {:5d}  mean training loss (last {}) {:.4f}\n", step, window,
                           running / static_cast<double>(window));
            }
            running = 0;
        };
        train(trainer, plan, worker, sum_over_workers, print_every_50);
        const double training_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!printing) return EXIT_SUCCESS;
        std::mt19937_64 held_out_data(11);  // disjoint stream: held-out sequences
        const RetrievalBatch held_out = make_retrieval_batch(config, 2000, held_out_data);
        const auto [loss, accuracy] = trainer.evaluate(held_out);
        fmt::print("training: {} steps in {:.2f} s, {:.1f} steps/s\n", plan.steps, training_seconds,
                   static_cast<double>(plan.steps) / training_seconds);
        fmt::print("held-out: {} sequences, loss {:.4f}, accuracy {:.2f}%\n", held_out.size, loss, 100.0 * accuracy);
        return accuracy >= 0.95 ? EXIT_SUCCESS : EXIT_FAILURE;
    } catch (const std::exception& e) {
        fmt::print(stderr, "train_retrieval: {}\n", e.what());
        return EXIT_FAILURE;
    }
}
