// Fault controls: deliberately broken variants of the attention gradient, kept here in the tests
// only, each of which the checker must reject. They prove the checker can fail:
//   - a softmax VJP without the denominator path (dS = A ∘ G),
//   - scores whose VJP was derived for Q·K instead of Q·Kᵀ,
//   - a branch gradient that overwrites instead of adding (dX = dV·W_Vᵀ only),
//   - scores whose VJP forgets the 1/√d.
// Each correct twin passes the same check, so a rejection is the fault's doing.
#define BOOST_TEST_MODULE fault_controls
#include "support.hpp"

using namespace tapegrad;
using tapegrad::testing::scalar_of;
using tapegrad::testing::SoftmaxWithoutDenominator;

namespace {


// Raw scores S = Q·Kᵀ, but with the VJP of S = Q·K: dQ = G·Kᵀ, dK = Qᵀ·G (square shapes only).
struct ScoresDifferentiatedAsQK {
    static constexpr std::string_view name = "scores with the VJP of Q·K";
    using Settings = NoSettings;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& S, Tensor<T>&) {
        const Tensor<T>& Q = *in[0];
        const Tensor<T>& K = *in[1];
        S.resize(Shape{Q.rows(), K.rows()});
        kernels::gemm(kernels::Form::abT, Q.rows(), K.rows(), Q.cols(), Q.data().data(), K.data().data(),
                      S.data().data(), false);
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        const Tensor<T>& Q = *at.in[0];
        const Tensor<T>& K = *at.in[1];
        const Tensor<T>& G = at.G;
        const std::size_t n = Q.rows();
        if (which == 0) {
            kernels::gemm(kernels::Form::abT, n, n, n, G.data().data(), K.data().data(), grad.data().data(), false);
        } else {
            kernels::gemm(kernels::Form::aTb, n, n, n, Q.data().data(), G.data().data(), grad.data().data(), false);
        }
    }
};

// The correct twin of the above: the VJP of S = Q·Kᵀ, dQ = G·K, dK = Gᵀ·Q.
struct Scores : ScoresDifferentiatedAsQK {
    static constexpr std::string_view name = "scores";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        const Tensor<T>& Q = *at.in[0];
        const Tensor<T>& K = *at.in[1];
        const Tensor<T>& G = at.G;
        if (which == 0) {
            kernels::gemm(kernels::Form::ab, Q.rows(), Q.cols(), K.rows(), G.data().data(), K.data().data(),
                          grad.data().data(), false);
        } else {
            kernels::gemm(kernels::Form::aTb, K.rows(), K.cols(), Q.rows(), G.data().data(), Q.data().data(),
                          grad.data().data(), false);
        }
    }
};

// Scale whose VJP forgets the factor: dX = G instead of c·G.
struct ScaleForgettingFactor : Scale {
    static constexpr std::string_view name = "scale without factor in VJP";
    template <Scalar T>
    static void vjp(const Settings<T>&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        std::copy(at.G.data().begin(), at.G.data().end(), grad.data().begin());
    }
};

// Matmul whose dA forgets the transpose (dA = G·B), used in one branch only.
struct MatMulWithoutTransposeInDA : MatMul {
    static constexpr std::string_view name = "matmul with dA = G·B";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        if (which == 1) return MatMul::input_gradient(s, at, which, grad);
        const Tensor<T>& B = *at.in[1];
        const Tensor<T>& G = at.G;
        kernels::gemm(kernels::Form::ab, G.rows(), B.cols(), G.cols(), G.data().data(), B.data().data(),
                      grad.data().data(), false);
    }
};

// Attention assembled from interchangeable pieces, so one piece at a time can be broken.
template <class SoftmaxOp = Softmax, class ScaleOp = Scale, class KeyProjection = MatMul>
auto attention_with(const auto& X, const auto& W_Q, const auto& W_K, const auto& W_V) {
    using T = scalar_of<decltype(X)>;
    Tape<T>& tape = X.tape();
    const auto Q = matmul(X, W_Q).named("Q");
    const auto K = tape.template record<KeyProjection>({X, W_K}).named("K");
    const auto V = matmul(X, W_V).named("V");
    const auto S = tape.template record<ScaleOp>({matmul(Q, transpose(K))}, {inv_sqrt<T>(Q.shape().cols())});
    const auto A = tape.template record<SoftmaxOp>({S});
    return matmul(A, V);
}

