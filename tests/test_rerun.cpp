// Checking the tape you ran (check/recorded.hpp) and re-running a recorded tape at another scalar
// type (autodiff/rerun.hpp). Graphs recorded by ordinary code on a Tape<double> (the spec's
// attention, a multi-head layer, a transformer, the retrieval model) are checked as they stand and
// must get the verdicts the generic-lambda check of the same graph gets, with the same coordinates
// in the reports; the fault controls are rejected by both; a re-run at 50 digits equals a direct
// 50-digit recording with the double-rounded constants, value for value; a float tape, its JVP and
// HVP check too, and its own float gradients against the truth (a fault in its float path only is
// rejected); both dual re-runs of the JVP and HVP checks compared; a branch change named at its
// element; an op without siblings, and an output of constants only, are refused by name.
#define BOOST_TEST_MODULE rerun
#include "op_rules.hpp"

#include "models/retrieval.hpp"

#include <cmath>
#include <set>
#include <string>
#include <vector>


using namespace tapegrad;
using tapegrad::testing::random_tensor;
using tapegrad::testing::scalar_of;
using tapegrad::testing::expect_same_report;

namespace {

// The first fault control (a softmax VJP without the denominator path), registered like a user's op.
using testing::SoftmaxWithoutDenominator;
const bool broken_softmax_registered = register_siblings<SoftmaxWithoutDenominator>();

// An op of no inputs (a constant 1), registered: a re-run cannot place it on a tape.
struct ConstantOne {
    static constexpr std::string_view name = "constant one";
    using Settings = NoSettings;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T>, Tensor<T>& out, Tensor<T>&) {
        out.resize(Shape{1});
        out[0] = T(1);
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>&, std::size_t, Tensor<T>&) {}
};
const bool constant_one_registered = register_siblings<ConstantOne>();

// A cube whose VJP is wrong only in float, by a relative ppm · 1e-6 (the fault controls of the float
// gradient check): at double and 50 digits it is right, so the finite-difference stages pass it.
template <int ppm>
struct CubeWrongInFloat {
    static constexpr std::string_view name = "cube wrong in float";
    using Settings = NoSettings;

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = A[k] * A[k] * A[k];
    }
    // dA = G ∘ 3A², times (1 + ppm · 1e-6) in float only
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        const T factor = std::is_same_v<T, float> ? T(1 + ppm * 1e-6) : T(1);
        for (std::size_t k = 0; k < A.size(); ++k) dA[k] = at.G[k] * T(3) * A[k] * A[k] * factor;
    }
};
const bool cubes_registered = register_siblings<CubeWrongInFloat<0>>() && register_siblings<CubeWrongInFloat<100>>() &&
                              register_siblings<CubeWrongInFloat<10000>>();

// exp whose tangent is doubled in one dual type only (the fault controls of the recorded JVP and
// HVP checks: each compares two dual re-runs, at 50 digits and at double, with 50-digit differences;
// one left out lets its fault through).
template <class Wrong>
struct ExpWithWrongTangentIn : Exp {
    static constexpr std::string_view name = "exp with a wrong tangent in one dual type";
    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        Exp::forward(s, in, Y, saved);
        if constexpr (std::is_same_v<T, Wrong>)
            for (T& y : Y.data()) y.tangent() *= 2;
    }
};
const bool wrong_tangents_registered = register_siblings<ExpWithWrongTangentIn<Dual<mp50>>>() &&
                                       register_siblings<ExpWithWrongTangentIn<Dual<double>>>();

// A user's op left unregistered.
struct Unregistered : Scale {
    static constexpr std::string_view name = "unregistered scale";
};

// The spec's attention (T = 3, D = 2, d = 2, r = 3), J = Σ O ∘ G, recorded as a user would.
struct SpecLeaves {
    Tensor<double> X = Tensor<double>::matrix({{1, 0}, {0, 1}, {1, 1}});
    Tensor<double> W_Q = Tensor<double>::matrix({{0.5, -1}, {1, 0.25}});
    Tensor<double> W_K = Tensor<double>::matrix({{1, 0}, {0.5, 1}});
    Tensor<double> W_V = Tensor<double>::matrix({{2, 0, 1}, {0, 4, -1}});
    Tensor<double> G = Tensor<double>::matrix({{1, -2, 0.5}, {0.25, 1, 3}, {-1, 0.5, 2}});
};

