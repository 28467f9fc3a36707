// The transformer's ops (layer_norm, gelu in both forms, relu, add_bias, log_softmax) through the
// generic 50-digit checker, one line per op, on random shapes; then their specific promises:
// relu's kink at 0 is reported as a kink, values against independent references (PyTorch's GELU,
// the definition of layer norm), cross_entropy sharing log_softmax's normaliser, errors that name
// the op and the shapes, and fault controls (deliberately wrong VJPs) the checker must reject.
#define BOOST_TEST_MODULE transformer_ops
#include "support.hpp"

#include <cmath>
#include <limits>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::message_of;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::random_tensor;

namespace {

template <class V>
V layer_norm_of(const std::array<V, 3>& in) {
    return layer_norm(in[0], in[1], in[2]);
}

const std::vector<OpCase> op_table = {
    {"layer_norm", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return layer_norm_of(in); }, rng, Shape{d.m, d.n + 1}, Shape{d.n + 1}, Shape{d.n + 1}); }},
    {"layer_norm batched", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return layer_norm_of(in); }, rng, Shape{d.batch, d.m, d.k + 1}, Shape{d.k + 1}, Shape{d.k + 1}); }},
    {"layer_norm eps=0.5", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return layer_norm(in[0], in[1], in[2], {.epsilon = 0.5}); }, rng, Shape{d.m, d.n + 1}, Shape{d.n + 1}, Shape{d.n + 1}); }},
    {"gelu tanh", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return gelu(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"gelu erf", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return gelu(in[0], GeluForm::erf); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"relu", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return relu(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"add_bias", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return add_bias(in[0], in[1]); }, rng, Shape{d.batch, d.m, d.n}, Shape{d.n}); }},
    {"log_softmax", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return log_softmax(in[0]); }, rng, Shape{d.m, d.n}); }},
    {"log_softmax batched", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return log_softmax(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
};

// Fault controls: each is the real op with one term of its VJP dropped (the mistakes the ops'
// header comments name). The checker must reject every one.
struct LayerNormWithoutVarianceTerm : LayerNorm {
    static constexpr std::string_view name = "layer_norm without the variance term";
    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        LayerNorm::vjp(s, at, which, din);
        if (which != 0) return;
        const std::size_t D = at.in[0]->cols(), N = at.in[0]->size() / D;
        for (std::size_t n = 0; n < N; ++n) {  // r·(ĝ − mean ĝ) only
            T mean(0);
            for (std::size_t j = 0; j < D; ++j) mean += at.G[n * D + j] * (*at.in[1])[j];
            mean /= T(D);
            for (std::size_t j = 0; j < D; ++j) din[n * D + j] = at.saved[N * D + n] * (at.G[n * D + j] * (*at.in[1])[j] - mean);
        }
    }
};
const bool layer_norm_without_variance_term_registered = register_siblings<LayerNormWithoutVarianceTerm>();  // driven through its recorded tape

struct GeluWithoutGateSlope : Gelu {
    static constexpr std::string_view name = "gelu without the gate's slope";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];  // dA = G·y/a = G·Φ(a): the gate, not its derivative
        for (std::size_t k = 0; k < A.size(); ++k) dA[k] = at.G[k] * value(s.form, A[k]) / A[k];
    }
};
const bool gelu_without_gate_slope_registered = register_siblings<GeluWithoutGateSlope>();  // driven through its recorded tape

struct LogSoftmaxWithoutNormaliser : LogSoftmax {
    static constexpr std::string_view name = "log_softmax without the normaliser's term";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dS) {
        dS = at.G;
    }
};
const bool log_softmax_without_normaliser_registered = register_siblings<LogSoftmaxWithoutNormaliser>();  // driven through its recorded tape

struct ReluPassingGradientBelowZero : Relu {
    static constexpr std::string_view name = "relu passing G where A < 0";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        dA = at.G;
    }
};
const bool relu_passing_gradient_below_zero_registered = register_siblings<ReluPassingGradientBelowZero>();  // driven through its recorded tape

