// Forward mode and second order: the Dual scalar (its rules, limits and strong zero next to −inf),
// dual products through the real kernels, jvp / hvp / hessian (every Hessian column against an
// independent 50-digit HVP, with a symmetric-but-wrong fault control), the 50-digit JVP and HVP checks on
// the attention graphs (composed and fused, causal with offset, multi-head with W_O,
// cross-entropy), and the fault controls each check must reject.
#define BOOST_TEST_MODULE second_order
#include "support.hpp"

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <utility>

using namespace tapegrad;
using tapegrad::testing::probe;
using tapegrad::testing::random_tensor;
using tapegrad::testing::scalar_of;

namespace {

using D = Dual<double>;

// tanh whose VJP is right at first order but reads a saved copy of Y that is not differentiated
// through (its tangent dropped): the PyTorch double-backward bug. Gradients are exact; H·v misses
// the term d(1 − Y²)/dx · G.
struct DetachedTanh : Tanh {
    static constexpr std::string_view name = "tanh with a detached saved output";
    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        Tanh::forward(s, in, Y, saved);
        saved.resize(Y.shape());
        for (std::size_t k = 0; k < Y.size(); ++k) {
            if constexpr (is_dual_v<T>) saved[k] = T(Y[k].value());  // the tangent is lost
            else saved[k] = Y[k];
        }
    }
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * (1 - at.saved[k] * at.saved[k]);
    }
};

// exp whose tangent rule is wrong (twice the derivative) while its value and VJP are right.
struct WrongTangentExp : Exp {
    static constexpr std::string_view name = "exp with a wrong tangent";
    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        Exp::forward(s, in, Y, saved);
        if constexpr (is_dual_v<T>)
            for (T& y : Y.data()) y.tangent() *= 2;
    }
};

template <class V>
V detached_tanh(const V& A) {
    return A.tape().template record<DetachedTanh>({A});
}
template <class V>
V wrong_tangent_exp(const V& A) {
    return A.tape().template record<WrongTangentExp>({A});
}

// The spec's attention over X, W_Q, W_K, W_V with the probe J = Σ O∘G.
const auto spec_attention = [](auto in) { return probe(attention(in[0], in[1], in[2], in[3]).O); };

std::vector<NamedTensor> attention_leaves(std::size_t T, std::size_t D_model, std::size_t d, std::mt19937_64& rng) {
    return {{"X", random_tensor(Shape{T, D_model}, rng)},
            {"W_Q", random_tensor(Shape{D_model, d}, rng)},
            {"W_K", random_tensor(Shape{D_model, d}, rng)},
            {"W_V", random_tensor(Shape{D_model, d}, rng)}};
}

// The JVP check on the graph's output Y (every entry), the HVP check on the loss `loss(Y)`.
template <std::size_t N, class Graph, class Loss>
void expect_both_checks_pass(Graph graph, Loss loss, const NamedTensor (&leaves)[N], const std::string& what) {
    const SecondOrderReport j = check_jvp(graph, leaves);
    BOOST_TEST(j.passed, what << ": " << j.summary());
    const SecondOrderReport h = check_hvp([&](auto in) { return loss(graph(in)); }, leaves);
    BOOST_TEST(h.passed, what << ": " << h.summary());
    BOOST_TEST(h.max_error_mp <= 1e-25);
    std::cout << what << ":\n  " << j.summary() << "\n  " << h.summary() << "\n";
}

}  // namespace

