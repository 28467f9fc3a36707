// The precision audit (check/audit.hpp): its per-leaf errors agree with an independent float64
// reference on the same float32 inputs; the storage formats round as IEEE's binary16 and bfloat16
// do; and the fault controls (the layer norm's variance as E[x²] − E[x]², softmax and logsumexp
// without the max shift, sigmoid's derivative from its saturated output, an exp whose VJP reads its
// output rounded too early) are each ranked first, by at least 2 digits more than the correct op;
// and what 16-bit storage breaks (a negative variance, an overflow, log of 0, inf − inf) is reported
// by node, not thrown; each format's unit roundoff is stated and measured in; a leaf's top
// contributor is the node that moves its gradient most, not the node ranked first locally; and
// every library op is audited on the graph of every op.
#define BOOST_TEST_MODULE audit
#include "op_rules.hpp"

#include "check/audit.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <string>

#include <unistd.h>  // dup, dup2: standard error captured

using namespace tapegrad;
using tapegrad::testing::random_tensor;

namespace {

// ---- the fault controls: test-only variants of library ops, each wrong in its arithmetic only ----

// σ² = E[x²] − E[x]²: two large numbers that cancel when the mean is large against the spread.
struct LayerNormNaiveVariance : LayerNorm {
    static constexpr std::string_view name = "layer_norm with E[x²] − E[x]²";
    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        using std::sqrt;
        const Tensor<T>& X = *in[0];
        const std::size_t D = X.cols(), N = X.size() / D;
        Y.resize(X.shape());
        saved.resize(Shape{N * D + N});
        for (std::size_t n = 0; n < N; ++n) {
            T mean(0), square(0);
            for (std::size_t j = 0; j < D; ++j) {
                mean += X[n * D + j];
                square += X[n * D + j] * X[n * D + j];
            }
            mean /= T(D);
            square /= T(D);
            const T r = T(1) / T(sqrt(T(square - mean * mean + s.epsilon)));
            saved[N * D + n] = r;
            for (std::size_t j = 0; j < D; ++j) {
                saved[n * D + j] = (X[n * D + j] - mean) * r;
                Y[n * D + j] = (*in[1])[j] * saved[n * D + j] + (*in[2])[j];
            }
        }
    }
};

// softmax as e^s / Σ e^s: overflows where the shifted form cannot.
struct SoftmaxWithoutShift : Softmax {
    static constexpr std::string_view name = "softmax without the max shift";
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& A, Tensor<T>&) {
        using std::exp;
        const Tensor<T>& S = *in[0];
        A.resize(S.shape());
        const std::size_t n = S.cols();
        for (std::size_t r = 0; r < S.size() / n; ++r) {
            T total(0);
            for (std::size_t j = 0; j < n; ++j) total += A[r * n + j] = exp(S[r * n + j]);
            for (std::size_t j = 0; j < n; ++j) A[r * n + j] /= total;
        }
    }
};

// log Σ e^x along the last axis (W: the weights), without the shift.
struct LogSumExpWithoutShift : LogSumExp {
    static constexpr std::string_view name = "logsumexp without the max shift";
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>& W) {
        using std::exp;
        using std::log;
        const Tensor<T>& X = *in[0];
        const std::size_t n = X.cols();
        out.resize(Shape{X.size() / n});
        W.resize(X.shape());
        for (std::size_t r = 0; r < X.size() / n; ++r) {
            T total(0);
            for (std::size_t j = 0; j < n; ++j) total += W[r * n + j] = exp(X[r * n + j]);
            out[r] = log(total);
            for (std::size_t j = 0; j < n; ++j) W[r * n + j] /= total;
        }
    }
};

// σ' as Y(1 − Y) from the rounded output (the library's op takes e^(−|a|) from its input).
struct SigmoidFromOutput : Sigmoid {
    static constexpr std::string_view name = "sigmoid with Y(1 − Y)";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * at.out[k] * (1 - at.out[k]);
    }
};

// The value a VJP reads, saved one storage type smaller than the op computes in (float's in
// bfloat16, double's in float, mp50's in double): the saved-intermediate class, an activation kept
// small to save memory. Exact arithmetic is still far finer than float (the 50-digit truth reads a
// double: 1e-16 relative), so the audit sees float's VJP lose what bfloat16 drops.
template <Scalar T>
T saved_one_type_smaller(const T& y) {
    if constexpr (std::is_same_v<T, float>) {
        return T(round_to(Storage::bfloat16, y));
    } else if constexpr (std::is_same_v<T, double>) {
        return T(static_cast<float>(y));
    } else {
        return T(to_double(y));
    }
}

struct ExpSavedOneTypeSmaller : Exp {
    static constexpr std::string_view name = "exp saving Y one type smaller";
    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        Exp::forward(s, in, Y, saved);
        saved = Y;
        for (std::size_t k = 0; k < Y.size(); ++k) saved[k] = saved_one_type_smaller(Y[k]);
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * at.saved[k];
    }
};

// Y = 2A whose VJP refuses in float only, as a VJP dividing by a value float rounds to 0 would:
// its forward passes, so only the audit's backward stages meet the refusal.
struct DoubleWhoseVjpRefusesInFloat {
    static constexpr std::string_view name = "double whose VJP refuses in float";
    using Settings = NoSettings;
    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = T(2) * A[k];
    }
    // dA = 2G, refused in float
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        if constexpr (std::is_same_v<T, float>) throw value_error("double whose VJP refuses in float: refused");
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = T(2) * at.G[k];
    }
};

const bool faults_registered = register_siblings<DoubleWhoseVjpRefusesInFloat>() &&
                               register_siblings<LayerNormNaiveVariance>() &&
                               register_siblings<SoftmaxWithoutShift>() && register_siblings<LogSumExpWithoutShift>() &&
                               register_siblings<SigmoidFromOutput>() && register_siblings<ExpSavedOneTypeSmaller>();

