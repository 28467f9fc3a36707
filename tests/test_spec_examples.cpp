// Every number and check of the specification's chapter (single-head attention, forward and
// backward), as its own test: Example 1 in double and in 50 digits, the asymmetric transpose
// check, the row and convex-hull bounds, dS row sums and the two-position formula, Example 2
// (identical keys), and dX as the sum of three branches verified by differences on X.
#define BOOST_TEST_MODULE spec_examples
#include "support.hpp"

#include <boost/mpl/list.hpp>

using namespace tapegrad;

namespace {

// Tolerances for the spec's exact values: double carries ~1e-16 relative rounding per operation
// and Example 1 has a few dozen operations on values ≤ 8, so 1e-14 leaves margin; 50-digit
// arithmetic carries ~1e-50, and 1e-40 leaves ten decades for the same few dozen operations.
template <class T>
double exact_tolerance();
template <>
double exact_tolerance<double>() {
    return 1e-14;
}
template <>
double exact_tolerance<mp50>() {
    return 1e-40;
}

using scalar_types = boost::mpl::list<double, mp50>;

template <class T>
Tensor<T> matrix(T a, T b, T c, T d) {
    return Tensor<T>(Shape{2, 2}, std::vector<T>{a, b, c, d});
}

// Largest |a − b| over two tensors of the same shape, as a double.
template <class T>
double max_difference(const Tensor<T>& a, const Tensor<T>& b) {
    BOOST_REQUIRE(a.shape() == b.shape());
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
        using std::abs;
        worst = std::max(worst, to_double(magnitude(T(a[k] - b[k]))));
    }
    return worst;
}

// The spec's Example 1 on a tape of type T: X = I, W_Q = aI with a = √2 ln 3, W_K = I,
// W_V = diag(2, 4), probe G = diag(1, 2), J = Σ O ∘ G.
template <class T>
struct Example1 {
    Tape<T> tape;
    T a;
    Var<T> X, W_Q, W_K, W_V, G;
    AttentionResult<T> attention_result;
    Var<T> J;