BOOST_AUTO_TEST_CASE(dual_rules_match_the_derivatives) {
    const D x(0.7, 1.0);
    BOOST_TEST((x * x).tangent() == 1.4);
    BOOST_TEST((D(1) / x).tangent() == -1 / (0.7 * 0.7), boost::test_tools::tolerance(1e-15));
    BOOST_TEST(exp(x).tangent() == std::exp(0.7), boost::test_tools::tolerance(1e-15));
    BOOST_TEST(tanh(x).tangent() == 1 - std::tanh(0.7) * std::tanh(0.7), boost::test_tools::tolerance(1e-15));
    BOOST_TEST(erf(x).tangent() == 2 / std::sqrt(M_PI) * std::exp(-0.49), boost::test_tools::tolerance(1e-15));
    BOOST_TEST(sqrt(x).tangent() == 0.5 / std::sqrt(0.7), boost::test_tools::tolerance(1e-15));
    BOOST_TEST(log(x).tangent() == 1 / 0.7, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(pow(x, D(3)).tangent() == 3 * 0.49, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(abs(D(-0.7, 1.0)).tangent() == -1.0);
    BOOST_TEST(abs(D(0.0, 1.0)).tangent() == 0.0);  // sign(0) = 0, as ops/abs.hpp
    BOOST_TEST((D(1, 5) < D(2, -5)));                  // comparisons compare values
    BOOST_TEST((D(1, 5) == D(1, -5)));
}

// A hidden score is −inf with zero tangent; arithmetic with it must give what the real code gives.
BOOST_AUTO_TEST_CASE(a_zero_tangent_is_a_strong_zero_next_to_infinity) {
    const D hidden = -std::numeric_limits<D>::infinity();
    BOOST_TEST(hidden.value() == -std::numeric_limits<double>::infinity());
    BOOST_TEST(hidden.tangent() == 0.0);
    const D product = hidden * D(2.0, 3.0);
    BOOST_TEST(!is_nan(D(product.value(), 0.0)));
    const D weight = exp(hidden - D(1.0, 0.5));  // softmax of a hidden position
    BOOST_TEST(weight.value() == 0.0);
    BOOST_TEST(weight.tangent() == 0.0);
    BOOST_TEST((hidden * D(2.0, 0.0)).tangent() == 0.0);  // −inf·2 is −inf, moving not at all
    BOOST_TEST(std::numeric_limits<Dual<mp50>>::epsilon().value() == std::numeric_limits<mp50>::epsilon());
    BOOST_TEST(to_double(D(2.5, 7.0)) == 2.5);
}

// Each form of a dual product equals the product written out in dual arithmetic, with and without
// accumulation, in 50 digits (where both are exact to rounding), with tangents dense, sparse (every
// other one exactly zero: the planes' zeros are skipped for scalars without compiled kernels,
// autodiff/dual_kernels.hpp) or all zero (a constant operand), on either side.
BOOST_AUTO_TEST_CASE(dual_products_are_real_products_of_the_planes) {
    std::mt19937_64 rng(3);
    const std::size_t m = 3, n = 4, k = 5;
    enum class Tangents { dense, sparse, zero };
    const auto dual_random = [&](std::size_t size, Tangents tangents) {
        std::vector<Dual<mp50>> x(size);
        const Tensor<double> v = random_tensor(Shape{size}, rng), t = random_tensor(Shape{size}, rng);
        for (std::size_t i = 0; i < size; ++i) {
            const bool zero = tangents == Tangents::zero || (tangents == Tangents::sparse && (i + size) % 2 == 0);
            x[i] = Dual<mp50>(mp50(v[i]), zero ? mp50(0) : mp50(t[i]));
        }
        return x;
    };
    const Tangents kinds[] = {Tangents::dense, Tangents::sparse, Tangents::zero};
    for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
        for (const Tangents tangents_a : kinds) {
            for (const Tangents tangents_b : kinds) {
                for (const bool accumulate : {true, false}) {
                    const auto A = dual_random(m * k, tangents_a), B = dual_random(k * n, tangents_b);
                    std::vector<Dual<mp50>> C = dual_random(m * n, Tangents::dense);
                    std::vector<Dual<mp50>> expected = accumulate ? C : std::vector<Dual<mp50>>(m * n, Dual<mp50>(0));
                    kernels::gemm(form, m, n, k, A.data(), B.data(), C.data(), accumulate);
                    for (std::size_t i = 0; i < m; ++i)
                        for (std::size_t j = 0; j < n; ++j)
                            for (std::size_t p = 0; p < k; ++p) {
                                const Dual<mp50>& a = form == kernels::Form::aTb ? A[p * m + i] : A[i * k + p];
                                const Dual<mp50>& b = form == kernels::Form::abT ? B[j * k + p] : B[p * n + j];
                                expected[i * n + j] += a * b;
                            }
                    for (std::size_t x = 0; x < m * n; ++x) {
                        BOOST_TEST(to_double(mp50(abs(C[x].value() - expected[x].value()))) <= 1e-45);
                        BOOST_TEST(to_double(mp50(abs(C[x].tangent() - expected[x].tangent()))) <= 1e-45);
                    }
                }
            }
        }
    }
}

// A zero tangent is a strong zero in a product too: beside an infinite value (a masked score) it
// contributes nothing, where the planes' real product would give 0·inf = NaN.
BOOST_AUTO_TEST_CASE(a_zero_tangent_beside_an_infinite_value_gives_no_nan_in_a_product) {
    const mp50 inf = std::numeric_limits<mp50>::infinity();
    const std::vector<Dual<mp50>> A = {Dual<mp50>(mp50(2), mp50(1)), Dual<mp50>(mp50(3), mp50(0))};  // 1×2
    const std::vector<Dual<mp50>> B = {Dual<mp50>(mp50(5), mp50(0)), Dual<mp50>(-inf, mp50(0))};  // 2×1
    std::vector<Dual<mp50>> C(1);
    kernels::gemm(kernels::Form::ab, 1, 1, 2, A.data(), B.data(), C.data(), false);
    BOOST_TEST(to_double(C[0].value()) == -std::numeric_limits<double>::infinity());
    BOOST_TEST(to_double(C[0].tangent()) == 5.0);  // 1·5 + 0·(−inf) with the zero strong
}

// The tape's NaN scan reads a tensor of n Dual<double> as 2n doubles (autodiff/scalar.hpp,
// StoredAs) once it is longer than the inline scan: a NaN in any value or tangent, first or last,
// short or long tensor, is refused with its index. (Scanning n numbers instead of 2n would miss
// the last tangents; a stride of one dual would miss every tangent.)
BOOST_AUTO_TEST_CASE(a_dual_tape_refuses_nan_in_any_value_or_tangent) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const std::size_t n : {std::size_t{5}, std::size_t{40}}) {
        for (const std::size_t at : {std::size_t{0}, n - 1}) {
            for (const bool in_tangent : {false, true}) {
                Tensor<Dual<double>> x(Shape{n});
                for (std::size_t k = 0; k < n; ++k) x[k] = Dual<double>(1.0 + static_cast<double>(k), 0.5);
                (in_tangent ? x[at].tangent() : x[at].value()) = nan;
                Tape<Dual<double>> tape;
                const std::string message = testing::message_of<value_error>([&] { tape.leaf(x, "x"); });
                BOOST_TEST(message.find("NaN in x at index " + index_string(x.shape(), at)) != std::string::npos,
                           "n=" << n << " at=" << at << " tangent=" << in_tangent << ": " << message);
            }
        }
    }
}