template <class SoftmaxOp>
auto spec_graph(const SpecLeaves& v) {
    return [&v](auto in) {
        auto [X, W_Q, W_K, W_V] = in;
        using T = scalar_of<decltype(X)>;
        Tape<T>& tape = X.tape();
        const auto S = scale(matmul(matmul(X, W_Q), transpose(matmul(X, W_K))), inv_sqrt<T>(2));
        const auto O = matmul(tape.template record<SoftmaxOp>({S}), matmul(X, W_V));
        return sum(O * tape.constant(tensor_cast<T>(v.G), "G"));
    };
}

template <class SoftmaxOp>
void expect_spec_graph_checks_alike(bool should_pass) {
    const SpecLeaves v;
    const auto graph = spec_graph<SoftmaxOp>(v);
    Tape<double> tape;
    const std::array<Var<double>, 4> leaves{tape.leaf(v.X, "X"), tape.leaf(v.W_Q, "W_Q"), tape.leaf(v.W_K, "W_K"),
                                            tape.leaf(v.W_V, "W_V")};
    const Var<double> J = graph(leaves);
    tape.backward(J);  // the tape as the user ran it: recorded, differentiated
    const CheckReport recorded = check_gradients(tape, J);
    const CheckReport generic = check_gradients(graph, {{"X", v.X}, {"W_Q", v.W_Q}, {"W_K", v.W_K}, {"W_V", v.W_V}});
    BOOST_TEST(recorded.passed == should_pass, recorded.summary());
    expect_same_report(recorded, generic);
    CheckOptions fast;
    fast.mode = CheckOptions::Mode::fast;
    expect_same_report(check_gradients(tape, J, fast), check_gradients(graph, {{"X", v.X}, {"W_Q", v.W_Q},
                                                                                 {"W_K", v.W_K}, {"W_V", v.W_V}},
                                                                       fast));
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_spec_graph_recorded_by_ordinary_code_checks_like_the_generic_lambda) {
    expect_spec_graph_checks_alike<Softmax>(true);
}

BOOST_AUTO_TEST_CASE(a_fault_control_on_a_recorded_tape_is_rejected_at_the_same_coordinates) {
    BOOST_TEST(broken_softmax_registered);
    expect_spec_graph_checks_alike<SoftmaxWithoutDenominator>(false);
}

BOOST_AUTO_TEST_CASE(a_rerun_at_50_digits_equals_a_direct_50_digit_recording_value_for_value) {
    const SpecLeaves v;
    const double c = 1 / std::sqrt(2.0);  // the factor as the double tape holds it
    const auto graph = [&v, c](auto in) {
        auto [X, W_Q, W_K, W_V] = in;
        using T = scalar_of<decltype(X)>;
        const auto S = scale(matmul(matmul(X, W_Q), transpose(matmul(X, W_K))), T(c));
        const auto O = matmul(softmax(S), matmul(X, W_V));
        return sum(O * X.tape().constant(tensor_cast<T>(v.G), "G"));
    };
    Tape<double> recorded;
    const std::array<Var<double>, 4> leaves{recorded.leaf(v.X), recorded.leaf(v.W_Q), recorded.leaf(v.W_K),
                                            recorded.leaf(v.W_V)};
    const Var<double> J = graph(leaves);

    Tape<mp50> direct, rerun_tape;
    std::array<Var<mp50>, 4> direct_leaves, rerun_leaves;
    for (std::size_t l = 0; l < 4; ++l) {
        direct_leaves[l] = direct.leaf(tensor_cast<mp50>(leaves[l].value()));
        rerun_leaves[l] = rerun_tape.leaf(tensor_cast<mp50>(leaves[l].value()));
    }
    const Var<mp50> J_direct = graph(direct_leaves);
    const Var<mp50> J_rerun = rerun(recorded, J, std::span<const Var<mp50>>(rerun_leaves));
    BOOST_TEST_REQUIRE(direct.size() == rerun_tape.size());
    for (std::size_t i = 0; i < direct.size(); ++i) {
        const Tensor<mp50>& a = direct.recorded(i).value;
        const Tensor<mp50>& b = rerun_tape.recorded(i).value;
        BOOST_TEST_REQUIRE((a.shape() == b.shape()));
        for (std::size_t k = 0; k < a.size(); ++k) BOOST_TEST_REQUIRE((a[k] == b[k]), "node " << i << " entry " << k);
    }
    BOOST_TEST((J_rerun.value()[0] == J_direct.value()[0]));
    // The double and 50-digit values differ (the re-run is more precise), by a double's rounding.
    BOOST_TEST(to_double(J_rerun.value()[0]) == J.value()[0], boost::test_tools::tolerance(1e-14));
}

