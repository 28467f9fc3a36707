// Reductions along an axis: sum(X, axis) (the op sum_axis), mean, max and logsumexp.
//   - the 50-digit op table: every axis of rank 1..4 inputs, negative axes, keepdims on and off,
//     each row through the checker and an explicit seed on the op's own output (tests/support.hpp);
//   - values and gradients against hand-computed ones, output shapes (a rank-1 input gives a scalar);
//   - max's tie convention (the first maximal element gets G), and what the checker says at a tie;
//   - logsumexp at ±1e4: finite, exact, and through the checker;
//   - fault controls, one per op at least, each rejected (and its correct twin passing);
//   - bad axes, empty and non-finite inputs, refused by type and words.
#define BOOST_TEST_MODULE reductions
#include "support.hpp"

#include "ops/logsumexp.hpp"
#include "ops/max.hpp"
#include "ops/mean.hpp"
#include "ops/sum.hpp"
#include "ops/sum_axis.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::scalar_of;

namespace {

enum class Reduction { sum, mean, max, logsumexp };

std::string_view name_of(Reduction r) {
    switch (r) {
        case Reduction::sum: return "sum";
        case Reduction::mean: return "mean";
        case Reduction::max: return "max";
        case Reduction::logsumexp: return "logsumexp";
    }
    return "?";
}

template <class V>
V reduce(Reduction r, const V& X, int axis, bool keepdims) {
    switch (r) {
        case Reduction::sum: return sum(X, axis, keepdims);
        case Reduction::mean: return mean(X, axis, keepdims);
        case Reduction::max: return max(X, axis, keepdims);
        case Reduction::logsumexp: return logsumexp(X, axis, keepdims);
    }
    return X;
}

// One axis case of the op table: the input's rank, the axis as the user writes it, keepdims.
struct AxisCase {
    std::size_t rank;
    int axis;
    bool keepdims;
};

// Every axis of every rank without keepdims, the negative axes, and keepdims at every rank.
const std::vector<AxisCase> axis_cases = {
    {1, 0, false}, {1, -1, false}, {1, 0, true},
    {2, 0, false}, {2, 1, false}, {2, -1, false}, {2, -2, true}, {2, 1, true},
    {3, 0, false}, {3, 1, false}, {3, 2, false}, {3, -2, false}, {3, 0, true},
    {4, 0, false}, {4, 1, false}, {4, 2, false}, {4, 3, false}, {4, -1, false}, {4, -3, true}, {4, 3, true},
};

// An input of the given rank from an op-table row's dimensions.
Shape of_rank(std::size_t rank, const OpDims& d) {
    switch (rank) {
        case 1: return Shape{d.n};
        case 2: return Shape{d.m, d.n};
        case 3: return Shape{d.batch, d.m, d.n};
        default: return Shape{d.batch, d.m, d.k, d.n};
    }
}

// The worst 50-digit error over every row run so far, printed at the end of each table.
double worst_error_mp = 0;

// One row per axis case for reduction `r`: "max rank 3 axis -2", "sum rank 2 axis 1 keepdims".
std::vector<OpCase> op_table(Reduction r) {
    std::vector<OpCase> table;
    for (const AxisCase& c : axis_cases) {
        table.push_back({fmt::format("{} rank {} axis {}{}", name_of(r), c.rank, c.axis, c.keepdims ? " keepdims" : ""),
                         [r, c](const OpDims& d, std::mt19937_64& rng) {
                             const CheckReport report =
                                 check_op([r, c](auto in) { return reduce(r, in[0], c.axis, c.keepdims); }, rng,
                                          of_rank(c.rank, d));
                             worst_error_mp = std::max(worst_error_mp, report.max_error_mp);
                             return report;
                         }});
    }
    return table;
}

// Each dimension at most 4: a rank-4 row then has up to 256 elements, each checked coordinate by
// coordinate in 50 digits (the fixed dimensions of check_op_table reach 3×4×2×5 = 120 anyway).
constexpr std::size_t largest_dimension = 4;

void check_table(Reduction r, std::uint64_t seed) {
    worst_error_mp = 0;
    testing::check_op_table(op_table(r), seed, largest_dimension);
    BOOST_TEST_MESSAGE(name_of(r) << ": worst 50-digit mixed error over the table " << worst_error_mp);
}

}  // namespace