// The Hessian of J = Σ tanh(X·W) ∘ X: symmetric to rounding, each column one HVP, and in double
// within the double checker's tolerance of the 50-digit one.
BOOST_AUTO_TEST_CASE(the_hessian_is_symmetric_and_agrees_across_precisions) {
    std::mt19937_64 rng(5);
    const auto graph = [](auto in) { return sum(mul(tanh(matmul(in[0], in[1])), in[0])); };
    const std::array<Tensor<double>, 2> x{random_tensor(Shape{2, 3}, rng), random_tensor(Shape{3, 3}, rng)};
    const Tensor<double> H = hessian(graph, x);
    const Tensor<mp50> H_mp = hessian(graph, std::array<Tensor<mp50>, 2>{tensor_cast<mp50>(x[0]), tensor_cast<mp50>(x[1])});
    BOOST_TEST(H.rows() == 15u);
    for (std::size_t i = 0; i < H.rows(); ++i)
        for (std::size_t j = 0; j < H.cols(); ++j) {
            BOOST_TEST(std::abs(H(i, j) - H(j, i)) <= 1e-14);
            BOOST_TEST(to_double(mp50(abs(H_mp(i, j) - H_mp(j, i)))) <= 1e-45);
            BOOST_TEST(std::abs(H(i, j) - to_double(H_mp(i, j))) <= 1e-9);
        }
}

// The 50-digit gradient of `graph` at `x`, flattened leaf after leaf (the Hessian's coordinates).
template <std::size_t N, class Graph>
std::vector<mp50> gradient_at_50_digits(const Graph& graph, const std::array<Tensor<mp50>, N>& x) {
    Tape<mp50> tape;
    std::array<Var<mp50>, N> vars;
    for (std::size_t l = 0; l < N; ++l) vars[l] = tape.leaf(x[l], fmt::format("x{}", l));
    tape.backward(graph(vars));
    std::vector<mp50> g;
    for (const Var<mp50>& v : vars) g.insert(g.end(), v.grad().data().begin(), v.grad().data().end());
    return g;
}

