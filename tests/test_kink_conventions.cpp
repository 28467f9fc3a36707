// The two kink conventions, checked through a model rather than on the op alone (test_reductions
// and test_transformer_ops hold them in isolation): max gives the gradient to the FIRST maximal
// element of a lane (ops/max.hpp), and relu'(0) = 0 (ops/relu.hpp). The model is a two-layer
// pooling classifier in which both situations arise inside the composition:
//     H = relu(X·W1 + b1)  [3x2],   P = concat(max(H, 0), mean(H, 0))  [4],
//     J = cross_entropy(reshape(P, [1x4])·W2, target 1)
// with tokens 0 and 2 of X equal (so the max-pool ties between them in both columns) and token 1's
// second pre-activation exactly 0 (0.5·0.5 − 0.25·1 + 0, all exact in binary), which the mean-pool
// carries into J. W1 is positive, so moving any one coordinate of X breaks the two columns' ties
// the same way: where one coordinate broke one tie each way, the one-sided derivatives along it
// would come from two mixed selections and neither would be the gradient of the selection the
// convention makes (the checker, by its rule in check/report.hpp, then reports a failure; seen with
// W1 = [[1, 0.5], [−1, 1]], X(0, 1): analytic −0.561 outside [−0.198, 0.310]).
//
// The convention's gradient is the one-sided limit from the side it names: J at the tie equals J
// where token 2's first feature is lowered by δ (token 0 then the unique maximum in both columns,
// since W1's first row is positive) and b1[1] lowered by δ (the zero
// pre-activation then negative, where relu' = 0). At 50 digits with δ = 1e-30 the gradient there
// differs from the limit by at most δ times J's second derivatives (≤ 1e2 here), 1e-28; so the
// gradient at the kink must equal it within 1e-25 (the checker's 50-digit threshold), and the
// double tape's within 1e-14 (a few roundings of numbers of order 1). The other conventions (the
// LAST maximal element, relu'(0) = 1) are valid subgradients too, so the gradient checker passes
// them (it classifies the coordinates as at kinks); this comparison rejects them, by O(0.1).
#define BOOST_TEST_MODULE kink_conventions
#include "support.hpp"

#include <cmath>
#include <vector>

using namespace tapegrad;

namespace {

// relu with relu'(0) = 1 (a fault control).
struct ReluOneAtZero : Relu {
    static constexpr std::string_view name = "relu with derivative 1 at 0";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < A.size(); ++k) dA[k] = A[k] >= T(0) ? at.G[k] : T(0);
    }
};

enum class Fault { none, max_to_last, relu_one_at_zero };

// The model over leaves X, W1, b1, W2 (any scalar type), with one op swapped for its fault.
struct Model {
    Fault fault = Fault::none;
    template <class Leaves>
    auto operator()(Leaves in) const {
        using V = typename Leaves::value_type;
        const V A = add(matmul(in[0], in[1]), in[2]);
        const V H = fault == Fault::relu_one_at_zero ? A.tape().template record<ReluOneAtZero>({A}) : relu(A);
        const V pooled = fault == Fault::max_to_last ? H.tape().template record<testing::MaxGradientToLastMaximal>(
                                                           {H}, reduction::checked(Max::name, H, 0, false))
                                                     : max(H, 0);
        const V P = reshape(concat({pooled, mean(H, 0)}, 0), Shape{1, 4});
        static const std::vector<std::size_t> target{1};
        return cross_entropy(matmul(P, in[3]), std::span<const std::size_t>(target));
    }
};

// The values: tokens 0 and 2 equal, token 1's second pre-activation exactly 0.
std::array<Tensor<double>, 4> at_the_kinks() {
    return {Tensor<double>::matrix({{2.0, 0.75}, {0.5, -0.25}, {2.0, 0.75}}),
            Tensor<double>::matrix({{1.0, 0.5}, {0.5, 1.0}}),
            Tensor<double>(Shape{2}, std::vector<double>{0.125, 0.0}),
            Tensor<double>::matrix({{0.5, -0.25, 1.0}, {-0.75, 0.5, 0.25}, {0.25, 1.0, -0.5}, {1.0, -0.5, 0.75}})};
}

template <class T>
std::vector<Tensor<T>> gradient(const Model& model, const std::array<Tensor<T>, 4>& values) {
    Tape<T> tape;
    std::array<Var<T>, 4> leaves;
    for (std::size_t l = 0; l < 4; ++l) leaves[l] = tape.leaf(values[l], fmt::format("x{}", l));
    tape.backward(model(leaves));
    std::vector<Tensor<T>> g;
    for (const Var<T>& v : leaves) g.push_back(v.grad());
    return g;
}