Tensor<float> float_tensor(const Shape& shape, std::mt19937_64& rng, double low, double high) {
    std::uniform_real_distribution<double> uniform(low, high);
    Tensor<float> t(shape);
    for (float& x : t.data()) x = static_cast<float>(uniform(rng));
    return t;
}

// J = Σ Y ∘ C with C > 0: no cancellation in the probe itself, so what the audit ranks first is
// the op under test, not the sum.
Var<float> positive_probe(const Var<float>& Y, std::mt19937_64& rng) {
    return sum(mul(Y, Y.tape().constant(float_tensor(Y.shape(), rng, 0.5, 1.5), "C")));
}

struct FaultCase {
    std::string name;
    std::string_view correct_op, faulty_op;
    // Records the graph on `tape` (with the faulty op when asked) and returns J.
    std::function<Var<float>(Tape<float>& tape, bool faulty)> graph;
};

const std::vector<FaultCase> fault_cases = {
    {"layer norm, variance as E[x²] − E[x]², rows of mean 1000", "layer_norm", LayerNormNaiveVariance::name,
     [](Tape<float>& tape, bool faulty) {
         std::mt19937_64 rng(11);
         const auto X = tape.leaf(float_tensor(Shape{6, 16}, rng, 998, 1002), "X");
         const auto g = tape.leaf(float_tensor(Shape{16}, rng, 0.5, 1.5), "gain");
         const auto b = tape.leaf(float_tensor(Shape{16}, rng, -0.5, 0.5), "bias");
         const Var<float> Y = faulty ? tape.record<LayerNormNaiveVariance>({X, g, b}, LayerNorm::Settings<float>{1e-5f})
                                     : layer_norm(X, g, b);
         return positive_probe(mul(Y, Y), rng);  // Y² > 0; Σ Y² alone would not depend on X
     }},
    // Scores near −100: e^s is below float's smallest normal number (1.2e-38), a subnormal with a
    // few bits left, where e^(s − max) is near 1. (Scores near +89 overflow instead, which the tape
    // refuses at once as a NaN output: the silent case is underflow.)
    {"softmax without the max shift, scores near -100", "softmax", SoftmaxWithoutShift::name,
     [](Tape<float>& tape, bool faulty) {
         std::mt19937_64 rng(12);
         const auto S = tape.leaf(float_tensor(Shape{4, 8}, rng, -104, -96), "S");
         return positive_probe(faulty ? tape.record<SoftmaxWithoutShift>({S}) : softmax(S), rng);
     }},
    {"logsumexp without the max shift, scores near -100", "logsumexp", LogSumExpWithoutShift::name,
     [](Tape<float>& tape, bool faulty) {
         std::mt19937_64 rng(13);
         const auto X = tape.leaf(float_tensor(Shape{4, 8}, rng, -104, -96), "X");
         return positive_probe(
             faulty ? tape.record<LogSumExpWithoutShift>({X}, reduction::Settings{1, false}) : logsumexp(X, 1), rng);
     }},
    {"sigmoid's derivative from its saturated output, inputs 17 to 25", "sigmoid", SigmoidFromOutput::name,
     [](Tape<float>& tape, bool faulty) {
         std::mt19937_64 rng(14);
         const auto A = tape.leaf(float_tensor(Shape{4, 8}, rng, 17, 25), "A");
         return positive_probe(faulty ? tape.record<SigmoidFromOutput>({A}) : sigmoid(A), rng);
     }},
    {"exp whose VJP reads its output saved one type smaller", "exp", ExpSavedOneTypeSmaller::name,
     [](Tape<float>& tape, bool faulty) {
         std::mt19937_64 rng(15);
         const auto A = tape.leaf(float_tensor(Shape{4, 8}, rng, -1, 1), "A");
         return positive_probe(faulty ? tape.record<ExpSavedOneTypeSmaller>({A}) : exp(A), rng);
     }},
};

const NodeAudit& node_of_op(const PrecisionAudit& audit, std::string_view op) {
    for (const NodeAudit& n : audit.nodes) {
        if (n.op == op) return n;
    }
    throw std::runtime_error(fmt::format("no node of op '{}' in the audit", op));
}

// The held-out graph: layer norm → causal attention → W_O → GELU → residual → logsumexp.
template <Scalar T>
struct HeldOut {
    std::vector<Var<T>> leaves;
    Var<T> J;
};

template <Scalar T>
HeldOut<T> held_out_graph(Tape<T>& tape, const std::vector<Tensor<float>>& values) {
    HeldOut<T> graph;
    for (const char* name : {"X", "gain", "bias", "W_Q", "W_K", "W_V", "W_O"}) {
        graph.leaves.push_back(tape.leaf(tensor_cast<T>(values[graph.leaves.size()]), name));
    }
    const std::vector<Var<T>>& in = graph.leaves;
    // ε and the attention scale 1/√d = 1/4 exact in float: the float tape's settings are the
    // double tape's, so both tapes compute one function (the reference differs by arithmetic only).
    const Var<T> H = layer_norm(in[0], in[1], in[2], LayerNormSettings{.epsilon = static_cast<double>(1e-5f)});
    const AttentionResult<T> attention = causal_attention(H, in[3], in[4], in[5]);
    const Var<T> R = add(in[0], gelu(matmul(attention.O, in[6])));
    graph.J = sum(logsumexp(R, 1));
    return graph;
}