// Every column c of hessian(graph, x), at double and at 50 digits, against an HVP computed
// independently of the dual numbers: the 50-digit central difference of the 50-digit gradient
// along e_c, (∇J(x + h·e_c) − ∇J(x − h·e_c)) / 2h. The thresholds are check_hvp's (derived in
// check/second_order.hpp): h = 1e-14 leaves a truncation of 1.7e-29·|∂⁴J| and a rounding of 5e-37,
// so 1e-25 on the mixed error for the 50-digit Hessian and 1e-9 for the double one. Also H·v for
// random v against hvp(graph, x, v) (50 digits, 1e-40: both are sums of ~1e-49 roundings), which
// holds the columns' order and placement. Returns the worst mixed errors (50-digit, double).
template <std::size_t N, class Graph>
std::pair<double, double> hessian_column_errors(const Graph& graph, const std::array<Tensor<double>, N>& x) {
    std::array<Tensor<mp50>, N> x_mp;
    for (std::size_t l = 0; l < N; ++l) x_mp[l] = tensor_cast<mp50>(x[l]);
    const Tensor<double> H = hessian(graph, x);
    const Tensor<mp50> H_mp = hessian(graph, x_mp);
    const mp50 h(1e-14);
    const auto mixed = [](const mp50& a, const mp50& n) {
        return to_double(mp50(abs(a - n) / std::max(mp50(1), mp50(abs(n)))));
    };
    double worst_mp = 0, worst_double = 0;
    std::size_t c = 0;
    for (std::size_t l = 0; l < N; ++l) {
        for (std::size_t k = 0; k < x[l].size(); ++k, ++c) {
            std::array<Tensor<mp50>, N> plus = x_mp, minus = x_mp;
            plus[l][k] += h;
            minus[l][k] -= h;
            const std::vector<mp50> g_plus = gradient_at_50_digits(graph, plus),
                                    g_minus = gradient_at_50_digits(graph, minus);
            for (std::size_t r = 0; r < H.rows(); ++r) {
                const mp50 numeric = (g_plus[r] - g_minus[r]) / (2 * h);
                worst_mp = std::max(worst_mp, mixed(H_mp(r, c), numeric));
                worst_double = std::max(worst_double, mixed(mp50(H(r, c)), numeric));
            }
        }
    }
    BOOST_TEST(c == H.rows());
    std::mt19937_64 rng(c);
    for (int trial = 0; trial < 3; ++trial) {
        std::array<Tensor<mp50>, N> v;
        for (std::size_t l = 0; l < N; ++l) v[l] = tensor_cast<mp50>(random_tensor(x[l].shape(), rng));
        const HvpResult<mp50, N> direct = hvp(graph, x_mp, v);
        std::size_t r = 0;
        for (std::size_t l = 0; l < N; ++l)
            for (std::size_t k = 0; k < x[l].size(); ++k, ++r) {
                mp50 Hv(0);
                std::size_t j = 0;
                for (std::size_t m = 0; m < N; ++m)
                    for (std::size_t i = 0; i < x[m].size(); ++i, ++j) Hv += H_mp(r, j) * v[m][i];
                BOOST_TEST(mixed(Hv, direct.Hv[l][k]) <= 1e-40);
            }
    }
    return {worst_mp, worst_double};
}