BOOST_AUTO_TEST_CASE(sum_along_every_axis_passes_the_50_digit_checker) { check_table(Reduction::sum, 101); }
BOOST_AUTO_TEST_CASE(mean_along_every_axis_passes_the_50_digit_checker) { check_table(Reduction::mean, 202); }
BOOST_AUTO_TEST_CASE(max_along_every_axis_passes_the_50_digit_checker) { check_table(Reduction::max, 303); }
BOOST_AUTO_TEST_CASE(logsumexp_along_every_axis_passes_the_50_digit_checker) { check_table(Reduction::logsumexp, 404); }

// ---------------------------------------------------------------------------------------------
// Values, shapes and gradients against hand-computed ones (double tape).

namespace {

Tensor<double> tensor(const Shape& shape, std::vector<double> values) { return Tensor<double>(shape, std::move(values)); }

// X = [[1, −2, 3], [4, 0.5, −6]]: every value and every sum below is exact in double.
const Tensor<double> small = Tensor<double>::matrix({{1, -2, 3}, {4, 0.5, -6}});

// X[o, j, i] = 12·o + 4·j + i, shape [2x3x4]: a lane's elements are an arithmetic sequence.
Tensor<double> counting() {
    Tensor<double> X(Shape{2, 3, 4});
    for (std::size_t k = 0; k < X.size(); ++k) X[k] = static_cast<double>(k);
    return X;
}

// The gradient of X under f(X) seeded with G, on a fresh tape.
Tensor<double> gradient(const std::function<Var<double>(const Var<double>&)>& f, const Tensor<double>& X,
                        const Tensor<double>& G) {
    Tape<double> tape;
    const Var<double> x = tape.leaf(X, "X");
    tape.backward(f(x), G);
    return x.grad();
}

}  // namespace

BOOST_AUTO_TEST_CASE(values_and_shapes_match_hand_computed_ones) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(small, "X");
    BOOST_TEST(sum(X, 0).value() == tensor({3}, {5, -1.5, -3}));
    BOOST_TEST(sum(X, 1).value() == tensor({2}, {2, -1.5}));
    BOOST_TEST(sum(X, -1, true).value() == tensor({2, 1}, {2, -1.5}));
    BOOST_TEST(sum(X, -2, true).value() == tensor({1, 3}, {5, -1.5, -3}));
    BOOST_TEST(mean(X, 0).value() == tensor({3}, {2.5, -0.75, -1.5}));
    BOOST_TEST(mean(X, 1).value() == tensor({2}, {2.0 / 3.0, -0.5}));
    BOOST_TEST(max(X, 0).value() == tensor({3}, {4, 0.5, 3}));
    BOOST_TEST(max(X, -1, true).value() == tensor({2, 1}, {3, 4}));

    // Rank 3, the middle axis: Σ_j (12·o + 4·j + i) = 36·o + 12 + 3·i; the mean is a third of it;
    // the max over o is at o = 1, the max over i at i = 3.
    const Var<double> C = tape.leaf(counting(), "C");
    Tensor<double> total(Shape{2, 4}), average(Shape{2, 4}), top_o(Shape{3, 4}), top_i(Shape{2, 3, 1});
    for (std::size_t o = 0; o < 2; ++o)
        for (std::size_t i = 0; i < 4; ++i) {
            total(o, i) = 36.0 * o + 12 + 3.0 * i;
            average(o, i) = 12.0 * o + 4 + i;
        }
    for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t i = 0; i < 4; ++i) top_o(j, i) = 12 + 4.0 * j + i;
    for (std::size_t o = 0; o < 2; ++o)
        for (std::size_t j = 0; j < 3; ++j) top_i.at({o, j, 0}) = 12.0 * o + 4.0 * j + 3;
    BOOST_TEST(sum(C, 1).value() == total);
    BOOST_TEST(sum(C, 1, true).value() == total.reshaped(Shape{2, 1, 4}));
    BOOST_TEST(mean(C, -2).value() == average);
    BOOST_TEST(max(C, 0).value() == top_o);
    BOOST_TEST(max(C, 2, true).value() == top_i);

    // Rank 1 reduces to a rank-0 scalar; with keepdims to [1].
    const Var<double> v = tape.leaf(tensor({3}, {1, 2, 3}), "v");
    BOOST_TEST(sum(v, 0).value() == Tensor<double>::scalar(6));
    BOOST_TEST(sum(v, -1, true).value() == tensor({1}, {6}));
    BOOST_TEST(mean(v, 0).value() == Tensor<double>::scalar(2));
    BOOST_TEST((max(v, 0).shape() == Shape{}));
    BOOST_TEST((logsumexp(v, 0, true).shape() == Shape{1}));

    // The all-element sum is unchanged, and the two record different ops.
    const Var<double> all = sum(X), along = sum(X, 0);
    BOOST_TEST(all.value() == Tensor<double>::scalar(0.5));
    BOOST_TEST(tape.info(all.index()).op == "sum");
    BOOST_TEST(tape.info(along.index()).op == "sum_axis");
}