struct Leaves {
    Tensor<double> X, W_Q, W_K, W_V;
};

Leaves random_leaves(std::uint64_t seed, std::size_t T = 3, std::size_t D = 3, std::size_t d = 3, std::size_t r = 2) {
    std::mt19937_64 rng(seed);
    return {testing::random_tensor({T, D}, rng), testing::random_tensor({D, d}, rng),
            testing::random_tensor({D, d}, rng), testing::random_tensor({D, r}, rng)};
}

template <class SoftmaxOp, class ScaleOp, class KeyProjection = MatMul>
CheckReport check_attention(const Leaves& leaves, CheckOptions options = {}) {
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X, W_Q, W_K, W_V] = in;
            return testing::probe(attention_with<SoftmaxOp, ScaleOp, KeyProjection>(X, W_Q, W_K, W_V));
        },
        {{"X", leaves.X}, {"W_Q", leaves.W_Q}, {"W_K", leaves.W_K}, {"W_V", leaves.W_V}}, options);
    BOOST_TEST_MESSAGE(report.summary());
    return report;
}

}  // namespace

BOOST_AUTO_TEST_CASE(correct_attention_passes_the_same_checks) {
    const CheckReport report = check_attention<Softmax, Scale>(random_leaves(1));
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(softmax_vjp_without_denominator_path_is_rejected) {
    const CheckReport report = check_attention<SoftmaxWithoutDenominator, Scale>(random_leaves(1));
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.failures > 0u);
    // And its score gradients no longer sum to zero per row, as the spec predicts.
    Tape<double> tape;
    const Var<double> S = tape.leaf(Tensor<double>::matrix({{std::log(3.0), 0}, {0, std::log(3.0)}}));
    const Var<double> A = tape.record<SoftmaxWithoutDenominator>({S});
    tape.backward(A, Tensor<double>::matrix({{2, 0}, {0, 8}}));  // dA of Example 1
    BOOST_TEST(std::abs(S.grad()(0, 0) + S.grad()(0, 1)) > 0.1);
}

BOOST_AUTO_TEST_CASE(scores_differentiated_as_QK_instead_of_QKT_are_rejected) {
    // On the spec's asymmetric Q and K (rows [1, 2], [0, 1] and [1, 0], [2, 1]), V = diag(2, 4).
    const Tensor<double> V = Tensor<double>::matrix({{2, 0}, {0, 4}});
    const auto graph_with = [&V]<class ScoresOp>() {
        return [&V](auto in) {
            auto [Q, K] = in;
            using T = scalar_of<decltype(Q)>;
            const auto S = scale(Q.tape().template record<ScoresOp>({Q, K}), inv_sqrt<T>(2));
            return testing::probe(matmul(softmax(S), Q.tape().constant(tensor_cast<T>(V))));
        };
    };
    const Tensor<double> Q = Tensor<double>::matrix({{1, 2}, {0, 1}});
    const Tensor<double> K = Tensor<double>::matrix({{1, 0}, {2, 1}});
    const CheckReport broken = check_gradients(graph_with.template operator()<ScoresDifferentiatedAsQK>(), {{"Q", Q}, {"K", K}});
    BOOST_TEST(!broken.passed);
    BOOST_TEST_MESSAGE(broken.summary());
    const CheckReport correct = check_gradients(graph_with.template operator()<Scores>(), {{"Q", Q}, {"K", K}});
    BOOST_TEST(correct.passed, correct.summary());
}