    explicit Example1(bool identical_keys = false) {
        using std::log;
        using std::sqrt;
        a = T(sqrt(T(2))) * T(log(T(3)));
        X = tape.leaf(matrix<T>(1, 0, 0, 1), "X");
        W_Q = tape.leaf(matrix<T>(a, 0, 0, a), "W_Q");
        // Example 2 keeps queries and values and makes both key rows [1, 1]: with X = I, W_K's rows.
        W_K = tape.leaf(identical_keys ? matrix<T>(1, 1, 1, 1) : matrix<T>(1, 0, 0, 1), "W_K");
        W_V = tape.leaf(matrix<T>(2, 0, 0, 4), "W_V");
        G = tape.constant(matrix<T>(1, 0, 0, 2), "G");
        attention_result = attention(X, W_Q, W_K, W_V);
        J = sum(mul(attention_result.O, G));
        tape.backward(J);
    }
};

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(example1_forward_weights_output_and_probe, T, scalar_types) {
    const Example1<T> ex;
    const double tol = exact_tolerance<T>();
    using std::log;
    // S rows [ln 3, 0] and [0, ln 3]; A rows [3/4, 1/4] and [1/4, 3/4].
    BOOST_TEST(max_difference(ex.attention_result.S.value(), matrix<T>(log(T(3)), 0, 0, log(T(3)))) <= tol);
    BOOST_TEST(max_difference(ex.attention_result.A.value(), matrix<T>(T(3) / 4, T(1) / 4, T(1) / 4, T(3) / 4)) <= tol);
    // O rows [3/2, 1] and [1/2, 3]; J = 3/2 + 2·3 = 15/2.
    BOOST_TEST(max_difference(ex.attention_result.O.value(), matrix<T>(T(3) / 2, 1, T(1) / 2, 3)) <= tol);
    BOOST_TEST(to_double(magnitude(T(ex.J.value().item() - T(15) / 2))) <= tol);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(example1_backward_dS_dQ_dK_dV, T, scalar_types) {
    const Example1<T> ex;
    const double tol = exact_tolerance<T>();
    using std::log;
    using std::sqrt;
    // dS rows [3/8, −3/8] and [−3/2, 3/2] (the spec's hand computation).
    const Tensor<T> dS = matrix<T>(T(3) / 8, T(-3) / 8, T(-3) / 2, T(3) / 2);
    BOOST_TEST(max_difference(ex.attention_result.S.grad(), dS) <= tol);
    // dQ = dS·K/√2 = dS/√2 (K = I).
    const T root2 = sqrt(T(2));
    BOOST_TEST(max_difference(ex.attention_result.Q.grad(),
                              matrix<T>(dS[0] / root2, dS[1] / root2, dS[2] / root2, dS[3] / root2)) <= tol);
    // dK = dSᵀ·Q/√2 = ln 3 · dSᵀ (Q = √2 ln 3 · I).
    const T ln3 = log(T(3));
    BOOST_TEST(max_difference(ex.attention_result.K.grad(), matrix<T>(ln3 * dS[0], ln3 * dS[2], ln3 * dS[1], ln3 * dS[3])) <=
               tol);
    // dV = Aᵀ·G with A = [[3/4, 1/4], [1/4, 3/4]], G = diag(1, 2): [[3/4, 1/2], [1/4, 3/2]].
    BOOST_TEST(max_difference(ex.attention_result.V.grad(), matrix<T>(T(3) / 4, T(1) / 2, T(1) / 4, T(3) / 2)) <= tol);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(dX_is_the_sum_of_the_three_branches, T, scalar_types) {
    // dX = dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ, computed here from the tape's dQ, dK, dV by hand; the tape
    // must give exactly that sum (its accumulate step adds, it does not overwrite).
    const Example1<T> ex;
    const auto branch = [](const Tensor<T>& dY, const Tensor<T>& W) {  // dY·Wᵀ
        Tensor<T> out(Shape{dY.rows(), W.rows()});
        for (std::size_t i = 0; i < out.rows(); ++i)
            for (std::size_t j = 0; j < out.cols(); ++j)
                for (std::size_t p = 0; p < dY.cols(); ++p) out(i, j) += dY(i, p) * W(j, p);
        return out;
    };
    const auto& r = ex.attention_result;
    const Tensor<T> from_Q = branch(r.Q.grad(), ex.W_Q.value());
    const Tensor<T> from_K = branch(r.K.grad(), ex.W_K.value());
    const Tensor<T> from_V = branch(r.V.grad(), ex.W_V.value());
    Tensor<T> total(from_Q.shape());
    for (std::size_t k = 0; k < total.size(); ++k) total[k] = from_Q[k] + from_K[k] + from_V[k];
    BOOST_TEST(max_difference(ex.X.grad(), total) <= exact_tolerance<T>());
    // The V branch alone (what an overwriting accumulate would leave) is not the gradient.
    BOOST_TEST(max_difference(ex.X.grad(), from_V) > 0.1);
}

BOOST_AUTO_TEST_CASE(dX_verified_by_50_digit_differences_on_X) {
    // The spec's check: perturb the shared X, recompute all three projections, compare with dX.
    // Also the spec's Q, K, V check: the local function of Q, K, V perturbed as independent matrices.
    const double a = std::sqrt(2.0) * std::log(3.0);
    const Tensor<double> I = Tensor<double>::matrix({{1, 0}, {0, 1}});
    const Tensor<double> G = Tensor<double>::matrix({{1, 0}, {0, 2}});
    const auto probe = [&G](const auto& O) { return sum(mul(O, O.tape().constant(tensor_cast<typename std::decay_t<decltype(O)>::scalar_type>(G), "G"))); };
    const CheckReport from_x = check_gradients(
        [&](auto in) {
            auto [X, W_Q, W_K, W_V] = in;
            return probe(attention(X, W_Q, W_K, W_V).O);
        },
        {{"X", I}, {"W_Q", Tensor<double>::matrix({{a, 0}, {0, a}})}, {"W_K", I}, {"W_V", Tensor<double>::matrix({{2, 0}, {0, 4}})}});
    BOOST_TEST(from_x.passed, from_x.summary());
    BOOST_TEST(from_x.max_error_mp <= 1e-25);
    // X feeds three matmuls: each branch was checked on its own, and all pass.
    BOOST_TEST(from_x.branches.size() == 3u);
    BOOST_TEST(from_x.failed_branches().empty());

    const CheckReport from_qkv = check_gradients(
        [&](auto in) {
            auto [Q, K, V] = in;
            return probe(attention_from_qkv(Q, K, V).O);
        },
        {{"Q", Tensor<double>::matrix({{a, 0}, {0, a}})}, {"K", I}, {"V", Tensor<double>::matrix({{2, 0}, {0, 4}})}});
    BOOST_TEST(from_qkv.passed, from_qkv.summary());
    BOOST_TEST_MESSAGE("Example 1: QKV check " << from_qkv.summary() << "\nshared X check " << from_x.summary());
}

BOOST_AUTO_TEST_CASE(transpose_matters_asymmetric_check) {
    // Q rows [1, 2], [0, 1]; K rows [1, 0], [2, 1]: Q·Kᵀ = [[1, 4], [0, 1]] but Q·K = [[5, 2], [2, 1]].
    Tape<double> tape;
    const Var<double> Q = tape.leaf(Tensor<double>::matrix({{1, 2}, {0, 1}}), "Q");
    const Var<double> K = tape.leaf(Tensor<double>::matrix({{1, 0}, {2, 1}}), "K");
    BOOST_TEST(matmul(Q, transpose(K)).value() == Tensor<double>::matrix({{1, 4}, {0, 1}}));
    BOOST_TEST(matmul(Q, K).value() == Tensor<double>::matrix({{5, 2}, {2, 1}}));
    BOOST_TEST(!(matmul(Q, K).value() == matmul(Q, transpose(K)).value()));
}

namespace {

// Rows of A are distributions; each output coordinate lies within its value column's range.
template <class T>
void check_row_and_hull_bounds(const AttentionResult<T>& r) {
    const Tensor<T>& A = r.A.value();
    const Tensor<T>& V = r.V.value();
    const Tensor<T>& O = r.O.value();
    const double tol = exact_tolerance<T>();
    for (std::size_t i = 0; i < A.rows(); ++i) {
        T row_sum(0);
        for (std::size_t j = 0; j < A.cols(); ++j) {
            BOOST_TEST(A(i, j) >= T(0));
            row_sum += A(i, j);
        }
        BOOST_TEST(std::abs(to_double(row_sum) - 1.0) <= tol);
    }
    for (std::size_t l = 0; l < V.cols(); ++l) {
        T low = V(0, l), high = V(0, l);
        for (std::size_t j = 1; j < V.rows(); ++j) {
            low = std::min(low, V(j, l));
            high = std::max(high, V(j, l));
        }
        for (std::size_t i = 0; i < O.rows(); ++i) {
            // A convex combination can only leave [low, high] by rounding, of relative size tol.
            const double slack = tol * std::max(1.0, to_double(T(high - low)));
            BOOST_TEST(to_double(O(i, l)) >= to_double(low) - slack);
            BOOST_TEST(to_double(O(i, l)) <= to_double(high) + slack);
        }
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(rows_are_distributions_and_outputs_stay_in_the_convex_hull, T, scalar_types) {
    const Example1<T> ex;
    check_row_and_hull_bounds(ex.attention_result);
    // And on random inputs with T ≠ D, d ≠ r.
    std::mt19937_64 rng(3);
    Tape<T> tape;
    const auto leaf = [&](Shape s) { return tape.leaf(tensor_cast<T>(testing::random_tensor(s, rng, 2.0))); };
    check_row_and_hull_bounds(attention(leaf({5, 3}), leaf({3, 4}), leaf({3, 4}), leaf({3, 2})));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(dS_rows_sum_to_zero, T, scalar_types) {
    // Shifting a whole row of scores leaves the weights unchanged, so each row of dS sums to 0.
    std::mt19937_64 rng(5);
    Tape<T> tape;
    const auto leaf = [&](Shape s) { return tape.leaf(tensor_cast<T>(testing::random_tensor(s, rng, 2.0))); };
    const AttentionResult<T> r = attention(leaf({6, 3}), leaf({3, 4}), leaf({3, 4}), leaf({3, 5}));
    const Var<T> J = testing::probe(r.O);
    tape.backward(J);
    const Tensor<T>& dS = r.S.grad();
    for (std::size_t i = 0; i < dS.rows(); ++i) {
        T row_sum(0);
        T scale(0);
        for (std::size_t j = 0; j < dS.cols(); ++j) {
            row_sum += dS(i, j);
            scale = std::max(scale, magnitude(dS(i, j)));
        }
        // Cancellation of terms of size `scale`: rounding of a few units of eps·scale.
        BOOST_TEST(to_double(magnitude(row_sum)) <= exact_tolerance<T>() * std::max(1.0, to_double(scale)));
    }
    // Example 1's rows, exactly as the spec computes them.
    const Example1<T> ex;
    for (std::size_t i = 0; i < 2; ++i) {
        BOOST_TEST(to_double(T(ex.attention_result.S.grad()(i, 0) + ex.attention_result.S.grad()(i, 1))) == 0.0,
                   boost::test_tools::tolerance(exact_tolerance<T>()));
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(two_position_softmax_gradient_is_a_times_one_minus_a_times_u_minus_v, T, scalar_types) {
    // A row with weights [a, 1−a] and upstream weight gradient [u, v] has score gradient
    // [a(1−a)(u−v), −a(1−a)(u−v)]; it vanishes when u = v.
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> uniform(-3, 3);
    for (int trial = 0; trial < 20; ++trial) {
        Tape<T> tape;
        const Var<T> S = tape.leaf(Tensor<T>(Shape{1, 2}, std::vector<T>{T(uniform(rng)), T(uniform(rng))}));
        const T u(uniform(rng));
        const T v = trial % 5 == 0 ? u : T(uniform(rng));
        const Var<T> A = softmax(S);
        tape.backward(A, Tensor<T>(Shape{1, 2}, std::vector<T>{u, v}));
        const T a = A.value()(0, 0);
        const T expected = a * (1 - a) * (u - v);
        BOOST_TEST(to_double(magnitude(T(S.grad()(0, 0) - expected))) <= exact_tolerance<T>());
        BOOST_TEST(to_double(magnitude(T(S.grad()(0, 1) + expected))) <= exact_tolerance<T>());
        if (u == v) {
            BOOST_TEST(to_double(magnitude(S.grad()(0, 0))) <= exact_tolerance<T>());
        }
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(example2_identical_keys, T, scalar_types) {
    const Example1<T> ex(/*identical_keys=*/true);
    const auto& r = ex.attention_result;
    const double tol = exact_tolerance<T>();
    // Equal scores for both keys: weights 1/2, both outputs the mean of the values, [1, 2].
    BOOST_TEST(max_difference(r.A.value(), matrix<T>(T(1) / 2, T(1) / 2, T(1) / 2, T(1) / 2)) <= tol);
    BOOST_TEST(r.O.value() == matrix<T>(1, 2, 1, 2));  // exact, as the spec asserts
    BOOST_TEST(to_double(magnitude(T(ex.J.value().item() - 5))) <= tol);
    // dS rows [1/2, −1/2] and [−2, 2]; dQ = dS·K/√2 is exactly zero (both key rows equal).
    BOOST_TEST(max_difference(r.S.grad(), matrix<T>(T(1) / 2, T(-1) / 2, -2, 2)) <= tol);
    for (const T& x : r.Q.grad().data()) BOOST_TEST(x == T(0));
    // dK is not zero: moving one key apart from the other does change what is read.
    using std::log;
    const T ln3 = log(T(3));
    BOOST_TEST(max_difference(r.K.grad(), matrix<T>(ln3 / 2, -2 * ln3, -ln3 / 2, 2 * ln3)) <= tol);
    double largest = 0;
    for (const T& x : r.K.grad().data()) largest = std::max(largest, std::abs(to_double(x)));
    BOOST_TEST(largest > 1.0);
}

BOOST_AUTO_TEST_CASE(random_attention_graphs_pass_the_checker) {
    // The full graph with respect to X, W_Q, W_K, W_V: T = 1, T ≠ D, d ≠ r, and T = D = d = 8.
    struct Size {
        std::size_t T, D, d, r;
    };
    std::mt19937_64 rng(17);
    for (const Size s : {Size{1, 2, 3, 2}, Size{3, 2, 4, 5}, Size{5, 4, 2, 3}, Size{8, 8, 8, 8}}) {
        const CheckReport report = check_gradients(
            [](auto in) {
                auto [X, W_Q, W_K, W_V] = in;
                return testing::probe(attention(X, W_Q, W_K, W_V).O);
            },
            {{"X", testing::random_tensor({s.T, s.D}, rng)},
             {"W_Q", testing::random_tensor({s.D, s.d}, rng)},
             {"W_K", testing::random_tensor({s.D, s.d}, rng)},
             {"W_V", testing::random_tensor({s.D, s.r}, rng)}});
        BOOST_TEST_MESSAGE(fmt::format("attention T={} D={} d={} r={}: {}", s.T, s.D, s.d, s.r, report.summary()));
        BOOST_TEST(report.passed, report.summary());
        BOOST_TEST(report.max_error_mp <= 1e-25);
        BOOST_TEST(report.max_error_double <= 1e-9);
    }
}