BOOST_AUTO_TEST_CASE(logsumexp_values_match_50_digit_ones) {
    // log Σ exp in 50 digits, directly (no shift needed at these magnitudes), against the double
    // op. The op's error: the shifts X − m, the exps and the log within 1 ulp each, 2 rounded
    // additions and the final m + log: at most about 6 roundings of u = 1.1e-16 relative to the
    // result (≥ 3 here), so 1e-15 bounds it; a wrong formula misses by far more.
    Tape<double> tape;
    const Var<double> Y = logsumexp(tape.leaf(small, "X"), 1);
    for (std::size_t r = 0; r < 2; ++r) {
        mp50 total(0);
        for (std::size_t c = 0; c < 3; ++c) total += exp(mp50(small(r, c)));
        const mp50 exact = log(total);
        BOOST_TEST(to_double(mp50(abs(mp50(Y.value()[r]) - exact) / abs(exact))) <= 1e-15);
    }
}

BOOST_AUTO_TEST_CASE(gradients_match_hand_computed_ones) {
    // sum: G broadcast along the axis; mean: G/n; max: G at the argmax.
    BOOST_TEST(gradient([](const auto& X) { return sum(X, 0); }, small, tensor({3}, {1, 2, 3})) ==
               tensor({2, 3}, {1, 2, 3, 1, 2, 3}));
    BOOST_TEST(gradient([](const auto& X) { return sum(X, 1, true); }, small, tensor({2, 1}, {7, -1})) ==
               tensor({2, 3}, {7, 7, 7, -1, -1, -1}));
    BOOST_TEST(gradient([](const auto& X) { return mean(X, 1); }, small, tensor({2}, {3, 6})) ==
               tensor({2, 3}, {1, 1, 1, 2, 2, 2}));
    BOOST_TEST(gradient([](const auto& X) { return max(X, 0); }, small, tensor({3}, {1, 2, 3})) ==
               tensor({2, 3}, {0, 0, 3, 1, 2, 0}));
    // logsumexp: G times the softmax along the axis; equal lanes give equal weights, exactly.
    const Tensor<double> flat = Tensor<double>::matrix({{0.5, 0.5, 0.5, 0.5}, {-3, -3, -3, -3}});
    BOOST_TEST(gradient([](const auto& X) { return logsumexp(X, -1); }, flat, tensor({2}, {8, -4})) ==
               tensor({2, 4}, {2, 2, 2, 2, -1, -1, -1, -1}));
    // On the middle axis of a rank-3 input, whose lanes are a, a + 4, a + 8: the weights are
    // e^−8, e^−4, 1 over their sum s, and sum to one. Each weight carries at most 5 roundings of
    // u = 1.1e-16 (exp, two additions in s, 1/s, the product), their sum 2 more: 1e-15 bounds both.
    const Tensor<double> W = gradient([](const auto& X) { return logsumexp(X, 1); }, counting(), Tensor<double>(Shape{2, 4}, 1.0));
    const double s = 1 + std::exp(-4.0) + std::exp(-8.0);
    for (std::size_t o = 0; o < 2; ++o)
        for (std::size_t i = 0; i < 4; ++i) {
            const double lane = W.at({o, 0, i}) + W.at({o, 1, i}) + W.at({o, 2, i});
            BOOST_TEST(std::abs(lane - 1) <= 1e-15);
            BOOST_TEST(std::abs(W.at({o, 2, i}) - 1 / s) <= 1e-15);
            BOOST_TEST(std::abs(W.at({o, 0, i}) - std::exp(-8.0) / s) <= 1e-15);
        }
}

