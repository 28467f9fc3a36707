// A program calling two ops on double, float and mp50, compiled (not linked) by
// check_op_instances.cmake to see whether it takes the library's op instances
// (autodiff/instances.hpp) or compiles its own copies.
#include "ops/matmul.hpp"
#include "ops/softmax.hpp"

template <class T>
T probe() {
    tapegrad::Tape<T> tape;
    const tapegrad::Var<T> X = tape.leaf(tapegrad::Tensor<T>(tapegrad::Shape{2, 2}, T(1)), "X");
    return tapegrad::softmax(tapegrad::matmul(X, X)).value()[0];
}

int main() { return probe<double>() + probe<float>() + probe<tapegrad::mp50>() > 0 ? 0 : 1; }