BOOST_AUTO_TEST_CASE(a_multihead_layer_recorded_by_ordinary_code_checks_like_the_generic_lambda) {
    std::mt19937_64 rng(31);
    const std::size_t T = 4, D = 4;
    const Tensor<double> X = random_tensor(Shape{T, D}, rng), W_Q = random_tensor(Shape{D, D}, rng),
                         W_K = random_tensor(Shape{D, D}, rng), W_V = random_tensor(Shape{D, D}, rng),
                         W_O = random_tensor(Shape{D, D}, rng);
    MultiHeadOptions options;
    options.heads = 2;
    const auto graph = [&options](auto in) {
        const auto Y = multihead_attention(in[0], MultiHeadWeights<scalar_of<decltype(in[0])>>{in[1], in[2], in[3], in[4]},
                                           options).Y;
        return sum(Y * Y);
    };
    Tape<double> tape;
    const std::array<Var<double>, 5> leaves{tape.leaf(X, "X"), tape.leaf(W_Q, "W_Q"), tape.leaf(W_K, "W_K"),
                                            tape.leaf(W_V, "W_V"), tape.leaf(W_O, "W_O")};
    const Var<double> J = graph(leaves);
    expect_same_report(check_gradients(tape, J),
                       check_gradients(graph, {{"X", X}, {"W_Q", W_Q}, {"W_K", W_K}, {"W_V", W_V}, {"W_O", W_O}}));
}

BOOST_AUTO_TEST_CASE(a_transformer_recorded_by_ordinary_code_checks_like_the_generic_lambda) {
    const testing::SmallTransformer small;
    const TransformerConfig& c = small.config;
    const std::vector<Tensor<double>>& values = small.values;
    const std::vector<std::size_t>&tokens = small.tokens, &targets = small.targets;
    const auto graph = [&](auto& in) {
        using T = scalar_of<decltype(in[0])>;
        const auto vars = TransformerVars<T>::from(std::span<const Var<T>>(in.data(), in.size()), c);
        return transformer_loss(vars, c, std::span<const std::size_t>(tokens), std::span<const std::size_t>(targets), 1);
    };
    Tape<double> tape;
    const auto vars = TransformerVars<double>::record(tape, values, c);
    const Var<double> J = transformer_loss(vars, c, std::span<const std::size_t>(tokens),
                                           std::span<const std::size_t>(targets), 1);
    constexpr std::size_t N = 16;  // 4 + 12·L, L = 1
    const std::vector<std::string> names = parameter_names(c);
    BOOST_TEST_REQUIRE(names.size() == N);
    NamedTensor named[N];
    for (std::size_t i = 0; i < N; ++i) named[i] = {names[i], values[i]};
    expect_same_report(check_gradients(tape, J), check_gradients(graph, named));
}

BOOST_AUTO_TEST_CASE(the_retrieval_model_recorded_by_ordinary_code_checks_like_the_generic_lambda) {
    RetrievalConfig config;
    config.pairs = 3, config.keys = 4, config.values = 4, config.width = 8, config.heads = 2;
    std::mt19937_64 generator(3);
    const RetrievalBatch batch = make_retrieval_batch(config, 2, generator);
    const RetrievalParameters p = RetrievalParameters::initial(config);
    const auto graph = [&](auto in) {
        using T = scalar_of<decltype(in[0])>;
        return retrieval_loss(RetrievalVars<T>{in[0], in[1], in[2], in[3], in[4], in[5], in[6]}, batch, config.heads);
    };
    Tape<double> tape;
    const std::array<Var<double>, 7> leaves{tape.leaf(p.E, "E"),     tape.leaf(p.P, "P"),     tape.leaf(p.W_Q, "W_Q"),
                                            tape.leaf(p.W_K, "W_K"), tape.leaf(p.W_V, "W_V"), tape.leaf(p.W_O, "W_O"),
                                            tape.leaf(p.W_U, "W_U")};
    const Var<double> J = graph(leaves);
    expect_same_report(check_gradients(tape, J),
                       check_gradients(graph, {{"E", p.E}, {"P", p.P}, {"W_Q", p.W_Q}, {"W_K", p.W_K}, {"W_V", p.W_V},
                                               {"W_O", p.W_O}, {"W_U", p.W_U}}));
}