// The Hessian's columns against independent HVPs on two graphs: J = Σ tanh(X·W) ∘ X, and a
// layer-norm, GELU and cross-entropy block over four leaves of different shapes (so a column
// placed in the wrong leaf's block would show).
BOOST_AUTO_TEST_CASE(every_hessian_column_equals_an_independent_hvp) {
    std::mt19937_64 rng(15);
    const auto small = [](auto in) { return sum(mul(tanh(matmul(in[0], in[1])), in[0])); };
    const std::array<Tensor<double>, 2> x_small{random_tensor(Shape{2, 3}, rng), random_tensor(Shape{3, 3}, rng)};
    const std::vector<std::size_t> targets{1, 0};
    const auto block = [&targets](auto in) {
        return cross_entropy(matmul(gelu(layer_norm(in[0], in[1], in[2])), in[3]),
                             std::span<const std::size_t>(targets));
    };
    Tensor<double> gain = random_tensor(Shape{3}, rng);
    for (double& g : gain.data()) g += 1.5;  // in [0.5, 2.5]
    const std::array<Tensor<double>, 4> x_block{random_tensor(Shape{2, 3}, rng), gain, random_tensor(Shape{3}, rng),
                                                random_tensor(Shape{3, 2}, rng)};
    const auto [small_mp, small_double] = hessian_column_errors(small, x_small);
    const auto [block_mp, block_double] = hessian_column_errors(block, x_block);
    BOOST_TEST(small_mp <= 1e-25);
    BOOST_TEST(small_double <= 1e-9);
    BOOST_TEST(block_mp <= 1e-25);
    BOOST_TEST(block_double <= 1e-9);
    BOOST_TEST_MESSAGE("Hessian columns against differences of the 50-digit gradient: tanh graph (15x15) 50-digit "
                       << small_mp << ", double " << small_double << "; layer-norm block (18x18) 50-digit " << block_mp
                       << ", double " << block_double);
}

// Fault control: with tanh's saved output detached, J = Σ tanh(A) ∘ G gets a Hessian of zeros:
// symmetric, so the symmetry check passes it, but every diagonal column misses the independent HVP.
BOOST_AUTO_TEST_CASE(a_symmetric_but_wrong_hessian_is_rejected_by_its_columns) {
    std::mt19937_64 rng(16);
    const auto faulty = [](auto in) { return probe(detached_tanh(in[0])); };
    const std::array<Tensor<double>, 1> x{random_tensor(Shape{2, 3}, rng)};
    const Tensor<double> H = hessian(faulty, x);
    for (std::size_t i = 0; i < H.rows(); ++i)
        for (std::size_t j = 0; j < H.cols(); ++j) BOOST_TEST(H(i, j) == H(j, i));
    const auto [worst_mp, worst_double] = hessian_column_errors(faulty, x);
    BOOST_TEST(worst_mp > 1e-3);
    BOOST_TEST(worst_double > 1e-3);
    const auto [right_mp, right_double] = hessian_column_errors([](auto in) { return probe(tanh(in[0])); }, x);
    BOOST_TEST(right_mp <= 1e-25);
    BOOST_TEST(right_double <= 1e-9);
}

