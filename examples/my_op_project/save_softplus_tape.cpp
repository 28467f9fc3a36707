// Records a small graph that uses this project's op (X W through softplus, then a sum) and saves
// its tape: the file a user would attach to a bug report. `save_softplus_tape FILE`; then
// `tapegrad-check --tape FILE --ops libmy_ops.so` checks it (check_saved_tape.cmake runs both).
#include "my_ops/softplus.hpp"

#include <tapegrad.hpp>

#include <cstdio>
#include <exception>
#include <random>

namespace {
const bool softplus_registered = tapegrad::register_op<my_ops::Softplus>();
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: save_softplus_tape FILE\n");
        return 2;
    }
    try {
        using namespace tapegrad;
        std::mt19937_64 rng(5);
        std::uniform_real_distribution<double> uniform(-1, 1);
        const auto random = [&](Shape shape) {
            Tensor<double> t(shape);
            for (double& x : t.data()) x = uniform(rng);
            return t;
        };
        Tape<double> tape;
        const auto X = tape.leaf(random(Shape{4, 3}), "X");
        const auto W = tape.leaf(random(Shape{3, 2}), "W");
        const Var<double> J = sum(my_ops::softplus(matmul(X, W)));
        save_tape(argv[1], tape, J);
        std::printf("saved %zu nodes (softplus registered: %d) to %s\n", tape.size(), int(softplus_registered), argv[1]);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "save_softplus_tape: %s\n", e.what());
        return 1;
    }
}