BOOST_AUTO_TEST_CASE(a_float_tape_and_the_second_order_checks_of_a_recorded_tape) {
    const SpecLeaves v;
    Tape<float> tape;
    const Var<float> X = tape.leaf(tensor_cast<float>(v.X), "X");
    const Var<float> W = tape.leaf(tensor_cast<float>(v.W_Q), "W");
    const Var<float> O = attention(X, W, W, W).O;
    const Var<float> J = sum(O * O);
    tape.backward(J);
    const CheckReport gradients = check_gradients(tape, J);
    BOOST_TEST(gradients.passed, gradients.summary());
    BOOST_TEST(gradients.branches.size() == 6u);  // X and W, each via Q, K and V
    const SecondOrderReport jvp = check_jvp(tape, O);
    BOOST_TEST(jvp.passed, jvp.summary());
    const SecondOrderReport hvp = check_hvp(tape, J);
    BOOST_TEST(hvp.passed, hvp.summary());
}

// A float tape's own gradients against the truth: J = Σ cube(X) W. The correct cube passes within
// 16 u (a handful of roundings per element); the cube wrong in float by 1% and by 1e-4 is rejected
// at X (error at the fault's size), W passes, and no finite difference fails (the VJP is right at
// double and 50 digits). Before backward(J), and after backward(J, G), nothing is compared.
template <int ppm>
CheckReport float_cube_report(bool run_backward, bool seeded_with_one = true) {
    Tape<float> tape;
    const Var<float> X = tape.leaf(Tensor<float>::matrix({{0.7f, -1.3f, 0.45f}, {1.1f, 0.6f, -0.8f}}), "X");
    const Var<float> W = tape.leaf(Tensor<float>::matrix({{0.3f, -0.9f}, {1.2f, 0.5f}, {-0.4f, 0.8f}}), "W");
    const Var<float> J = sum(matmul(tape.record<CubeWrongInFloat<ppm>>({X}), W));
    if (run_backward && seeded_with_one) tape.backward(J);
    if (run_backward && !seeded_with_one) tape.backward(J, Tensor<float>(J.shape(), 1.0f));
    const CheckReport report = check_gradients(tape, J);
    // The bound is the documented one: the spread of 8 random-rounding runs at the report's seed,
    // and 100 times the larger of it and u.
    const PrecisionEstimate spread = estimate_precision(tape, J, {.runs = 8, .seed = report.seed});
    for (std::size_t l = 0; l < report.float_gradients.size(); ++l) {
        BOOST_TEST(report.float_gradients[l].estimate == spread.leaves[l].normwise);
        BOOST_TEST(report.float_gradients[l].threshold == 100 * std::max(spread.leaves[l].normwise, 0x1p-24));
    }
    return report;
}