bool mentions(const std::string& text, const std::string& words) { return text.find(words) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(every_transformer_op_passes_the_50_digit_checker) {
    testing::check_op_table(op_table, 131, 5);
}

BOOST_AUTO_TEST_CASE(relu_at_zero_is_reported_at_a_kink_not_as_a_failure) {
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return testing::probe(relu(X));
        },
        {{"X", Tensor<double>::matrix({{0.0, 0.5, -1.5}, {-2.0, 0.0, 3.0}})}});
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 2u);
    BOOST_TEST(report.failures == 0u);
    BOOST_TEST(report.coordinates == 6u);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 2u);
    BOOST_TEST(report.first_kinks[0].index == "(0, 0)");
    BOOST_TEST(report.first_kinks[1].index == "(1, 1)");
    for (const Kink& kink : report.first_kinks) {
        BOOST_TEST(kink.left == 0.0, boost::test_tools::tolerance(1e-12));  // flat to the left
        BOOST_TEST(kink.analytic == 0.0);                                      // the VJP's choice
        BOOST_TEST(std::abs(kink.right) > 1e-3);                               // G's entry to the right
    }
    BOOST_TEST(mentions(report.summary(), "2 coordinates at kinks"), report.summary());
}

BOOST_AUTO_TEST_CASE(wrong_vjps_are_rejected) {
    std::mt19937_64 rng(7);
    const Tensor<double> X = random_tensor(Shape{3, 5}, rng), g = random_tensor(Shape{5}, rng),
                         b = random_tensor(Shape{5}, rng);
    const CheckReport ln = check_gradients(
        [](auto in) {
            auto [X, g, b] = in;
            using T = testing::scalar_of<decltype(X)>;
            return testing::probe(X.tape().template record<LayerNormWithoutVarianceTerm>({X, g, b}, {T(1e-5)}));
        },
        {{"X", X}, {"g", g}, {"b", b}});
    BOOST_TEST(!ln.passed, "layer norm without its variance term was accepted: " << ln.summary());
    BOOST_TEST(ln.worst.front().leaf == "X");
    const auto one_input = [&](auto record) {
        return check_gradients([&](auto in) { return testing::probe(record(in[0])); }, {{"X", X}});
    };
    for (const GeluForm form : {GeluForm::tanh, GeluForm::erf}) {
        const CheckReport report = one_input([form](auto A) {
            return A.tape().template record<GeluWithoutGateSlope>({A}, Gelu::Settings{form});
        });
        BOOST_TEST(!report.passed, "gelu without its gate's slope was accepted: " << report.summary());
    }
    const CheckReport ls = one_input([](auto A) { return A.tape().template record<LogSoftmaxWithoutNormaliser>({A}); });
    BOOST_TEST(!ls.passed, "log_softmax without its normaliser's term was accepted: " << ls.summary());
    const CheckReport rl = one_input([](auto A) { return A.tape().template record<ReluPassingGradientBelowZero>({A}); });
    BOOST_TEST(!rl.passed, "relu passing G below zero was accepted: " << rl.summary());
}

BOOST_AUTO_TEST_CASE(gelu_matches_pytorch_values) {
    // /usr/bin/python3 -c "import torch; x = torch.tensor([-2., -0.5, 1., 3.], dtype=torch.float64);
    //   print(torch.nn.functional.gelu(x, approximate='tanh'), torch.nn.functional.gelu(x))"
    // printed with 17 digits (Debian's PyTorch 1.13); the erf form is also x·Φ(x) from std::erf.
    // 1e-15 relative: the two sides evaluate the same formula in double, in another order.
    Tape<double> tape;
    const Var<double> A = tape.leaf(Tensor<double>::matrix({{-2.0, -0.5, 1.0, 3.0}}));
    const Tensor<double> tanh_form = gelu(A).value(), erf_form = gelu(A, GeluForm::erf).value();
    const std::array<double, 4> torch_tanh{-0.045402305912224938, -0.15428599017485606, 0.84119199060827676, 2.9963626079182268};
    const std::array<double, 4> torch_erf{-0.045500263896358417, -0.15426876936299344, 0.84134474606854304, 2.9959503059051098};
    for (std::size_t k = 0; k < 4; ++k) {
        BOOST_TEST(tanh_form[k] == torch_tanh[k], boost::test_tools::tolerance(1e-15));
        BOOST_TEST(erf_form[k] == torch_erf[k], boost::test_tools::tolerance(1e-15));
        const double a = A.value()[k];
        BOOST_TEST(erf_form[k] == a * 0.5 * (1 + std::erf(a / std::sqrt(2.0))), boost::test_tools::tolerance(1e-15));
    }
}