// ---------------------------------------------------------------------------------------------
// max at ties: the convention, and fault controls that break it.

namespace {

// Records reduction op `Op` (the real one or a broken variant) as its public function would.
template <class Op, class V>
V record_reduction(const V& X, int axis, bool keepdims = false) {
    return X.tape().template record<Op>({X}, reduction::checked(Op::name, X, axis, keepdims));
}

const bool max_gradient_to_last_maximal_registered = register_siblings<testing::MaxGradientToLastMaximal>();  // driven through its recorded tape

// Max whose gradient goes to EVERY maximal element of each lane. Without ties it is Max.
struct MaxGradientToAllMaximal : Max {
    static constexpr std::string_view name = "max with the gradient to every maximal element";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& X = *at.in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            for (std::size_t j = 0; j < lanes.dim; ++j) {
                const std::size_t k = first + j * lanes.stride();
                dX[k] = X[k] == at.out[lane] ? at.G[lane] : T(0);
            }
        }
    }
};
const bool max_gradient_to_all_maximal_registered = register_siblings<MaxGradientToAllMaximal>();  // driven through its recorded tape

// Max whose gradient goes to every element of the lane, as sum's does. Wrong without ties too.
struct MaxGradientToEveryElement : Max {
    static constexpr std::string_view name = "max with the gradient to every element";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dX) {
        SumAxis::vjp(s, at, which, dX);
    }
};
const bool max_gradient_to_every_element_registered = register_siblings<MaxGradientToEveryElement>();  // driven through its recorded tape

// Ties: row 0 has its maximum 3 at columns 0 and 2, row 1 its maximum 5 at columns 1 and 2;
// column 0 holds 3 twice.
const Tensor<double> tied = Tensor<double>::matrix({{3, 1, 3}, {3, 5, 5}});

template <class MaxOp>
Tensor<double> tie_gradient(int axis, const Tensor<double>& G) {
    return gradient([axis](const Var<double>& X) { return record_reduction<MaxOp>(X, axis); }, tied, G);
}

// The documented convention: the first maximal element along the axis gets G, the others zero.
template <class MaxOp>
bool follows_the_first_maximal_convention() {
    return tie_gradient<MaxOp>(1, tensor({2}, {10, 20})) == tensor({2, 3}, {10, 0, 0, 0, 20, 0}) &&
           tie_gradient<MaxOp>(0, tensor({3}, {1, 2, 3})) == tensor({2, 3}, {1, 0, 0, 0, 2, 3});
}

}  // namespace

BOOST_AUTO_TEST_CASE(max_gives_the_gradient_to_the_first_maximal_element_at_a_tie) {
    Tape<double> tape;
    BOOST_TEST(max(tape.leaf(tied), 1).value() == tensor({2}, {3, 5}));
    BOOST_TEST(tie_gradient<Max>(1, tensor({2}, {10, 20})) == tensor({2, 3}, {10, 0, 0, 0, 20, 0}));
    BOOST_TEST(tie_gradient<Max>(0, tensor({3}, {1, 2, 3})) == tensor({2, 3}, {1, 0, 0, 0, 2, 3}));
    BOOST_TEST(follows_the_first_maximal_convention<Max>());
    // The faults give [[0, 0, 10], [0, 0, 20]] and [[10, 0, 10], [0, 20, 20]] on axis 1.
    BOOST_TEST(!follows_the_first_maximal_convention<testing::MaxGradientToLastMaximal>());
    BOOST_TEST(!follows_the_first_maximal_convention<MaxGradientToAllMaximal>());
}