// The worst mixed difference between `model`'s gradient at the kinks (50 digits, and double) and
// the correct model's gradient at the point moved by δ to the side the conventions name.
std::pair<double, double> distance_from_the_named_side(const Model& model) {
    const std::array<Tensor<double>, 4> x = at_the_kinks();
    std::array<Tensor<mp50>, 4> x_mp, side;
    for (std::size_t l = 0; l < 4; ++l) x_mp[l] = side[l] = tensor_cast<mp50>(x[l]);
    const mp50 delta("1e-30");
    side[0][2 * 2 + 0] -= delta;  // token 2 below token 0 in both columns (W1's first row is positive)
    side[2][1] -= delta;          // token 1's pre-activation below 0
    const std::vector<Tensor<mp50>> limit = gradient(Model{}, side), at_mp = gradient(model, x_mp);
    const std::vector<Tensor<double>> at_double = gradient(model, x);
    double worst_mp = 0, worst_double = 0;
    for (std::size_t l = 0; l < 4; ++l)
        for (std::size_t k = 0; k < x[l].size(); ++k) {
            const mp50 n = limit[l][k], scale = std::max(mp50(1), mp50(abs(n)));
            worst_mp = std::max(worst_mp, to_double(mp50(abs(at_mp[l][k] - n) / scale)));
            worst_double = std::max(worst_double, to_double(mp50(abs(mp50(at_double[l][k]) - n) / scale)));
        }
    return {worst_mp, worst_double};
}

}  // namespace

// The kinks are where they were built to be: the max ties in both columns, and one relu input is 0.
BOOST_AUTO_TEST_CASE(the_model_meets_a_tie_and_a_zero) {
    Tape<double> tape;
    const std::array<Tensor<double>, 4> x = at_the_kinks();
    const Var<double> A = add(matmul(tape.leaf(x[0]), tape.leaf(x[1])), tape.leaf(x[2]));
    BOOST_TEST(A.value().at({1, 1}) == 0.0);
    BOOST_TEST(A.value().at({0, 0}) == A.value().at({2, 0}));
    BOOST_TEST(A.value().at({0, 1}) == A.value().at({2, 1}));
    BOOST_TEST(A.value().at({0, 0}) > A.value().at({1, 0}));
    BOOST_TEST(A.value().at({0, 1}) > 0.0);
}

BOOST_AUTO_TEST_CASE(max_first_and_relu_zero_conventions_hold_inside_the_model) {
    const auto [mp, dbl] = distance_from_the_named_side(Model{});
    BOOST_TEST_MESSAGE("convention gradient against the one-sided limit: 50-digit " << mp << ", double " << dbl);
    BOOST_TEST(mp <= 1e-25);
    BOOST_TEST(dbl <= 1e-14);
    // The gradient checker agrees that the gradient is a valid one, and sees the kinks.
    const std::array<Tensor<double>, 4> x = at_the_kinks();
    const NamedTensor leaves[] = {{"X", x[0]}, {"W1", x[1]}, {"b1", x[2]}, {"W2", x[3]}};
    const CheckReport report = check_gradients(Model{}, leaves);
    BOOST_TEST(testing::passed(report));
    BOOST_TEST(report.kinks > 0u, report.summary());
}

// Fault controls: each other convention moves the gradient by O(0.1) from the limit, though the
// gradient checker passes it (a valid subgradient).
BOOST_AUTO_TEST_CASE(the_other_conventions_are_rejected_through_the_model) {
    const std::array<Tensor<double>, 4> x = at_the_kinks();
    const NamedTensor leaves[] = {{"X", x[0]}, {"W1", x[1]}, {"b1", x[2]}, {"W2", x[3]}};
    for (const Fault fault : {Fault::max_to_last, Fault::relu_one_at_zero}) {
        BOOST_TEST_CONTEXT((fault == Fault::max_to_last ? "max to the last maximal element" : "relu'(0) = 1")) {
            const auto [mp, dbl] = distance_from_the_named_side(Model{fault});
            BOOST_TEST(mp > 1e-3);
            BOOST_TEST(dbl > 1e-3);
            BOOST_TEST(testing::passed(check_gradients(Model{fault}, leaves)));
        }
    }
}