std::vector<Tensor<float>> held_out_values(std::size_t T, std::size_t D, std::size_t d, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    return {float_tensor(Shape{T, D}, rng, -2, 2),     float_tensor(Shape{D}, rng, 0.5, 1.5),
            float_tensor(Shape{D}, rng, -0.5, 0.5),    float_tensor(Shape{D, d}, rng, -0.5, 0.5),
            float_tensor(Shape{D, d}, rng, -0.5, 0.5), float_tensor(Shape{D, d}, rng, -0.5, 0.5),
            float_tensor(Shape{d, D}, rng, -0.5, 0.5)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(storage_formats_round_as_ieee_and_bfloat16) {
    BOOST_TEST(faults_registered);
    // bfloat16: 8 significant bits. 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties to even (1).
    BOOST_TEST(round_to(Storage::bfloat16, 1 + 0x1p-8) == 1.0);
    BOOST_TEST(round_to(Storage::bfloat16, 1 + 3 * 0x1p-8) == 1 + 0x1p-6);
    BOOST_TEST(round_to(Storage::bfloat16, 3.0e38) == std::ldexp(226.0, 120));  // 3e38 / 2¹²⁰ = 225.7: float's range
    BOOST_TEST(std::isinf(round_to(Storage::bfloat16, 3.5e38)));
    // bfloat16 has float's exponent range: subnormals down to 2⁻¹³³ (2⁻¹²⁶ and 7 bits below it).
    BOOST_TEST(round_to(Storage::bfloat16, 3 * 0x1p-134) == 0x1p-132);  // 1.5 of 2⁻¹³³: a tie, to even (2)
    BOOST_TEST(round_to(Storage::bfloat16, 0x1p-134) == 0.0);            // a tie between 0 and 2⁻¹³³: even
    // binary16: 11 bits, largest 65504, subnormals down to 2⁻²⁴.
    BOOST_TEST(round_to(Storage::float16, 65519.0) == 65504.0);
    BOOST_TEST(std::isinf(round_to(Storage::float16, 65520.0)));
    BOOST_TEST(round_to(Storage::float16, 0x1p-25) == 0.0);  // a tie between 0 and 2⁻²⁴: even
    BOOST_TEST(round_to(Storage::float16, 3 * 0x1p-26) == 0x1p-24);
    BOOST_TEST(round_to(Storage::float16, 1 + 0x1p-11) == 1.0);
    BOOST_TEST(round_to(Storage::float16, -(1 + 3 * 0x1p-11)) == -(1 + 0x1p-9));
    BOOST_TEST(round_to(Storage::recorded, 0.1) == 0.1);
    BOOST_TEST(std::isnan(round_to(Storage::float16, std::nan(""))));
}

// The storage formats by the names tapegrad-audit's --storage takes, and no other.
BOOST_AUTO_TEST_CASE(storage_formats_are_found_by_name) {
    BOOST_TEST((storage_named("recorded") == Storage::recorded));
    BOOST_TEST((storage_named("bfloat16") == Storage::bfloat16));
    BOOST_TEST((storage_named("float16") == Storage::float16));
    BOOST_TEST(!storage_named("float8").has_value());
}

// Independent reference: the same float32 inputs on a Tape<double>, backward, and the float tape's
// own backward; ‖g_float − g_double‖ / ‖g_double‖ per leaf. The double gradient's own error is
// about 1e-16 relative, 1e-9 of the float error measured (1e-7), so the two must agree far better
// than the 2 significant digits asked; 1e-3 relative is the bound, fixed before the run.
BOOST_AUTO_TEST_CASE(leaf_errors_agree_with_a_float64_reference) {
    for (const std::size_t T : {16u, 48u}) {
        const std::vector<Tensor<float>> values = held_out_values(T, 16, 16, 100 + T);
        Tape<float> tape;
        const HeldOut<float> graph = held_out_graph(tape, values);
        const PrecisionAudit audit = audit_precision(tape, graph.J);
        tape.backward(graph.J);
        Tape<double> reference;
        const HeldOut<double> exact = held_out_graph(reference, values);
        reference.backward(exact.J);
        BOOST_TEST_MESSAGE(audit.table(8));
        BOOST_TEST_REQUIRE(audit.leaves.size() == graph.leaves.size());
        for (std::size_t l = 0; l < graph.leaves.size(); ++l) {
            const Tensor<float>& g = graph.leaves[l].grad();
            const Tensor<double>& g_exact = exact.leaves[l].grad();
            double difference2 = 0, exact2 = 0;
            for (std::size_t k = 0; k < g.size(); ++k) {
                difference2 += (g[k] - g_exact[k]) * (g[k] - g_exact[k]);
                exact2 += g_exact[k] * g_exact[k];
            }
            const double reference_error = std::sqrt(difference2 / exact2);
            const LeafAudit& leaf = audit.leaves[l];
            BOOST_TEST_MESSAGE(fmt::format("T = {:2} {:<5} audit {:.4e}, float64 reference {:.4e}", T, leaf.name,
                                           leaf.gradient.normwise, reference_error));
            BOOST_TEST(leaf.name == tape.recorded(graph.leaves[l].index()).label);
            BOOST_TEST(reference_error > 0);  // float32 gradients are not exact: there is something to measure
            BOOST_TEST(std::fabs(leaf.gradient.normwise - reference_error) <= 1e-3 * reference_error, leaf.name);
        }
    }
}

// Each fault control ranked first, by at least 2 digits more than the correct op on the same inputs.
BOOST_AUTO_TEST_CASE(fault_controls_are_ranked_first_by_two_digits) {
    for (const FaultCase& c : fault_cases) {
        Tape<float> correct_tape, faulty_tape;
        const Var<float> J_correct = c.graph(correct_tape, false);
        const Var<float> J_faulty = c.graph(faulty_tape, true);
        const PrecisionAudit correct = audit_precision(correct_tape, J_correct);
        const PrecisionAudit faulty = audit_precision(faulty_tape, J_faulty);
        const NodeAudit& good = node_of_op(correct, c.correct_op);
        const NodeAudit& bad = node_of_op(faulty, c.faulty_op);
        BOOST_TEST_MESSAGE(
            fmt::format("{}: correct op loses {:.2f} digits, faulty op {:.2f} (forward {:.2f}, VJP {:.2f}); "
                        "ranked first: {}",
                        c.name, good.local_digits, bad.local_digits, bad.local_forward.digits_lost,
                        bad.local_vjp.digits_lost, faulty.worst().op));
        // For the record (the estimate perturbs results, not an op's arithmetic): what random
        // rounding alone says of the faulty graph's first leaf, against the truth.
        BOOST_TEST_MESSAGE(fmt::format("  first leaf's gradient error: true {:.2e}, random-rounding estimate {:.2e}",
                                       faulty.leaves.at(0).gradient.normwise,
                                       estimate_precision(faulty_tape, J_faulty).leaves.at(0).normwise));
        BOOST_TEST(faulty.worst().node == bad.node, c.name << ": ranked first is " << faulty.worst().op);
        BOOST_TEST(bad.local_digits >= good.local_digits + 2, c.name);
    }
}

// bfloat16 storage on J = Σ x ∘ C: x's gradient is C rounded to bfloat16 (each element within u =
// 2⁻⁸, relative; normwise likewise, and well above 0 for random C). Two nodes round it, each alone
// making the whole error: the constant C, stored in bfloat16, and the mul, whose VJP's result G·C is
// stored so (rounding is idempotent: both at once is one rounding). Recorded float32: the gradient
// is exact (a product by G = 1), so the same audit must measure 0.
BOOST_AUTO_TEST_CASE(bfloat16_storage_lays_the_error_where_the_rounding_is) {
    std::mt19937_64 rng(21);
    Tape<float> tape;
    const auto x = tape.leaf(float_tensor(Shape{8, 8}, rng, -1, 1), "x");
    const auto C = tape.constant(float_tensor(Shape{8, 8}, rng, 0.5, 1.5), "C");
    const Var<float> J = sum(mul(x, C));
    const PrecisionAudit recorded = audit_precision(tape, J);
    BOOST_TEST(recorded.leaves.at(0).gradient.normwise == 0.0);
    BOOST_TEST(recorded.leaves.at(0).top_contributor_share == 0.0);  // of no error, no share (not 0 / 0)
    const PrecisionAudit bf16 = audit_precision(tape, J, {.storage = Storage::bfloat16});
    BOOST_TEST_MESSAGE(bf16.table());
    const AuditError& e = bf16.leaves.at(0).gradient;
    BOOST_TEST(bf16.unit_roundoff == 0x1p-8);
    BOOST_TEST(e.normwise > 0.05 * 0x1p-8);
    BOOST_TEST(e.normwise <= 0x1p-8);
    BOOST_TEST(e.worst_element <= 0x1p-8);
    BOOST_TEST(e.ulps <= 0.5);  // rounding to nearest: at most half a unit in the last place
    BOOST_TEST(e.ulps > 0.25);  // and of 64 roundings the largest is near that half, in bfloat16's units
    const LeafAudit& leaf = bf16.leaves.at(0);
    BOOST_TEST((leaf.top_contributor == C.index() || leaf.top_contributor == C.index() + 1));  // C or the mul
    BOOST_TEST(leaf.top_contributor_share == 1.0, boost::test_tools::tolerance(1e-9));
    const PrecisionAudit f16 = audit_precision(tape, J, {.storage = Storage::float16});
    BOOST_TEST(f16.leaves.at(0).gradient.normwise <= 0x1p-11);
    BOOST_TEST(f16.leaves.at(0).gradient.normwise < e.normwise);
}

// Each format's unit roundoff, half its ulp at 1 (p significant bits: u = 2^-p), stated once and
// used for every figure in units of u: a fault of a factor of two in any of them fails here.
BOOST_AUTO_TEST_CASE(each_format_states_its_unit_roundoff_and_measures_in_it) {
    std::mt19937_64 rng(41);
    Tape<float> tape;
    const auto x = tape.leaf(float_tensor(Shape{4, 4}, rng, -1, 1), "x");
    const Var<float> J = sum(mul(x, tape.constant(float_tensor(Shape{4, 4}, rng, 0.5, 1.5), "C")));
    Tape<double> tape64;
    const auto x64 = tape64.leaf(tensor_cast<double>(x.value()), "x");
    const Var<double> J64 = sum(mul(x64, tape64.constant(Tensor<double>(Shape{4, 4}, 0.75), "C")));
    struct Expected {
        PrecisionAudit audit;
        double u;
        std::string precision;
    };
    const std::vector<Expected> cases{
        {audit_precision(tape, J), 0x1p-24, "float32"},
        {audit_precision(tape64, J64), 0x1p-53, "float64"},
        {audit_precision(tape, J, {.storage = Storage::bfloat16}), 0x1p-8, "bfloat16 (computing in float32)"},
        {audit_precision(tape64, J64, {.storage = Storage::bfloat16}), 0x1p-8, "bfloat16 (computing in float64)"},
        {audit_precision(tape, J, {.storage = Storage::float16}), 0x1p-11, "float16 (computing in float32)"}};
    for (const Expected& c : cases) {
        BOOST_TEST(c.audit.precision == c.precision);
        BOOST_TEST(c.audit.unit_roundoff == c.u, c.precision);
        BOOST_TEST(c.audit.table().find(fmt::format("(u = {:.3g})", c.u)) != std::string::npos, c.precision);
        for (const LeafAudit& leaf : c.audit.leaves) {
            BOOST_TEST(leaf.gradient.in_u == leaf.gradient.normwise / c.u, boost::test_tools::tolerance(1e-12));
        }
    }
}

// The top contributor of a leaf's gradient is the node whose low precision alone moves it most,
// not the node ranked first by its own local error. J = Σ (x ∘ C1) ∘ C2 + Σ y ∘ C3 with x = y = 1,
// in bfloat16 (8 bits: 1 + 2^-9, 1 + 2^-11 and 1 + 3 · 2^-10 round to 1). For x, alone:
//   C1 kept in bfloat16: dx = C2, relative error 1 − 1/(1 + 2^-9)              ≈ 1.95e-3;
//   C2 (or the outer mul's VJP): error ≈ 2^-11                                  ≈ 4.9e-4;
//   the inner mul, whose VJP result (1 + 2^-11)(1 + 2^-9) is stored as 1:
//     1 − 1/((1 + 2^-9)(1 + 2^-11))                                             ≈ 2.44e-3,
// which is the whole error of the bfloat16 run (share 1). C3 (relative error 3 · 2^-10, 0.75 u) and
// its mul lose most locally and are ranked first, yet move only y's gradient.
BOOST_AUTO_TEST_CASE(the_top_contributor_is_the_node_that_moves_the_gradient_most) {
    Tape<float> tape;
    const auto ones = Tensor<float>(Shape{2, 2}, 1.0f);
    const auto x = tape.leaf(ones, "x");
    const auto y = tape.leaf(ones, "y");
    const auto C1 = tape.constant(Tensor<float>(Shape{2, 2}, 1 + 0x1p-9f), "C1");
    const auto C2 = tape.constant(Tensor<float>(Shape{2, 2}, 1 + 0x1p-11f), "C2");
    const auto C3 = tape.constant(Tensor<float>(Shape{2, 2}, 1 + 3 * 0x1p-10f), "C3");
    const Var<float> inner = mul(x, C1);
    const Var<float> outer_y = mul(y, C3);
    const Var<float> J = add(sum(mul(inner, C2)), sum(outer_y));
    const PrecisionAudit audit = audit_precision(tape, J, {.storage = Storage::bfloat16});
    BOOST_TEST_MESSAGE(audit.table());
    BOOST_TEST((audit.worst().node == C3.index() || audit.worst().node == outer_y.index()));
    for (const NodeAudit& n : audit.nodes)
        if (n.node == C3.index()) BOOST_TEST(n.label == "C3");
    const LeafAudit& lx = audit.leaves.at(0);
    BOOST_TEST(lx.name == "x");
    const double whole = 1 - 1 / ((1 + 0x1p-9) * (1 + 0x1p-11));
    BOOST_TEST(lx.gradient.normwise == whole, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(lx.top_contributor == inner.index(), "x's top contributor is node " << lx.top_contributor);
    BOOST_TEST(lx.top_contributor_op == "mul");
    BOOST_TEST(lx.top_contributor_share == 1.0, boost::test_tools::tolerance(1e-9));
    const LeafAudit& ly = audit.leaves.at(1);
    BOOST_TEST((ly.top_contributor == C3.index() || ly.top_contributor == outer_y.index()),
               "y's top contributor is node " << ly.top_contributor);
    BOOST_TEST(audit.table().find(fmt::format("node {} (mul), 100% alone", inner.index())) != std::string::npos);
    const auto parsed = nlohmann::json::parse(audit.json());
    BOOST_TEST(parsed["leaves"][0]["top_contributor"].get<std::uint32_t>() == inner.index());
}

// Of elements equally far from their truth, the first is the one named (a leaf of two equal
// values, each rounded alike to bfloat16: 1 + 2⁻¹⁰ to 1).
BOOST_AUTO_TEST_CASE(of_equally_bad_elements_the_first_is_named) {
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>(Shape{2}, 1.0f + 0x1p-10f), "x");
    const PrecisionAudit audit = audit_precision(tape, sum(mul(x, x)), {.storage = Storage::bfloat16});
    const auto found = std::find_if(audit.nodes.begin(), audit.nodes.end(),
                                    [&](const NodeAudit& n) { return n.node == x.index(); });
    BOOST_TEST_REQUIRE((found != audit.nodes.end()));
    BOOST_TEST(found->value.worst_element > 0.0);
    BOOST_TEST(found->value.worst_at == "(0)");
}

// A leaf that feeds more than one op input has its gradient's error told by branch: one per edge,
// each naming the op that uses the leaf and measured against that edge's 50-digit contribution.
BOOST_AUTO_TEST_CASE(a_leaf_feeding_two_ops_is_audited_by_branch) {
    std::mt19937_64 rng(23);
    Tape<float> tape;
    const auto x = tape.leaf(float_tensor(Shape{4, 4}, rng, -1, 1), "x");
    const auto C = tape.constant(float_tensor(Shape{4, 4}, rng, 0.5, 1.5), "C");
    const Var<float> a = mul(x, C);
    const Var<float> b = exp(x);
    const PrecisionAudit audit = audit_precision(tape, sum(add(a, b)), {.storage = Storage::bfloat16});
    const LeafAudit& leaf = audit.leaves.at(0);
    BOOST_TEST_REQUIRE(leaf.branches.size() == 2u);
    const std::set<std::uint32_t> consumers{leaf.branches[0].consumer, leaf.branches[1].consumer};
    BOOST_TEST((consumers == std::set<std::uint32_t>{a.index(), b.index()}));
    for (const BranchAudit& branch : leaf.branches) {
        BOOST_TEST(branch.slot == 0u);
        BOOST_TEST(branch.op == (branch.consumer == a.index() ? "mul" : "exp"));
        BOOST_TEST(branch.error.measured);
        BOOST_TEST(branch.error.normwise > 0.0);  // bfloat16 storage: each edge's contribution rounded
    }
}

// What `run` writes to standard error (through a temporary file on descriptor 2).
template <class Run>
std::string stderr_of(const Run& run) {
    std::fflush(stderr);
    FILE* file = std::tmpfile();
    BOOST_TEST_REQUIRE(file != nullptr);
    const int saved = ::dup(STDERR_FILENO);
    ::dup2(::fileno(file), STDERR_FILENO);
    run();
    std::fflush(stderr);
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    std::rewind(file);
    std::string text;
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
    std::fclose(file);
    return text;
}

// With progress on, a line per stage and per contributor run, numbered from 1, each with the
// seconds since the audit began, and a last line when it is done.
BOOST_AUTO_TEST_CASE(progress_lines_name_each_stage_and_contributor_run) {
    std::mt19937_64 rng(47);
    Tape<float> tape;
    const auto x = tape.leaf(float_tensor(Shape{3, 3}, rng, -1, 1), "x");
    const Var<float> J = sum(mul(x, tape.constant(float_tensor(Shape{3, 3}, rng, 0.5, 1.5), "C")));
    PrecisionAudit audit;
    const std::string lines = stderr_of([&] {
        audit = audit_precision(tape, J, {.storage = Storage::bfloat16, .contributor_candidates = 2, .progress = true});
    });
    BOOST_TEST_MESSAGE(lines);
    for (const std::string& line :
         {std::string(" s  re-running the tape at 50 digits"), std::string(" s  the bfloat16 (computing in float32) run"),
          std::string(" s  each node alone on exact inputs"), std::string(" s  2 runs with one node in low precision"),
          std::string(", run 1 of 2\n"), std::string(", run 2 of 2\n"), std::string(" s  done\n")}) {
        BOOST_TEST(lines.find(line) != std::string::npos, "'" << line << "' missing");
    }
    BOOST_TEST(lines.starts_with("audit_precision:      0.0 s  "));
    BOOST_TEST(stderr_of([&] { (void)audit_precision(tape, J); }).empty());  // off by default
}

// A double tape is audited against the same 50-digit truth: the held-out graph loses a few of
// double's digits at most (each leaf's gradient below 1e-13 relative: 2⁻⁵³ ≈ 1.1e-16 times a
// condition of at most 10³ on these well-scaled inputs), and the ranking holds its nodes.
BOOST_AUTO_TEST_CASE(double_tapes_are_audited_at_double_precision) {
    const std::vector<Tensor<float>> values = held_out_values(8, 8, 4, 7);
    Tape<double> tape;
    const HeldOut<double> graph = held_out_graph(tape, values);
    const PrecisionAudit audit = audit_precision(tape, graph.J);
    BOOST_TEST(audit.precision == "float64");
    BOOST_TEST(audit.unit_roundoff == 0x1p-53);
    BOOST_TEST(audit.nodes.size() == graph.J.index() + 1);
    for (const LeafAudit& leaf : audit.leaves) {
        BOOST_TEST(leaf.gradient.measured);
        BOOST_TEST(leaf.gradient.normwise < 1e-13, leaf.name);
    }
}

// Every library op on one double tape (the graph of every op, tests/op_rules.hpp): the audit runs
// each (its siblings at long double and 50 digits), every node's value and every leaf's gradient
// is measured and finite, and no op refuses what the run gives it. The gradients' errors stay
// below 1e-10: a double graph of some sixty nodes of values within ±10 loses a few digits of its
// 16 at most, and 1e-10 is six decades above u. An op struct of LibraryOps the audit did not meet
// is named (a rule missing from tests/op_rules.hpp).
BOOST_AUTO_TEST_CASE(every_library_op_is_audited) {
    Tape<double> tape;
    const Var<double> J = testing::every_op_graph(tape);
    const PrecisionAudit audit = audit_precision(tape, J);
    std::set<std::string> ops;
    for (const NodeAudit& node : audit.nodes) {
        ops.insert(node.op);
        BOOST_TEST(node.value.finite, node.op << " node " << node.node);
    }
    const std::string missing = testing::missing_names(testing::library_op_names(), ops);
    BOOST_TEST(missing.empty(), "op structs of LibraryOps the audit did not meet: " << missing);
    std::size_t measured = 0;  // a leaf the drawn graph leaves unused has no gradient to measure
    for (const LeafAudit& leaf : audit.leaves) {
        if (!leaf.gradient.measured) continue;
        ++measured;
        BOOST_TEST(leaf.gradient.finite, leaf.name);
        BOOST_TEST(leaf.gradient.normwise < 1e-10, leaf.name);
    }
    BOOST_TEST(measured >= 1u);
    BOOST_TEST(audit.events.empty());
    BOOST_TEST_MESSAGE(audit.table(10));
}

// A double tape's contributor runs hold their exact part finer than double (long double, or 50
// digits where long double is no wider): in J = Σ (x ∘ C1) ∘ C2 the only rounding of x's gradient is
// the inner mul's VJP, C2 · C1 rounded to double, so that node alone makes the whole error (share 1:
// the run rounds the same products as the float64 run), although the forward products round too.
BOOST_AUTO_TEST_CASE(a_double_tapes_top_contributor_is_measured_finer_than_double) {
    std::mt19937_64 rng(43);
    Tape<double> tape;
    const auto x = tape.leaf(random_tensor(Shape{4, 4}, rng), "x");
    const auto C1 = tape.constant(tensor_cast<double>(float_tensor(Shape{4, 4}, rng, 0.5, 1.5)), "C1");
    const auto C2 = tape.constant(random_tensor(Shape{4, 4}, rng), "C2");
    const Var<double> inner = mul(x, C1);
    const Var<double> J = sum(mul(inner, C2));
    const PrecisionAudit audit = audit_precision(tape, J);
    BOOST_TEST_MESSAGE(audit.table());
    const LeafAudit& leaf = audit.leaves.at(0);
    BOOST_TEST(leaf.gradient.normwise > 0.01 * 0x1p-53);  // random doubles' products round
    BOOST_TEST(leaf.top_contributor == inner.index(), "top contributor: node " << leaf.top_contributor);
    BOOST_TEST(leaf.top_contributor_share == 1.0, boost::test_tools::tolerance(1e-9));
}

// The three outputs: the table names the worst node first, the JSON parses and holds every node
// (a non-finite error as null, never as NaN text), the DOT picture fills each node by its error.
BOOST_AUTO_TEST_CASE(table_json_and_dot) {
    // A value lost to overflow, reported as such: e^11 to e^12 (6e4 to 1.6e5) kept in float16,
    // whose largest finite value is 65504, is inf where the truth is finite.
    Tape<float> tape;
    std::mt19937_64 rng(31);
    const auto A = tape.leaf(float_tensor(Shape{3, 4}, rng, 11, 12), "A");
    const Var<float> J = positive_probe(exp(A), rng);
    const PrecisionAudit audit = audit_precision(tape, J, {.storage = Storage::float16});
    const std::string table = audit.table();
    BOOST_TEST_MESSAGE(table);
    BOOST_TEST(audit.worst().op == "exp");
    // Its forward alone already overflows, so its VJP alone is not measured: lost, not an error of 1
    // against zeros (mutant #326 of src/check/audit.cpp, the NaN fill of that case dropped).
    BOOST_TEST(!audit.worst().local_forward.finite);
    BOOST_TEST(!audit.worst().local_vjp.finite);
    BOOST_TEST(table.find("(inf/NaN)") != std::string::npos);
    const nlohmann::json json = nlohmann::json::parse(audit.json());
    BOOST_TEST(json.at("nodes").size() == audit.nodes.size());
    BOOST_TEST(json.at("nodes").at(0).at("op") == "exp");
    BOOST_TEST(json.at("nodes").at(0).at("rank") == 1);  // ranks count from 1, as the table's do
    BOOST_TEST(json.at("nodes").at(0).at("local_forward").at("finite") == false);
    BOOST_TEST(json.at("nodes").at(0).at("local_forward").at("normwise").is_null());
    BOOST_TEST(json.at("leaves").at(0).at("name") == "A");
    const std::string dot = audit.dot();
    BOOST_TEST(dot.find("fillcolor=\"#ff0000\"") != std::string::npos);  // every digit lost: red
    std::size_t filled = 0;
    for (std::size_t at = dot.find("fillcolor"); at != std::string::npos; at = dot.find("fillcolor", at + 1)) ++filled;
    BOOST_TEST(filled == audit.nodes.size());
    BOOST_TEST(dot.find(fmt::format("  n{} -> n{};\n", A.index(), A.index() + 1)) != std::string::npos, dot);  // A into exp
}

// The four ways 16-bit storage drives a value out of what an op accepts or out of the format, each
// on a graph that is fine in float32: the audit reports each in its table and JSON (node, element,
// what happened, the format's run) and still audits every node and the leaf, where it used to throw
// the op's value_error out of the whole audit.
struct BrokenBy16Bits {
    std::string name;
    Storage storage;
    std::function<Var<float>(Tape<float>&)> graph;
    std::string op, words, format;  // an event at a node of this op says `words` in a run of `format`
};

std::vector<BrokenBy16Bits> broken_by_16_bits() {
    const auto leaf = [](Tape<float>& tape, float first, float step) {
        Tensor<float> x({1, 8});
        for (std::size_t k = 0; k < 8; ++k) x[k] = first + step * float(k);
        return tape.leaf(x, "X");
    };
    return {
        {"bfloat16: a layer norm's variance E[x²] − E[x]² goes negative", Storage::bfloat16,
         [&](Tape<float>& tape) {
             const Var<float> X = leaf(tape, 100.0f, 0.01f), m = mean(X, 1, true);
             const Var<float> variance = sub(mean(mul(X, X), 1, true), mul(m, m));  // 8e-4: 1e4 − 1e4 in bf16
             return sum(div(sub(X, m), sqrt(shift(variance, 1e-6f))));
         },
         "sqrt", "is negative", "bfloat16"},
        {"float16: a sum of squares overflows, then its square root", Storage::float16,
         [&](Tape<float>& tape) {
             const Var<float> X = leaf(tape, 200.0f, 1.0f);  // Σx² ≈ 3.3e5 > 65504
             const Var<float> s = scale(sum(X, 1, true), 0.125f);
             return sum(sqrt(shift(sub(scale(sum(mul(X, X), 1, true), 0.125f), mul(s, s)), 1.0f)));
         },
         "sum_axis", "value at (0, 0) is inf", "float16"},
        {"float16: log of a value rounded to zero", Storage::float16,
         [&](Tape<float>& tape) { return sum(log(leaf(tape, 1e-9f, 1e-9f))); },  // below float16's 6e-8
         "log", "is not positive", "float16"},
        {"float16: inf − inf", Storage::float16,
         [&](Tape<float>& tape) {
             const Var<float> X = leaf(tape, 300.0f, 1.0f);  // x² ≈ 9e4 > 65504 on both sides
             return sum(tanh(sub(mul(X, X), mul(X, scale(X, 1.0001f)))));
         },
         "sub", "value at (0, 0) is NaN", "float16"},
    };
}

// A VJP that refuses in the tape's precision after its forward passed: noted in the float32 run and
// in the node-alone stage, and the node's local VJP error is lost (inf or NaN), not measured from
// whatever the refused VJP left in its gradient buffers; the leaf's gradient is lost likewise.
BOOST_AUTO_TEST_CASE(a_vjp_refusing_in_low_precision_is_noted_and_its_gradient_lost) {
    BOOST_TEST(faults_registered);
    Tape<float> tape;
    const auto x = tape.leaf(Tensor<float>::matrix({{0.5f, -1.5f}, {2.0f, 0.25f}}), "x");
    const Var<float> Y = tape.record<DoubleWhoseVjpRefusesInFloat>({x});
    const PrecisionAudit audit = audit_precision(tape, sum(mul(Y, Y)));
    BOOST_TEST_MESSAGE(audit.table());
    const auto node = std::find_if(audit.nodes.begin(), audit.nodes.end(),
                                   [&](const NodeAudit& n) { return n.node == Y.index(); });
    BOOST_TEST_REQUIRE((node != audit.nodes.end()));
    BOOST_TEST(node->local_vjp.measured);
    BOOST_TEST(!node->local_vjp.finite);
    BOOST_TEST(!audit.leaves.at(0).gradient.finite);
    std::size_t noted = 0;
    for (const AuditEvent& e : audit.events) noted += e.node == Y.index() && e.what.find("refused") != std::string::npos;
    BOOST_TEST(noted >= 1u, audit.table());
}

BOOST_AUTO_TEST_CASE(what_16_bit_storage_breaks_is_reported_and_the_audit_goes_on) {
    for (const BrokenBy16Bits& c : broken_by_16_bits()) {
        Tape<float> tape;
        const Var<float> J = c.graph(tape);
        tape.backward(J);
        const float before = J.value().item();
        BOOST_TEST_REQUIRE(std::isfinite(before), c.name);  // fine in float32
        const PrecisionAudit audit = audit_precision(tape, J, {.storage = c.storage});
        BOOST_TEST_MESSAGE(c.name << "\n" << audit.table());
        const auto found = std::find_if(audit.events.begin(), audit.events.end(), [&](const AuditEvent& e) {
            return e.op == c.op && e.what.find(c.words) != std::string::npos && e.run.find(c.format) != std::string::npos;
        });
        BOOST_TEST_REQUIRE((found != audit.events.end()), c.name << ": no event at " << c.op << " saying " << c.words);
        BOOST_TEST(tape.recorded(found->node).kind->name == c.op, c.name);
        BOOST_TEST(audit.nodes.size() == J.index() + 1, c.name);  // every node audited
        BOOST_TEST_REQUIRE(audit.leaves.size() == 1u, c.name);
        BOOST_TEST(audit.leaves[0].gradient.measured, c.name);
        BOOST_TEST(audit.table().find(found->what) != std::string::npos, c.name);
        const nlohmann::json json = nlohmann::json::parse(audit.json());
        BOOST_TEST(json["events"].size() == audit.events.size(), c.name);
        BOOST_TEST(json.dump().find(c.words) != std::string::npos, c.name);
    }
}

BOOST_AUTO_TEST_CASE(misuse_is_refused_by_name) {
    Tape<float> tape, other;
    const auto x = tape.leaf(Tensor<float>(Shape{2, 2}, 1.0f), "x");
    const Var<float> Y = exp(x);
    const auto message = [](const std::string& expected) {
        return [expected](const error& e) { return std::string(e.what()).find(expected) != std::string::npos; };
    };
    BOOST_CHECK_EXCEPTION(audit_precision(tape, Y), shape_error, message("audit_precision: J must hold one element"));
    const Var<float> J_other = sum(other.leaf(Tensor<float>(Shape{2}, 1.0f)));
    BOOST_CHECK_EXCEPTION(audit_precision(tape, J_other), usage_error,
                          message("audit_precision: J is not a value of this tape"));
    // The estimate refuses the same misuse by its own name (a survivor of scripts/mutate: its
    // check dropped, the estimate ran on another tape's J).
    BOOST_CHECK_EXCEPTION(estimate_precision(tape, Y), shape_error, message("estimate_precision: J must hold one element"));
    BOOST_CHECK_EXCEPTION(estimate_precision(tape, J_other), usage_error,
                          message("estimate_precision: J is not a value of this tape"));
}

// The Monte Carlo estimate (no 50 digits) against the audit's 50-digit truth, where both run: the
// held-out graph at three sizes. Its purpose is the digits lost to within one digit, so each
// leaf's estimated error must be within a factor 10 of the true one (fixed before the run).
BOOST_AUTO_TEST_CASE(random_rounding_estimates_the_error_to_one_digit) {
    for (const std::size_t T : {16u, 32u, 64u}) {
        const std::vector<Tensor<float>> values = held_out_values(T, 16, 16, 300 + T);
        Tape<float> tape;
        const HeldOut<float> graph = held_out_graph(tape, values);
        const PrecisionAudit audit = audit_precision(tape, graph.J);
        const PrecisionEstimate estimate = estimate_precision(tape, graph.J, {.runs = 8, .seed = 5});
        BOOST_TEST_REQUIRE(estimate.leaves.size() == audit.leaves.size());
        for (std::size_t l = 0; l < audit.leaves.size(); ++l) {
            const double truth = audit.leaves[l].gradient.normwise, estimated = estimate.leaves[l].normwise;
            BOOST_TEST_MESSAGE(fmt::format("T = {:2} {:<5} true {:.2e}, estimated {:.2e} (ratio {:.2f})", T,
                                           estimate.leaves[l].name, truth, estimated, estimated / truth));
            BOOST_TEST(estimated > truth / 10, estimate.leaves[l].name);
            BOOST_TEST(estimated < truth * 10, estimate.leaves[l].name);
        }
    }
    Tape<float> tape;
    const Var<float> x = tape.leaf(Tensor<float>(Shape{2}, 1.0f), "x");
    const Var<float> J = sum(x);
    BOOST_CHECK_THROW(estimate_precision(tape, J, {.runs = 1}), value_error);
    const std::string not_a_loss = testing::message_of<shape_error>([&] { (void)estimate_precision(tape, mul(x, x)); });
    BOOST_TEST(not_a_loss.find("estimate_precision: J must hold one element") != std::string::npos, not_a_loss);
    // A leaf whose gradient is exactly 0 in every run has no spread: 0 and no digits lost, not 0/0.
    const Var<float> z = tape.leaf(Tensor<float>(Shape{2}, 3.0f), "z");
    const PrecisionEstimate zero = estimate_precision(tape, add(J, sum(mul(z, tape.constant(Tensor<float>(Shape{2}, 0.0f))))));
    BOOST_TEST_REQUIRE(zero.leaves.size() == 2u);
    BOOST_TEST(zero.leaves[1].name == "z");
    BOOST_TEST(zero.leaves[1].normwise == 0.0);
    BOOST_TEST(zero.leaves[1].digits_lost == 0.0);
}