BOOST_AUTO_TEST_CASE(jvp_returns_the_forward_value_and_hvp_the_gradient) {
    std::mt19937_64 rng(6);
    const auto graph = [](auto in) { return sum(exp(in[0])); };
    const std::array<Tensor<double>, 1> x{random_tensor(Shape{2, 2}, rng)};
    const std::array<Tensor<double>, 1> t{random_tensor(Shape{2, 2}, rng)};
    const JvpResult<double> r = jvp(graph, x, t);
    const HvpResult<double, 1> h = hvp(graph, x, t);
    double value = 0, tangent = 0;
    for (std::size_t k = 0; k < 4; ++k) {
        value += std::exp(x[0][k]);
        tangent += std::exp(x[0][k]) * t[0][k];
        BOOST_TEST(h.gradient[0][k] == std::exp(x[0][k]), boost::test_tools::tolerance(1e-15));
        BOOST_TEST(h.Hv[0][k] == std::exp(x[0][k]) * t[0][k], boost::test_tools::tolerance(1e-15));
    }
    BOOST_TEST(r.value.item() == value, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(r.tangent.item() == tangent, boost::test_tools::tolerance(1e-14));
    BOOST_TEST(testing::message_of<shape_error>([&] { jvp(graph, x, std::array<Tensor<double>, 1>{Tensor<double>(Shape{3})}); })
                   .find("direction for leaf 0 has shape [3]") != std::string::npos);
    BOOST_TEST(testing::message_of<usage_error>([&] { hvp([](auto in) { return exp(in[0]); }, x, t); })
                   .find("hvp: the graph must return a scalar J") != std::string::npos);
}

// A Dual over a Dual (a Scalar, autodiff/scalar.hpp) differentiates twice in forward mode: with the
// inner tangent the unit at i and the outer one v, J's tangent's tangent is (H·v)_i, which the
// library's forward over reverse must give too, for every element of both leaves. Y's element 0
// and v's there are exactly 0, so the first derivative of X∘Y along v is exactly 0 there while its
// own derivative with respect to Y's element 0 is v_X's: a dual is a strong zero only when both its
// parts are (autodiff/dual.hpp), or that term would be dropped (and this test fails).
BOOST_AUTO_TEST_CASE(a_dual_over_a_dual_gives_what_forward_over_reverse_gives) {
    using DD = Dual<Dual<double>>;
    std::mt19937_64 rng(11);
    std::array<Tensor<double>, 2> at{random_tensor(Shape{2, 3}, rng), random_tensor(Shape{2, 3}, rng)};
    std::array<Tensor<double>, 2> v{random_tensor(Shape{2, 3}, rng), random_tensor(Shape{2, 3}, rng)};
    at[1][0] = 0;
    v[1][0] = 0;
    const auto graph = [](auto in) {
        return sum(mul(tanh(mul(in[0], in[1])), matmul(softmax(matmul(in[0], transpose(in[1]))), in[1])));
    };
    const HvpResult<double, 2> reference = hvp(graph, at, v);
    for (std::size_t leaf = 0; leaf < 2; ++leaf) {
        for (std::size_t i = 0; i < at[leaf].size(); ++i) {
            Tape<DD> tape;
            std::array<Var<DD>, 2> leaves;
            for (std::size_t l = 0; l < 2; ++l) {
                Tensor<DD> seeded(at[l].shape());
                for (std::size_t k = 0; k < seeded.size(); ++k)
                    seeded[k] = DD(D(at[l][k], l == leaf && k == i ? 1 : 0), D(v[l][k], 0));
                leaves[l] = tape.leaf(seeded, l == 0 ? "x" : "y");
            }
            const Var<DD> J = graph(leaves);
            BOOST_TEST(J.value()[0].value().tangent() == reference.gradient[leaf][i],
                       boost::test_tools::tolerance(1e-13));
            BOOST_TEST(J.value()[0].tangent().tangent() == reference.Hv[leaf][i], boost::test_tools::tolerance(1e-12));
        }
    }
}

// Fault control: gradients exact, second derivative wrong. The gradient checker passes it; the
// HVP check names the leaf and index.
BOOST_AUTO_TEST_CASE(a_saved_value_not_differentiated_through_is_rejected_by_the_hvp_check) {
    std::mt19937_64 rng(7);
    const NamedTensor leaves[] = {{"A", random_tensor(Shape{2, 3}, rng)}};
    const auto faulty = [](auto in) { return probe(detached_tanh(in[0])); };
    BOOST_TEST(check_gradients(faulty, leaves).passed);
    const SecondOrderReport report = check_hvp(faulty, leaves);
    BOOST_TEST(!report.passed);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.summary().find("leaf A index (") != std::string::npos, report.summary());
    BOOST_TEST(report.summary().find("analytic (H·v, 50-digit dual tape)") != std::string::npos);
    const SecondOrderReport right = check_hvp([](auto in) { return probe(tanh(in[0])); }, leaves);
    BOOST_TEST(right.passed, right.summary());
}

// Fault control: a wrong tangent rule is rejected by the JVP check and by the transpose identity,
// while the gradient checker (reverse mode only) passes it.
BOOST_AUTO_TEST_CASE(a_wrong_tangent_rule_is_rejected_by_the_jvp_check_and_the_transpose_identity) {
    std::mt19937_64 rng(8);
    const NamedTensor leaves[] = {{"A", random_tensor(Shape{2, 3}, rng)}};
    const auto faulty = [](auto in) { return wrong_tangent_exp(in[0]); };
    BOOST_TEST(check_gradients([&](auto in) { return probe(faulty(in)); }, leaves).passed);
    const SecondOrderReport report = check_jvp(faulty, leaves);
    BOOST_TEST(!report.passed);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.summary().find("output Y index (") != std::string::npos, report.summary());
    BOOST_TEST(report.max_transpose_error > 1e-3);
    BOOST_TEST(check_jvp([](auto in) { return exp(in[0]); }, leaves).passed);
}

