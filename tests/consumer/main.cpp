// The consumer project's program: attention forward and backward through the installed (or
// added) headers, printed with the fmt formatter. It checks its own result and exits non-zero
// when the gradient is absent or not finite, so the CTest test around it can fail.
#include <tapegrad.hpp>

#include <fmt/format.h>

#include <cstdlib>

int main() {
    using namespace tapegrad;
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{0.5, -1.0}, {0.25, 2.0}, {1.5, 0.0}}), "X");
    const Var<double> W = tape.leaf(Tensor<double>::matrix({{1.0, 0.5}, {-0.5, 1.0}}), "W");
    const AttentionResult<double> att = attention(X, W, W, W);
    const Var<double> J = sum(att.O);
    tape.backward(J);
    fmt::print("tapegrad consumer: J = {:.12}, dX = {:.6}\n", J.value(), X.grad());
    for (const double g : X.grad().data()) {
        if (!is_finite(g)) return EXIT_FAILURE;
    }
    return X.grad().shape() == Shape{3, 2} ? EXIT_SUCCESS : EXIT_FAILURE;
}