// At a tie max has no derivative: the checker reports the tied coordinates as kinks (one-sided
// derivatives G and 0), whatever the convention, and neither passes nor fails them. So the
// checker cannot tell the convention apart; the test above is what pins it.
BOOST_AUTO_TEST_CASE(the_checker_reports_ties_of_max_as_kinks_for_any_convention) {
    const auto check_at_tie = [](auto reduce_rows) {
        const CheckReport report =
            check_gradients([&](auto in) { return testing::probe(reduce_rows(in[0])); }, {{"X", tied}});
        BOOST_TEST_MESSAGE(report.summary());
        return report;
    };
    for (const CheckReport& report : {check_at_tie([](auto X) { return record_reduction<Max>(X, 1); }),
                                      check_at_tie([](auto X) { return record_reduction<testing::MaxGradientToLastMaximal>(X, 1); }),
                                      check_at_tie([](auto X) { return record_reduction<MaxGradientToAllMaximal>(X, 1); })}) {
        BOOST_TEST(report.passed, report.summary());
        BOOST_TEST(report.kinks == 4u);  // (0, 0), (0, 2), (1, 1), (1, 2)
        BOOST_TEST(report.failures == 0u);
    }
}

// Without ties the first and the last maximal element are the same one: the checker passes the
// last-maximal variant on random input, which is why the tie test above exists.
BOOST_AUTO_TEST_CASE(without_ties_the_convention_is_invisible_to_the_checker) {
    std::mt19937_64 rng(11);
    const CheckReport report =
        check_op([](auto in) { return record_reduction<testing::MaxGradientToLastMaximal>(in[0], 1); }, rng, Shape{3, 4});
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(max_with_the_gradient_to_every_element_is_rejected) {
    std::mt19937_64 correct_rng(12), faulty_rng(12);
    const CheckReport correct = check_op([](auto in) { return record_reduction<Max>(in[0], 1); }, correct_rng, Shape{3, 4});
    const CheckReport faulty =
        check_op([](auto in) { return record_reduction<MaxGradientToEveryElement>(in[0], 1); }, faulty_rng, Shape{3, 4});
    BOOST_TEST(correct.passed, correct.summary());
    BOOST_TEST(!faulty.passed);
    BOOST_TEST(faulty.failures == 9u);  // the 3 non-maximal elements of each of the 3 rows
}

// ---------------------------------------------------------------------------------------------
// Fault controls of sum_axis, mean and logsumexp: each rejected, each correct twin passing.

namespace {

// sum_axis whose VJP broadcasts G along the other axis of a square matrix: dX(r, c) = G[r] for a
// sum over rows (axis 0), whose derivative is G[c]; and the reverse for axis 1. Right only on the
// diagonal.
struct SumAxisAlongTheWrongAxis : SumAxis {
    static constexpr std::string_view name = "sum_axis broadcasting G along the wrong axis";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        for (std::size_t r = 0; r < dX.rows(); ++r)
            for (std::size_t c = 0; c < dX.cols(); ++c) dX(r, c) = at.G[s.axis == 0 ? r : c];
    }
};
const bool sum_axis_along_the_wrong_axis_registered = register_siblings<SumAxisAlongTheWrongAxis>();  // driven through its recorded tape

// mean whose VJP forgets the 1/n: dX = G broadcast, sum_axis's VJP.
struct MeanForgettingOneOverN : Mean {
    static constexpr std::string_view name = "mean without 1/n in its VJP";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dX) {
        SumAxis::vjp(s, at, which, dX);
    }
};
const bool mean_forgetting_one_over_n_registered = register_siblings<MeanForgettingOneOverN>();  // driven through its recorded tape

// logsumexp whose VJP uses the softmax's numerator exp(X) without the denominator.
struct LogSumExpUnnormalised : LogSumExp {
    static constexpr std::string_view name = "logsumexp with exp(X) for the softmax in its VJP";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        using std::exp;
        const Tensor<T>& X = *at.in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            for (std::size_t j = 0; j < lanes.dim; ++j) {
                const std::size_t k = first + j * lanes.stride();
                dX[k] = at.G[lane] * exp(X[k]);
            }
        }
    }
};
const bool log_sum_exp_unnormalised_registered = register_siblings<LogSumExpUnnormalised>();  // driven through its recorded tape

// The correct op and its broken twin, checked on the same random leaves.
template <class Correct, class Faulty>
std::pair<CheckReport, CheckReport> check_twins(int axis, const Shape& shape, std::uint64_t seed) {
    std::mt19937_64 correct_rng(seed), faulty_rng(seed);
    const CheckReport correct = check_op([axis](auto in) { return record_reduction<Correct>(in[0], axis); }, correct_rng, shape);
    const CheckReport faulty = check_op([axis](auto in) { return record_reduction<Faulty>(in[0], axis); }, faulty_rng, shape);
    BOOST_TEST_MESSAGE(Faulty::name << ": " << faulty.summary());
    return {correct, faulty};
}

}  // namespace