BOOST_AUTO_TEST_CASE(the_spec_attention_passes_at_8_within_the_50_digit_threshold) {
    std::mt19937_64 rng(11);
    const std::vector<NamedTensor> v = attention_leaves(8, 8, 8, rng);
    const NamedTensor leaves[] = {v[0], v[1], v[2], v[3]};
    const SecondOrderReport h = check_hvp(spec_attention, leaves);
    BOOST_TEST(h.passed, h.summary());
    BOOST_TEST(h.max_error_mp <= 1e-25);
    std::cout << "spec attention T=D=d=8 over X, W_Q, W_K, W_V: " << h.summary() << "\n";
}

// Rows longer than fast::inline_row_size take softmax's dual-plane rows (ops/fast/softmax_rows.hpp)
// on the double dual tape, which both checks compare with 50-digit differences (double_tolerance,
// 1e-9); a wrong or dropped term of those tangent formulas misses by O(1). The causal mask puts
// hidden (−inf) scores in the rows, and J = Σ (A∘A)∘G gives softmax's VJP an upstream that has a
// tangent of its own (with J = Σ A∘G it would be a constant).
BOOST_AUTO_TEST_CASE(long_softmax_rows_take_the_dual_planes_and_pass_both_checks) {
    constexpr std::size_t n = 20;
    static_assert(n > fast::inline_row_size);
    std::mt19937_64 rng(14);
    const NamedTensor leaves[] = {{"S", random_tensor(Shape{3, n}, rng, 2.0)}};
    const auto J = [](auto A) { return probe(mul(A, A)); };
    expect_both_checks_pass([](auto in) { return softmax(in[0]); }, J, leaves, "softmax, rows of 20");
    const Tensor<double> visible = causal_mask(3, n, n - 4);
    expect_both_checks_pass(
        [&](auto in) {
            using T = scalar_of<decltype(in[0])>;
            return softmax(mask(in[0], in[0].tape().constant(tensor_cast<T>(visible), "M")));
        },
        J, leaves, "causal mask then softmax, rows of 20");
}

// Two queries at positions 2..3 over four cached keys (query_offset 2), batch of 2.
BOOST_AUTO_TEST_CASE(composed_and_fused_causal_attention_with_offset_pass) {
    std::mt19937_64 rng(12);
    const NamedTensor leaves[] = {{"Q", random_tensor(Shape{2, 2, 3}, rng)},
                                  {"K", random_tensor(Shape{2, 4, 3}, rng)},
                                  {"V", random_tensor(Shape{2, 4, 2}, rng)}};
    const auto J = [](auto O) { return probe(O); };
    expect_both_checks_pass([](auto in) { return causal_attention(in[0], in[1], in[2], 2).O; }, J, leaves,
                            "composed causal attention, offset 2");
    expect_both_checks_pass([](auto in) { return fused_attention(in[0], in[1], in[2], true, 2, FusedAttentionTiles{1, 2}); },
                            J, leaves, "fused causal attention, offset 2, 1x2 tiles");
    expect_both_checks_pass([](auto in) { return fused_attention(in[0], in[1], in[2], false, 0); }, J, leaves,
                            "fused attention");
}

BOOST_AUTO_TEST_CASE(multihead_attention_with_w_o_and_cross_entropy_pass) {
    std::mt19937_64 rng(13);
    const NamedTensor leaves[] = {{"X", random_tensor(Shape{2, 3, 4}, rng)},
                                  {"W_QK", random_tensor(Shape{4, 4}, rng)},
                                  {"W_V", random_tensor(Shape{4, 4}, rng)},
                                  {"W_O", random_tensor(Shape{4, 3}, rng)}};
    const std::vector<std::size_t> targets{0, 2, 1, 1, 0, 2};
    for (const AttentionKernel kernel : {AttentionKernel::composed, AttentionKernel::fused}) {
        MultiHeadOptions options;
        options.heads = 2;
        options.causal = true;
        options.kernel = kernel;
        const auto graph = [&](auto in) {
            using T = scalar_of<decltype(in[0])>;
            return multihead_attention(in[0], MultiHeadWeights<T>{in[1], in[1], in[2], in[3]}, options).Y;
        };
        expect_both_checks_pass(graph, [&](auto Y) { return cross_entropy(Y, targets); }, leaves,
                                kernel == AttentionKernel::fused ? "multi-head fused, tied W_Q = W_K, cross-entropy"
                                                                 : "multi-head composed, tied W_Q = W_K, cross-entropy");
    }
}