BOOST_AUTO_TEST_CASE(overwritten_instead_of_summed_branch_is_rejected) {
    // A hand-derived backward in the spec's style, whose last step overwrites dX with each
    // branch in turn (dX = dQ·W_Qᵀ; dX = dK·W_Kᵀ; dX = dV·W_Vᵀ) instead of adding them.
    const auto backward_with = [](bool overwrite) {
        return [overwrite](const auto& values) {
            using T = typename std::decay_t<decltype(values[0])>::value_type;
            Tape<T> tape;
            const Var<T> X = tape.constant(values[0]);
            const Var<T> W_Q = tape.leaf(values[1]), W_K = tape.leaf(values[2]), W_V = tape.leaf(values[3]);
            // Q, K, V as leaves of their own: the local gradients dQ, dK, dV.
            const Var<T> Q = tape.leaf(matmul(X, W_Q).value()), K = tape.leaf(matmul(X, W_K).value()),
                         V = tape.leaf(matmul(X, W_V).value());
            tape.backward(testing::probe(attention_from_qkv(Q, K, V).O));
            const auto times_transpose = [](const Tensor<T>& dY, const Tensor<T>& W) {  // dY·Wᵀ
                Tensor<T> out(Shape{dY.rows(), W.rows()});
                kernels::gemm(kernels::Form::abT, dY.rows(), W.rows(), dY.cols(), dY.data().data(), W.data().data(),
                              out.data().data(), false);
                return out;
            };
            const auto transpose_times = [](const Tensor<T>& A, const Tensor<T>& dY) {  // Aᵀ·dY
                Tensor<T> out(Shape{A.cols(), dY.cols()});
                kernels::gemm(kernels::Form::aTb, A.cols(), dY.cols(), A.rows(), A.data().data(), dY.data().data(),
                              out.data().data(), false);
                return out;
            };
            Tensor<T> dX = times_transpose(Q.grad(), values[1]);
            for (const auto& [dY, W] : {std::pair{&K.grad(), &values[2]}, std::pair{&V.grad(), &values[3]}}) {
                const Tensor<T> branch = times_transpose(*dY, *W);
                for (std::size_t k = 0; k < dX.size(); ++k) dX[k] = overwrite ? branch[k] : dX[k] + branch[k];
            }
            return std::array<Tensor<T>, 4>{dX, transpose_times(values[0], Q.grad()),
                                            transpose_times(values[0], K.grad()),
                                            transpose_times(values[0], V.grad())};
        };
    };
    const Leaves leaves = random_leaves(2);
    const auto graph = [](auto in) {
        auto [X, W_Q, W_K, W_V] = in;
        return testing::probe(attention(X, W_Q, W_K, W_V).O);
    };
    const NamedTensor named[] = {{"X", leaves.X}, {"W_Q", leaves.W_Q}, {"W_K", leaves.W_K}, {"W_V", leaves.W_V}};
    const CheckReport overwritten = check_gradients(graph, named, CheckOptions{}, backward_with(true));
    BOOST_TEST(!overwritten.passed);
    BOOST_TEST_MESSAGE(overwritten.summary());
    // Only X is wrong: every reported mismatch is on X.
    for (const Mismatch& m : overwritten.worst) BOOST_TEST(m.leaf == "X");
    const CheckReport summed = check_gradients(graph, named, CheckOptions{}, backward_with(false));
    BOOST_TEST(summed.passed, summed.summary());
}

BOOST_AUTO_TEST_CASE(scores_vjp_without_the_scale_is_rejected) {
    const CheckReport report = check_attention<Softmax, ScaleForgettingFactor>(random_leaves(3));
    BOOST_TEST(!report.passed);
}

BOOST_AUTO_TEST_CASE(a_wrong_branch_is_named) {
    // Only the key projection's VJP is broken: X's gradient is wrong, and the branch report says
    // which of X's three consumers is at fault.
    const CheckReport report = check_attention<Softmax, Scale, MatMulWithoutTransposeInDA>(random_leaves(4));
    BOOST_TEST(!report.passed);
    const std::vector<std::string> wrong = report.failed_branches();
    BOOST_TEST_REQUIRE(wrong.size() == 1u, report.summary());
    BOOST_TEST(wrong[0].find("-> K") != std::string::npos, wrong[0]);
    BOOST_TEST(wrong[0].find("matmul with dA = G") != std::string::npos, wrong[0]);
}

BOOST_AUTO_TEST_CASE(fast_mode_catches_every_fault_and_falls_back_to_the_full_check) {
    CheckOptions fast;
    fast.mode = CheckOptions::Mode::fast;
    const Leaves leaves = random_leaves(5);
    const CheckReport good = check_attention<Softmax, Scale>(leaves, fast);
    BOOST_TEST(good.passed, good.summary());
    BOOST_TEST(good.mode == CheckMode::fast);
    for (const CheckReport& bad : {check_attention<SoftmaxWithoutDenominator, Scale>(leaves, fast),
                                   check_attention<Softmax, ScaleForgettingFactor>(leaves, fast),
                                   check_attention<Softmax, Scale, MatMulWithoutTransposeInDA>(leaves, fast)}) {
        BOOST_TEST(!bad.passed);
        BOOST_TEST(bad.mode == CheckMode::fast_then_full);
    }
}