BOOST_AUTO_TEST_CASE(sum_axis_broadcasting_g_along_the_wrong_axis_is_rejected) {
    for (const int axis : {0, 1, -1}) {
        BOOST_TEST_CONTEXT("axis " << axis) {
            const auto [correct, faulty] = check_twins<SumAxis, SumAxisAlongTheWrongAxis>(axis, Shape{3, 3}, 21);
            BOOST_TEST(correct.passed, correct.summary());
            BOOST_TEST(!faulty.passed);
            BOOST_TEST(faulty.failures == 6u);  // every coordinate off the diagonal
        }
    }
}

BOOST_AUTO_TEST_CASE(mean_forgetting_one_over_n_is_rejected) {
    const auto [correct, faulty] = check_twins<Mean, MeanForgettingOneOverN>(0, Shape{3, 4}, 22);
    BOOST_TEST(correct.passed, correct.summary());
    BOOST_TEST(!faulty.passed);
    BOOST_TEST(faulty.failures == 12u);  // G instead of G/3 at every coordinate
}

BOOST_AUTO_TEST_CASE(logsumexp_without_the_softmax_denominator_is_rejected) {
    const auto [correct, faulty] = check_twins<LogSumExp, LogSumExpUnnormalised>(-1, Shape{2, 3, 4}, 23);
    BOOST_TEST(correct.passed, correct.summary());
    BOOST_TEST(!faulty.passed);
    BOOST_TEST(faulty.failures == 24u);  // exp(X_j) ≠ exp(X_j)/Σ_k exp(X_k) at every coordinate
}

// ---------------------------------------------------------------------------------------------
// logsumexp far from zero, and over hidden (−inf) positions.

BOOST_AUTO_TEST_CASE(logsumexp_at_plus_and_minus_1e4_is_finite_and_exact) {
    // exp(1e4) overflows and exp(−1e4) underflows to 0 in double (and would in any fixed
    // exponent range): the naive log Σ exp gives inf and −inf here. With the shift, every result
    // is m + log(k) for k equal elements, computed exactly as written below, and the weights are
    // exactly 1/k.
    const Tensor<double> far = Tensor<double>::matrix({{1e4, 1e4}, {-1e4, -1e4}, {1e4, -1e4}});
    Tape<double> tape;
    const Var<double> X = tape.leaf(far, "X");
    const Var<double> Y = logsumexp(X, 1);
    BOOST_TEST(Y.value() == tensor({3}, {1e4 + std::log(2.0), -1e4 + std::log(2.0), 1e4}));
    for (const double y : Y.value().data()) BOOST_TEST(std::isfinite(y));
    tape.backward(Y, tensor({3}, {1, 1, 1}));
    BOOST_TEST(X.grad() == tensor({3, 2}, {0.5, 0.5, 0.5, 0.5, 1, 0}));

    // The same in 50 digits: exact to the last digit against m + log 2 in 50 digits.
    Tape<mp50> wide;
    const Var<mp50> Z = logsumexp(wide.leaf(tensor_cast<mp50>(far)), -1, true);
    BOOST_TEST((Z.shape() == Shape{3, 1}));
    BOOST_TEST((Z.value()[0] == mp50(1e4) + log(mp50(2))));
    BOOST_TEST((Z.value()[1] == mp50(-1e4) + log(mp50(2))));
    BOOST_TEST((Z.value()[2] == mp50(1e4)));
}

BOOST_AUTO_TEST_CASE(logsumexp_near_plus_and_minus_1e4_passes_the_50_digit_checker) {
    for (const double centre : {1e4, -1e4}) {
        BOOST_TEST_CONTEXT("centre " << centre) {
            std::mt19937_64 rng(31);
            Tensor<double> X = testing::random_tensor(Shape{3, 4}, rng);
            for (double& x : X.data()) x += centre;
            const CheckReport report =
                check_gradients([](auto in) { return testing::probe(logsumexp(in[0], 1)); }, {{"X", X}});
            BOOST_TEST(report.passed, report.summary());
            BOOST_TEST(report.max_error_mp <= 1e-25);
            const CheckReport seeded =
                testing::check_op_seeded([](auto in) { return logsumexp(in[0], 0, true); }, rng, std::array{X});
            BOOST_TEST(seeded.passed);
            BOOST_TEST(seeded.max_error_mp <= 1e-25);
        }
    }
}

