// Helpers shared by the tests: seeded random tensors, a random probe that turns any output into
// a scalar J = Σ Y ∘ G, and a one-line way to push an op through the generic checker.
#pragma once

#include "tapegrad.hpp"

#include <boost/test/unit_test.hpp>

#include <ostream>
#include <random>

namespace tapegrad {

// Boost.Test prints values of failed comparisons through operator<<.
template <Scalar T>
std::ostream& operator<<(std::ostream& out, const Tensor<T>& tensor) {
    return out << fmt::format("{}", tensor);
}

}  // namespace tapegrad

namespace tapegrad::testing {

inline Tensor<double> random_tensor(const Shape& shape, std::mt19937_64& rng, double spread = 1.0) {
    std::uniform_real_distribution<double> uniform(-spread, spread);
    Tensor<double> t(shape);
    for (double& x : t.data()) x = uniform(rng);
    return t;
}

// J = Σ Y ∘ G with a fixed random G (seeded by the shape), so every output coordinate matters
// and no two coordinates of the gradient are forced equal.
template <Scalar T>
Var<T> probe(const Var<T>& Y) {
    if (Y.shape().size() == 1) return sum(Y);
    std::mt19937_64 rng(Y.shape().size() * 7919 + Y.shape().rank());
    const Var<T> G = Y.tape().constant(tensor_cast<T>(random_tensor(Y.shape(), rng)), "G");
    return sum(mul(Y, G));
}

// Checks `op` (a generic lambda from an array of Vars to a Var) on random leaves of the given
// shapes, with the default (fixed) thresholds. Prints the report when it fails.
template <class Op, class... Shapes>
CheckReport check_op(Op op, std::mt19937_64& rng, const Shapes&... shapes) {
    std::size_t leaf = 0;
    const NamedTensor leaves[] = {NamedTensor{fmt::format("x{}", leaf++), random_tensor(shapes, rng)}...};
    const CheckReport report = check_gradients([&](auto in) { return probe(op(in)); }, leaves);
    BOOST_TEST_MESSAGE(report.summary());
    return report;
}

}  // namespace tapegrad::testing
