// The consumer project's program: attention forward and backward through the installed (or
// added) headers, printed with the fmt formatter. It checks its own result and exits non-zero
// when the gradient is absent or not finite, so the CTest test around it can fail. A tapegrad
// error (TAPEGRAD_CPU=bogus makes the library throw one) is caught as its own type and exits 2:
// the consumer tests use it to show that exceptions cross the shared library's boundary intact.
#include <tapegrad.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace {

int run() {
    using namespace tapegrad;
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{0.5, -1.0}, {0.25, 2.0}, {1.5, 0.0}}), "X");
    const Var<double> W = tape.leaf(Tensor<double>::matrix({{1.0, 0.5}, {-0.5, 1.0}}), "W");
    const AttentionResult<double> att = attention(X, W, W, W);
    const Var<double> J = sum(att.O);
    tape.backward(J);
    fmt::print("tapegrad consumer: cpu={} J = {:.12}, dX = {:.6}\n", cpu_level_name(cpu_level()), J.value(), X.grad());
    for (const double g : X.grad().data()) {
        if (!is_finite(g)) return EXIT_FAILURE;
    }
    return X.grad().shape() == Shape{3, 2} ? EXIT_SUCCESS : EXIT_FAILURE;
}

}  // namespace

int main() {
    try {
        return run();
    } catch (const tapegrad::value_error& e) {
        fmt::print(stderr, "tapegrad consumer: caught tapegrad::value_error: {}\n", e.what());
        return 2;
    }
}