BOOST_AUTO_TEST_CASE(a_float_tapes_own_gradients_are_checked_and_a_float_only_fault_is_rejected) {
    BOOST_TEST(cubes_registered);
    const double u = std::ldexp(1.0, -24);
    const CheckReport right = float_cube_report<0>(true);
    BOOST_TEST(right.passed, right.summary());
    BOOST_TEST_REQUIRE(right.float_gradients.size() == 2u);
    for (const FloatGradientCheck& f : right.float_gradients) BOOST_TEST(f.error < 16 * u, f.leaf << ": " << f.error);
    BOOST_TEST(right.summary().find("float32 gradient of X as the tape computed it") != std::string::npos);
    for (const double relative : {1e-2, 1e-4}) {
        const CheckReport wrong = relative == 1e-2 ? float_cube_report<10000>(true) : float_cube_report<100>(true);
        BOOST_TEST(!wrong.passed, wrong.summary());
        BOOST_TEST(wrong.failures == 0u);  // the finite-difference stages see a right VJP
        BOOST_TEST_REQUIRE(wrong.float_gradients.size() == 2u);
        BOOST_TEST(wrong.float_gradients[0].leaf == "X");
        BOOST_TEST(!wrong.float_gradients[0].passed);
        // float(1 + ppm · 1e-6) − 1 is the fault to 2e-4 of itself, the gradient's own rounding
        // (~1e-7 of it) adds 2e-4 of 1e-4 at most: 1e-3 holds the normwise error to the fault.
        BOOST_TEST(wrong.float_gradients[0].error == relative, boost::test_tools::tolerance(1e-3));
        BOOST_TEST(wrong.float_gradients[1].passed);
        BOOST_TEST(wrong.summary().find("float32 gradient of X") != std::string::npos);
    }
    // A leaf whose true gradient is 0 is measured absolutely (0 here), not as 0 / 0.
    Tape<float> tape;
    const Var<float> Z = tape.leaf(Tensor<float>::matrix({{0.5f, -2.0f}}), "Z");
    const Var<float> J = sum(mul(Z, tape.constant(Tensor<float>::matrix({{0.0f, 0.0f}}))));
    tape.backward(J);
    const CheckReport zero = check_gradients(tape, J);
    BOOST_TEST_REQUIRE(zero.float_gradients.size() == 1u);
    BOOST_TEST(zero.float_gradients[0].error == 0.0);
    BOOST_TEST(zero.passed, zero.summary());
    BOOST_TEST(float_cube_report<10000>(false).float_gradients.empty());
    BOOST_TEST(float_cube_report<10000>(true, false).float_gradients.empty());
    BOOST_TEST(float_cube_report<10000>(true, false).passed);
}

// check_jvp(tape, Y) and check_hvp(tape, J) of Y = op(X), J = Σ Y ∘ Y.
template <class Op>
std::array<SecondOrderReport, 2> recorded_second_order_reports() {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{0.3, -0.7, 1.1}}), "X");
    const Var<double> Y = tape.record<Op>({X});
    return {check_jvp(tape, Y), check_hvp(tape, sum(mul(Y, Y)))};
}

// Both dual re-runs of a recorded tape are compared: a tangent wrong only at 50 digits fails with
// the 50-digit error at the fault's size (the tangent doubled: relative error 1), one wrong only at
// double with the double error so, the other side within its own threshold; exp itself passes.
BOOST_AUTO_TEST_CASE(the_recorded_jvp_and_hvp_checks_compare_both_dual_reruns) {
    BOOST_TEST(wrong_tangents_registered);
    for (const SecondOrderReport& right : recorded_second_order_reports<Exp>())
        BOOST_TEST(right.passed, right.summary());
    for (const SecondOrderReport& wrong : recorded_second_order_reports<ExpWithWrongTangentIn<Dual<mp50>>>()) {
        BOOST_TEST(!wrong.passed, wrong.summary());
        BOOST_TEST(wrong.max_error_mp > 0.1, wrong.check);
        BOOST_TEST(wrong.max_error_double < 1e-9, wrong.check);  // CheckOptions' double_tolerance
    }
    for (const SecondOrderReport& wrong : recorded_second_order_reports<ExpWithWrongTangentIn<Dual<double>>>()) {
        BOOST_TEST(!wrong.passed, wrong.summary());
        BOOST_TEST(wrong.max_error_double > 0.1, wrong.check);
        BOOST_TEST(wrong.max_error_mp <= 1e-25, wrong.check);
    }
}

BOOST_AUTO_TEST_CASE(an_op_without_siblings_is_refused_by_name) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2}}), "X");
    const Var<double> J = sum(tape.record<Unregistered>({X}, Scale::Settings<double>{2.0}));
    const std::string message = testing::message_of<usage_error>([&] { (void)check_gradients(tape, J); });
    BOOST_TEST(message.find("op 'unregistered scale' (node 1) has no siblings to re-run it at double") !=
               std::string::npos, message);
    const std::string foreign = testing::message_of<usage_error>([&] {
        Tape<double> other;
        (void)check_gradients(other, J);
    });
    BOOST_TEST(foreign.find("not a value of this tape") != std::string::npos, foreign);
    BOOST_TEST(constant_one_registered);
    Tape<double> second;
    const Var<double> Y = second.leaf(Tensor<double>::matrix({{1, 2}}), "Y");
    const Var<double> K = sum(mul(Y, second.record<ConstantOne>({})));
    const std::string no_inputs = testing::message_of<usage_error>([&] { (void)check_gradients(second, K); });
    BOOST_TEST(no_inputs.find("op 'constant one' (node 1) has no inputs") != std::string::npos, no_inputs);
}