BOOST_AUTO_TEST_CASE(layer_norm_rows_have_mean_zero_and_variance_one_before_gain_and_bias) {
    std::mt19937_64 rng(8);
    Tape<double> tape;
    const Tensor<double> x = random_tensor(Shape{2, 3, 6}, rng, 5.0);
    const Var<double> Y = layer_norm(tape.leaf(x), tape.leaf(Tensor<double>(Shape{6}, 1.0)),
                                     tape.leaf(Tensor<double>(Shape{6}, 0.0)), {.epsilon = 1e-5});
    for (std::size_t n = 0; n < 6; ++n) {
        double mean = 0, square = 0, input_variance = 0, input_mean = 0;
        for (std::size_t j = 0; j < 6; ++j) input_mean += x[n * 6 + j] / 6;
        for (std::size_t j = 0; j < 6; ++j) {
            mean += Y.value()[n * 6 + j] / 6;
            square += Y.value()[n * 6 + j] * Y.value()[n * 6 + j] / 6;
            input_variance += (x[n * 6 + j] - input_mean) * (x[n * 6 + j] - input_mean) / 6;
        }
        BOOST_TEST(std::abs(mean) <= 1e-14);
        // With ε inside the root the variance is σ²/(σ² + ε), not 1: this tells ε's placement.
        BOOST_TEST(square == input_variance / (input_variance + 1e-5), boost::test_tools::tolerance(1e-13));
    }
}

BOOST_AUTO_TEST_CASE(log_softmax_is_stable_and_cross_entropy_shares_it) {
    Tape<double> tape;
    const Var<double> S = tape.leaf(Tensor<double>::matrix({{1e4, 0.0, -1e4}, {0.25, -0.5, 2.0}}));
    const Tensor<double> Y = log_softmax(S).value();
    BOOST_TEST(Y[0] == 0.0);
    BOOST_TEST(Y[1] == -1e4);
    BOOST_TEST(Y[2] == -2e4);
    const std::vector<std::size_t> targets = {1, 2};
    const double loss = cross_entropy(S, std::span<const std::size_t>(targets)).value().item();
    BOOST_TEST(loss == -(Y[1] + Y[5]) / 2);  // bit for bit: one normaliser, the same operations
}

BOOST_AUTO_TEST_CASE(bad_inputs_name_the_op_and_the_shapes) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>(Shape{2, 4}, 0.5), "X");
    const Var<double> v4 = tape.leaf(Tensor<double>(Shape{4}, 1.0)), v3 = tape.leaf(Tensor<double>(Shape{3}, 1.0));
    const Var<double> row = tape.leaf(Tensor<double>(Shape{1, 4}, 1.0));
    BOOST_TEST(mentions(message_of<shape_error>([&] { layer_norm(X, v3, v4); }), "layer_norm: gain is [3] but X is [2x4]: it must be [4]"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { layer_norm(X, v4, row); }), "layer_norm: bias is [1x4] but X is [2x4]"));
    BOOST_TEST(mentions(message_of<value_error>([&] { layer_norm(X, v4, v4, {.epsilon = 0.0}); }), "layer_norm: epsilon 0 must be positive"));
    const Var<double> scalar = tape.leaf(Tensor<double>::scalar(1.0));
    BOOST_TEST(mentions(message_of<shape_error>([&] { layer_norm(scalar, v4, v4); }), "layer_norm: X must have a feature dimension"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { add_bias(X, row); }), "add_bias: bias is [1x4] but X is [2x4]: the bias must be [4]"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { add_bias(X, v3); }), "add_bias: bias is [3]"));
    const Var<double> empty = tape.leaf(Tensor<double>(Shape{0, 3}));
    BOOST_TEST(mentions(message_of<shape_error>([&] { gelu(empty); }), "gelu: A is empty (shape [0x3])"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { relu(empty); }), "relu: A is empty (shape [0x3])"));
    BOOST_TEST(mentions(message_of<shape_error>([&] { log_softmax(scalar); }), "log_softmax: S must have at least one dimension"));
    const Var<double> infinite = tape.leaf(Tensor<double>::matrix({{0.0, std::numeric_limits<double>::infinity()}}));
    BOOST_TEST(mentions(message_of<value_error>([&] { log_softmax(infinite); }), "log_softmax: score inf at (0, 1) of shape [1x2]"));
    const std::vector<std::size_t> target = {0};
    BOOST_TEST(mentions(message_of<value_error>([&] { cross_entropy(infinite, std::span<const std::size_t>(target)); }), "cross_entropy: score inf at (0, 1)"));
}
