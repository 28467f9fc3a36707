// Helpers shared by the tests: seeded random tensors, a random probe that turns any output into
// a scalar J = Σ Y ∘ G, and a one-line way to push an op through the generic checker.
#pragma once

#include "tapegrad.hpp"

#include <boost/test/unit_test.hpp>

#include <functional>
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

template <class V>
using scalar_of = typename std::decay_t<V>::scalar_type;

// Dimensions an op-table row builds its leaves from (batch, and a matrix chain m×k·k×n).
struct OpDims {
    std::size_t batch, m, k, n;
};

// One row of an op table: the op's name and its check on leaves of the given dimensions.
struct OpCase {
    std::string name;
    std::function<CheckReport(const OpDims&, std::mt19937_64&)> check;
};

// Runs every row of `table` on T = 1, non-square and a few seeded random dimensions (each at most
// `largest`), asserting that the checker passes at its fixed thresholds.
inline void check_op_table(const std::vector<OpCase>& table, std::uint64_t seed, std::size_t largest) {
    std::vector<OpDims> dims = {{1, 1, 1, 1}, {2, 1, 3, 2}, {3, 4, 2, 5}};
    std::mt19937_64 shapes(seed);
    std::uniform_int_distribution<std::size_t> size(1, largest);
    for (int round = 0; round < 2; ++round) dims.push_back({size(shapes), size(shapes), size(shapes), size(shapes)});
    std::mt19937_64 values(seed + 1);
    for (const OpCase& op : table) {
        for (const OpDims& d : dims) {
            BOOST_TEST_CONTEXT(op.name << " batch=" << d.batch << " m=" << d.m << " k=" << d.k << " n=" << d.n) {
                const CheckReport report = op.check(d, values);
                BOOST_TEST(report.passed, report.summary());
                BOOST_TEST(report.max_error_mp <= 1e-25);
            }
        }
    }
}

}  // namespace tapegrad::testing