// A recorded output that depends on no leaf needing a gradient (constants only) leaves nothing to
// check: check_gradients, check_jvp and check_hvp each refuse it by name, not pass it on nothing.
BOOST_AUTO_TEST_CASE(an_output_of_constants_only_is_refused_by_each_check) {
    Tape<double> tape;
    const Var<double> C = tape.constant(Tensor<double>::matrix({{1, 2}}), "C");
    const Var<double> J = sum(mul(C, C));
    const std::string gradients = testing::message_of<usage_error>([&] { (void)check_gradients(tape, J); });
    BOOST_TEST(gradients.find("check_gradients: the output depends on no leaf that needs a gradient") != std::string::npos,
               gradients);
    const std::string jvp = testing::message_of<usage_error>([&] { (void)check_jvp(tape, J); });
    BOOST_TEST(jvp.find("check_jvp: the output depends on no leaf that needs a gradient") != std::string::npos, jvp);
    const std::string hvp = testing::message_of<usage_error>([&] { (void)check_hvp(tape, J); });
    BOOST_TEST(hvp.find("check_hvp: the output depends on no leaf that needs a gradient") != std::string::npos, hvp);
}

// Every op struct of the library on one recorded tape (inputs away from every kink): the tape
// re-runs at 50 digits, every node within a double's rounding of the recorded value, and its
// gradients pass the fast check as recorded. The op names must be the library's op list (LibraryOps,
// ops/all.hpp, whose every struct the registry holds); an op missing from the graph is named here.
BOOST_AUTO_TEST_CASE(a_tape_of_every_library_op_reruns_and_checks) {
    Tape<double> tape;
    const Var<double> J = testing::every_op_graph(tape);
    std::set<std::string> ops;
    for (std::size_t i = 0; i < tape.size(); ++i) ops.insert(std::string(tape.info(i).op));
    const std::string missing = testing::missing_names(testing::library_op_names(), ops);
    BOOST_TEST(missing.empty(), "ops of LibraryOps missing from testing::every_op_graph (a rule missing from tests/op_rules.hpp): " << missing);
    const std::string unlisted = testing::missing_names(ops, testing::library_op_names());
    BOOST_TEST(unlisted.empty(), "ops recorded but not in LibraryOps: " << unlisted);

    Tape<mp50> precise;
    std::vector<Var<mp50>> leaves;
    for (const std::uint32_t i : gradient_leaves(tape, J)) leaves.push_back(precise.leaf(tensor_cast<mp50>(tape.recorded(i).value)));
    const Var<mp50> J_precise = rerun(tape, J, std::span<const Var<mp50>>(leaves));
    BOOST_TEST_REQUIRE(precise.size() == tape.size());
    for (std::size_t i = 0; i < tape.size(); ++i) {
        const Tensor<double>& recorded = tape.recorded(i).value;
        const Tensor<mp50>& again = precise.recorded(i).value;
        BOOST_TEST_REQUIRE((recorded.shape() == again.shape()));
        for (std::size_t k = 0; k < recorded.size(); ++k) {
            // a double graph of ~60 nodes with exp and log: each value within 1e-12 (relative, or
            // absolute below 1) of its 50-digit re-run; -inf (masked scores) stays -inf
            const double x = recorded[k], y = to_double(again[k]);
            if (std::isinf(x)) BOOST_TEST_REQUIRE(x == y);
            else BOOST_TEST_REQUIRE(std::abs(x - y) <= 1e-12 * std::max(1.0, std::abs(y)), "node " << i << " " << tape.info(i).op);
        }
    }
    BOOST_TEST(to_double(J_precise.value()[0]) == J.value()[0], boost::test_tools::tolerance(1e-12));
    CheckOptions fast;
    fast.mode = CheckOptions::Mode::fast;
    const CheckReport report = check_gradients(tape, J, fast);
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 0u);
}