BOOST_AUTO_TEST_CASE(logsumexp_of_hidden_positions_is_minus_inf_and_passes_no_gradient) {
    const double inf = std::numeric_limits<double>::infinity();
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{-inf, -inf}, {0, -inf}}), "X");
    const Var<double> Y = logsumexp(X, 1);
    BOOST_TEST(Y.value() == tensor({2}, {-inf, 0}));
    tape.backward(Y, tensor({2}, {1, 1}));
    BOOST_TEST(X.grad() == tensor({2, 2}, {0, 0, 1, 0}));
}

// ---------------------------------------------------------------------------------------------
// Errors: each misuse raises the named exception type with the words that locate the fault.

namespace {

using testing::ErrorKind;
using Misuse = testing::Misuse<std::function<void(Tape<double>&)>>;

Var<double> filled(Tape<double>& tape, const Shape& shape) { return tape.leaf(Tensor<double>(shape, 0.5)); }

const std::vector<Misuse> misuses = {
    {"sum axis too large", ErrorKind::shape, [](auto& t) { sum(filled(t, {2, 3}), 2); }, {"sum_axis", "axis 2", "[2x3]", "[-2, 2)"}},
    {"sum axis too negative", ErrorKind::shape, [](auto& t) { sum(filled(t, {2, 3}), -3, true); }, {"sum_axis", "axis -3", "[2x3]"}},
    {"mean axis rank 4", ErrorKind::shape, [](auto& t) { mean(filled(t, {1, 2, 3, 4}), 4); }, {"mean", "axis 4", "[1x2x3x4]", "[-4, 4)"}},
    {"max axis rank 1", ErrorKind::shape, [](auto& t) { max(filled(t, {5}), -2); }, {"max", "axis -2", "[5]", "[-1, 1)"}},
    {"logsumexp axis rank 3", ErrorKind::shape, [](auto& t) { logsumexp(filled(t, {2, 2, 2}), 3); }, {"logsumexp", "axis 3", "[2x2x2]"}},
    {"sum of a scalar", ErrorKind::shape, [](auto& t) { sum(t.leaf(Tensor<double>::scalar(1)), 0); }, {"sum_axis", "axis 0", "[]", "scalar"}},
    {"max of a scalar", ErrorKind::shape, [](auto& t) { max(t.leaf(Tensor<double>::scalar(1)), -1); }, {"max", "axis -1", "[]", "scalar"}},
    {"sum empty", ErrorKind::shape, [](auto& t) { sum(filled(t, {0, 3}), 1); }, {"sum_axis", "empty", "[0x3]"}},
    {"mean empty", ErrorKind::shape, [](auto& t) { mean(filled(t, {2, 0}), 1); }, {"mean", "empty", "[2x0]"}},
    {"max empty", ErrorKind::shape, [](auto& t) { max(filled(t, {0}), 0); }, {"max", "empty", "[0]"}},
    {"logsumexp empty", ErrorKind::shape, [](auto& t) { logsumexp(filled(t, {3, 0, 2}), 0); }, {"logsumexp", "empty", "[3x0x2]"}},
    {"logsumexp +inf", ErrorKind::value, [](auto& t) { logsumexp(t.leaf(Tensor<double>::matrix({{1, std::numeric_limits<double>::infinity()}})), 1); }, {"logsumexp", "inf", "(0, 1)", "[1x2]"}},
    {"sum +inf and -inf", ErrorKind::value, [](auto& t) { sum(t.leaf(Tensor<double>::matrix({{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}})), 1); }, {"sum_axis", "NaN"}},
};

}  // namespace

BOOST_AUTO_TEST_CASE(bad_axes_and_inputs_raise_named_errors) {
    for (const Misuse& m : misuses) {
        Tape<double> tape;
        testing::expect_named_error(m, [&] { m.act(tape); });
    }
}
