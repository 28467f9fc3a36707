// A program calling two ops on double, float and mp50 and running backward, compiled (not linked)
// by check_op_instances.cmake to see whether it takes the library's op instances
// (autodiff/instances.hpp) and tapes (autodiff/tape.hpp) or compiles its own copies. mp50 first, as
// a translation unit computing at 50 digits includes it (autodiff/mp50.hpp).
#include "autodiff/mp50.hpp"
#include "ops/matmul.hpp"
#include "ops/softmax.hpp"

template <class T>
T probe() {
    tapegrad::Tape<T> tape;
    const tapegrad::Var<T> X = tape.leaf(tapegrad::Tensor<T>(tapegrad::Shape{2, 2}, T(1)), "X");
    const tapegrad::Var<T> A = tapegrad::softmax(tapegrad::matmul(X, X));
    tape.backward(A, tapegrad::Tensor<T>(A.shape(), T(1)));
    return A.value()[0];
}

int main() { return probe<double>() + probe<float>() + probe<tapegrad::mp50>() > 0 ? 0 : 1; }