// Where the re-run at 50 digits takes another branch than the recording, the check says so by
// node: a relu whose input is 0 in double and −1e-17 at 50 digits ((x + b) − x, b lost to
// rounding in double), a max whose tie in double is no tie at 50 digits. The same graph with b
// large enough to survive rounding takes the same branches, and its report says nothing of them.
BOOST_AUTO_TEST_CASE(a_rerun_that_takes_another_branch_is_reported_by_node) {
    const auto record = [](Tape<double>& tape, double b) {
        const Var<double> x = tape.leaf(Tensor<double>::matrix({{1, 2}}), "x");
        const Var<double> h = relu(sub(add(x, tape.constant(Tensor<double>::matrix({{0.5, b}}))), x)).named("h");
        // lane (1 + 1, 2 + |b|): a tie in double for b = −1e-17, none at 50 digits
        const Var<double> m = max(add(x, tape.constant(Tensor<double>::matrix({{1, -b}}))), 1);
        return add(sum(mul(h, h)), sum(m));
    };
    Tape<double> tape;
    const Var<double> J = record(tape, -1e-17);
    const CheckReport report = check_gradients(tape, J);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST_REQUIRE(report.branch_changes.size() == 2u);
    const BranchChange& relu_change = report.branch_changes[0];
    BOOST_TEST(relu_change.op == "relu");
    BOOST_TEST(relu_change.label == "h");
    BOOST_TEST(tape.info(relu_change.node).op == "relu");
    BOOST_TEST(relu_change.elements == 1u);
    BOOST_TEST(relu_change.of == 2u);
    BOOST_TEST(relu_change.first == "(0, 1)");  // the second lane: a report naming the first is wrong
    BOOST_TEST(relu_change.recorded == 0.0);
    // (Not `== -1e-17` with a relative tolerance: Boost.Test compares against the tolerance itself
    // when one side is 0, so an unset 0 would pass; found by scripts/mutate.)
    BOOST_TEST((relu_change.precise < -0.99e-17 && relu_change.precise > -1.01e-17), relu_change.precise);
    BOOST_TEST(report.branch_changes[1].op == "max");
    BOOST_TEST(report.branch_changes[1].elements == 1u);
    BOOST_TEST(report.branch_changes[1].recorded == 2.0);  // max's own value: its input is another shape
    BOOST_TEST(report.summary().find(fmt::format("node {} (relu 'h'): 1 of 2 elements take another branch at 50 "
                                                 "digits than recorded (first at (0, 1)",
                                                 relu_change.node)) != std::string::npos);

    Tape<double> plain;
    const Var<double> J_plain = record(plain, -0.25);
    const CheckReport plain_report = check_gradients(plain, J_plain);
    BOOST_TEST(plain_report.branch_changes.empty());
    BOOST_TEST(plain_report.summary().find("another branch") == std::string::npos);
}

// Of several elements of one node that take another branch at 50 digits, the report counts them
// all and describes the first: its index, its recorded and its 50-digit input (a relu whose inputs
// (x + b) − x are 0 in double and −1e-17 at 50 digits in the last two lanes, 0.5 in the first).
BOOST_AUTO_TEST_CASE(of_several_elements_that_take_another_branch_the_first_is_described) {
    Tape<double> tape;
    const Var<double> x = tape.leaf(Tensor<double>::matrix({{1, 2, 4}}), "x");
    const Var<double> b = tape.constant(Tensor<double>::matrix({{0.5, -1e-17, -1e-17}}));
    const Var<double> h = relu(sub(add(x, b), x)).named("h");
    const CheckReport report = check_gradients(tape, sum(mul(h, h)));
    BOOST_TEST_REQUIRE(report.branch_changes.size() == 1u);
    const BranchChange& change = report.branch_changes[0];
    BOOST_TEST(change.elements == 2u);
    BOOST_TEST(change.of == 3u);
    BOOST_TEST(change.first == "(0, 1)");
    BOOST_TEST(change.recorded == 0.0);
    BOOST_TEST((change.precise < -0.99e-17 && change.precise > -1.01e-17), change.precise);
}
