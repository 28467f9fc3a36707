// bfloat16 mixed precision (Tape::set_product_precision, ops/matmul_bf16.hpp): the fast rounding of
// a float is the reference rounding at every boundary; a float tape under the bfloat16 policy
// records matmul_bf16, whose forward and VJP are the float32-accumulated product of bfloat16-rounded
// operands (held to a double reference within gemm_bf16's bound, and away from the unrounded
// product: the rounding happens); the recorded-tape check accepts such a tape and rejects a fault
// in the bfloat16 op's float path; the audit's per-leaf prediction lands within a factor of 3 of
// the measured bfloat16 error on the attention graph; and accumulation in bfloat16 (a fault
// control) is ranked first by the audit and shows as a measured error far above its prediction.
// The same for fused attention under the policy (fused_attention_bf16, bfloat16 tile products):
// recorded by the policy and named in its errors, within bfloat16's error of the exact attention
// and far from float32's, accepted by the recorded check with a fault of its float path rejected,
// and predicted by the audit within a factor of 3.
#define BOOST_TEST_MODULE mixed_precision
#include "op_rules.hpp"

#include "check/audit.hpp"
#include "check/recorded.hpp"
#include "models/attention.hpp"
#include "ops/fused_attention_bf16.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace tapegrad;

namespace {

Tensor<float> uniform_tensor(const Shape& shape, std::mt19937_64& rng, double low, double high) {
    std::uniform_real_distribution<double> uniform(low, high);
    Tensor<float> t(shape);
    for (float& x : t.data()) x = static_cast<float>(uniform(rng));
    return t;
}

double bf16(float x) { return float_from_bfloat16(bfloat16_from_float(x)); }

// ---- fault controls: test-only variants of matmul_bf16, wrong in their float path only ----

// dA = G·B instead of G·Bᵀ (B square): the transpose forgotten in the bfloat16 path alone, so the
// checks at double and 50 digits (matmul's path) pass and only the float gradient is wrong.
struct MatMulBf16UntransposedB : MatMulBf16 {
    static constexpr std::string_view name = "matmul_bf16 with dA = G·B";
    using hooks_of = MatMulBf16UntransposedB;
    template <Scalar T>
    static void vjp_all(const Settings& s, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        MatMulBf16::vjp_all<T>(s, at, grads);
        if constexpr (std::is_same_v<T, float>) {
            if (grads[0] == nullptr) return;
            const MatMul::Dims d = MatMul::dims(*at.in[0], *at.in[1]);
            std::vector<std::uint16_t> G(at.G.size()), B(at.in[1]->size());
            round_to_bfloat16(at.G.data(), G);
            round_to_bfloat16(at.in[1]->data(), B);
            kernels::gemm_bf16(kernels::Form::ab, d.m, d.k, d.n, G.data(), B.data(), grads[0]->data().data(), false);
        }
    }
};

// The running sum rounded to bfloat16 after every product (bfloat16 accumulation, the stall the
// policy's float32 accumulation avoids), forward and VJP; the exact product at other types.
struct MatMulBf16AccumulatingInBf16 : MatMulBf16 {
    static constexpr std::string_view name = "matmul_bf16 accumulating in bfloat16";
    using hooks_of = MatMulBf16AccumulatingInBf16;
    // C (m×n) = op(A)·op(B) with every partial sum rounded to bfloat16; rows/columns by index maps.
    template <class IndexA, class IndexB>
    static void product(std::size_t m, std::size_t n, std::size_t k, IndexA a, IndexB b, float* C) {
        for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) {
                float sum = 0;
                for (std::size_t p = 0; p < k; ++p)
                    sum = static_cast<float>(bf16(sum + static_cast<float>(bf16(a(i, p)) * bf16(b(p, j)))));
                C[i * n + j] = sum;
            }
    }
    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& C, Tensor<T>& saved) {
        if constexpr (!std::is_same_v<T, float>) {
            MatMul::forward<T>(s, in, C, saved);
        } else {
            const Tensor<float>& A = *in[0];
            const Tensor<float>& B = *in[1];
            const MatMul::Dims d = MatMul::dims(A, B);
            BOOST_TEST_REQUIRE(d.batch == 1u);
            C.resize(A.shape().with_matrix(A.rows(), B.cols()));
            product(
                d.m, d.n, d.k, [&](std::size_t i, std::size_t p) { return A[i * d.k + p]; },
                [&](std::size_t p, std::size_t j) { return B[p * d.n + j]; }, C.data().data());
        }
    }
    template <Scalar T>
    static void vjp_all(const Settings& s, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        if constexpr (!std::is_same_v<T, float>) {
            MatMul::vjp_all<T>(s, at, grads);
        } else {
            const Tensor<float>& A = *at.in[0];
            const Tensor<float>& B = *at.in[1];
            const Tensor<float>& G = at.G;
            const MatMul::Dims d = MatMul::dims(A, B);
            if (grads[0] != nullptr) {  // dA = G·Bᵀ
                product(
                    d.m, d.k, d.n, [&](std::size_t i, std::size_t j) { return G[i * d.n + j]; },
                    [&](std::size_t j, std::size_t p) { return B[p * d.n + j]; }, grads[0]->data().data());
            }
            if (grads[1] != nullptr) {  // dB = Aᵀ·G
                product(
                    d.k, d.n, d.m, [&](std::size_t p, std::size_t i) { return A[i * d.k + p]; },
                    [&](std::size_t i, std::size_t j) { return G[i * d.n + j]; }, grads[1]->data().data());
            }
        }
    }
};

// fused_attention_bf16 whose float path recomputes S without its scale c = 1/√d in the VJP, so P,
// and every gradient from it, is wrong there; fused_attention's exact path at the other types.
struct FusedAttentionBf16UnscaledInVjp : FusedAttentionBf16 {
    static constexpr std::string_view name = "fused_attention_bf16 with S unscaled in its VJP";
    using hooks_of = FusedAttentionBf16UnscaledInVjp;
    template <Scalar T>
    static void vjp_all(const Settings& s, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
        if constexpr (std::is_same_v<T, float>) {
            fused_detail::Dims<T> dims(s, at.in, name, ProductPrecision::bfloat16);
            dims.c = 1;
            fused_detail::backward(dims, at, grads);
        } else {
            FusedAttentionBf16::vjp_all<T>(s, at, grads);
        }
    }
};

const bool faults_registered = register_siblings<MatMulBf16UntransposedB>() &&
                               register_siblings<MatMulBf16AccumulatingInBf16>() &&
                               register_siblings<FusedAttentionBf16UnscaledInVjp>();

// The product of bfloat16-rounded operands in double, and gemm_bf16's error bound for it
// (autodiff/kernels.hpp): γ_s·Σ|a·b| + (s + 1)·2⁻¹²⁶, s = 2⌈k/2⌉.
struct Reference {
    double value = 0, bound = 0, unrounded = 0;
};
template <class IndexA, class IndexB>
Reference reference(std::size_t k, IndexA a, IndexB b) {
    Reference r;
    double magnitude = 0;
    for (std::size_t p = 0; p < k; ++p) {
        r.value += bf16(a(p)) * bf16(b(p));
        r.unrounded += static_cast<double>(a(p)) * static_cast<double>(b(p));
        magnitude += std::fabs(bf16(a(p)) * bf16(b(p)));
    }
    const double s = static_cast<double>(2 * ((k + 1) / 2)), gamma = s * 0x1p-24 / (1 - s * 0x1p-24);
    r.bound = gamma * magnitude + (s + 1) * 0x1p-126;
    return r;
}

// The attention graph of the audit's tests: layer norm → causal attention → W_O → GELU →
// residual → logsumexp, every product a matmul (bfloat16 under the policy).
struct AttentionGraph {
    std::vector<Var<float>> leaves;
    Var<float> J;
};
// `fused`: the attention is fused_attention on the three projections (fused_attention_bf16 under
// the policy) instead of the composed causal_attention.
AttentionGraph attention_graph(Tape<float>& tape, std::size_t T, std::size_t D, std::uint64_t seed,
                               bool fused = false) {
    std::mt19937_64 rng(seed);
    AttentionGraph g;
    g.leaves.push_back(tape.leaf(uniform_tensor(Shape{T, D}, rng, -2, 2), "X"));
    g.leaves.push_back(tape.leaf(uniform_tensor(Shape{D}, rng, 0.5, 1.5), "gain"));
    g.leaves.push_back(tape.leaf(uniform_tensor(Shape{D}, rng, -0.5, 0.5), "bias"));
    for (const char* name : {"W_Q", "W_K", "W_V", "W_O"}) {
        g.leaves.push_back(tape.leaf(uniform_tensor(Shape{D, D}, rng, -0.5, 0.5), name));
    }
    const std::vector<Var<float>>& in = g.leaves;
    const Var<float> H = layer_norm(in[0], in[1], in[2], LayerNormSettings{.epsilon = static_cast<double>(1e-5f)});
    const Var<float> O = fused ? fused_attention(matmul(H, in[3]), matmul(H, in[4]), matmul(H, in[5]), true, 0)
                               : causal_attention(H, in[3], in[4], in[5]).O;
    g.J = sum(logsumexp(add(in[0], gelu(matmul(O, in[6]))), 1));
    return g;
}

std::size_t count_op(const Tape<float>& tape, std::string_view op) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < tape.size(); ++i) n += tape.info(i).op == op ? 1 : 0;
    return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_float_rounds_to_bfloat16_as_the_reference_rounds_its_double_at_every_boundary) {
    std::vector<std::uint32_t> patterns = {
        0x00000000, 0x00000001, 0x00007fff, 0x00008000, 0x00008001, 0x00018000, 0x00028000,  // subnormal ties
        0x007fffff, 0x00800000, 0x00807fff, 0x00808000, 0x00818000,                          // to the smallest normal
        0x3f800000, 0x3f807fff, 0x3f808000, 0x3f808001, 0x3f818000, 0x3fffffff,              // ties to even, carries
        0x7f7f7fff, 0x7f7f8000, 0x7f7effff, 0x7f7fffff,                                      // to the largest, to inf
        0x7f800000, 0x7f800001, 0x7f810000, 0x7fc00000, 0x7fffffff, 0x7fa12345,              // inf, NaNs
    };
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {  // every binade: below, at, above each tie
        for (const std::uint32_t kept : {0x00u, 0x01u, 0x7fu})
            for (const std::uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
                patterns.push_back(exponent << 23 | kept << 16 | low);
            }
    }
    std::mt19937_64 rng(2026);
    for (int r = 0; r < 1'000'000; ++r) patterns.push_back(static_cast<std::uint32_t>(rng()));
    std::size_t disagreements = 0;
    for (const std::uint32_t magnitude : patterns) {
        for (const std::uint32_t sign : {0u, 0x80000000u}) {
            const float x = std::bit_cast<float>(magnitude | sign);
            const std::uint16_t fast = bfloat16_from_float(x), reference = bfloat16_bits(static_cast<double>(x));
            if (fast != reference && disagreements++ < 5) {
                BOOST_ERROR(fmt::format("{:#010x}: bfloat16_from_float {:#06x}, bfloat16_bits {:#06x}",
                                        magnitude | sign, fast, reference));
            }
        }
    }
    BOOST_TEST(disagreements == 0u);
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {  // every pattern reads back as the reference reads it
        const double exact = bfloat16_value(static_cast<std::uint16_t>(bits));
        const float read = float_from_bfloat16(static_cast<std::uint16_t>(bits));
        BOOST_TEST_REQUIRE((std::isnan(exact) ? std::isnan(read) : static_cast<double>(read) == exact), bits);
    }
    const std::vector<float> from{1.0f + 0x1p-8f, -0.0f, 3e38f, 1e-40f};
    std::vector<std::uint16_t> to(from.size());
    round_to_bfloat16(from, to);
    for (std::size_t k = 0; k < from.size(); ++k) BOOST_TEST(to[k] == bfloat16_bits(static_cast<double>(from[k])));
}

// The compiled rounding (kernels::round_to_bf16, per CPU level: CTest runs this file under each
// TAPEGRAD_CPU) gives bfloat16_from_float's bits at every length 0..80 (each vector remainder) and
// offset, on values that cross every boundary class (ties, carries, subnormals, inf, NaN).
BOOST_AUTO_TEST_CASE(the_compiled_rounding_is_the_reference_at_every_length_and_level) {
    std::mt19937_64 rng(9);
    std::vector<float> values;
    for (const std::uint32_t bits : {0x00008000u, 0x00018000u, 0x007fffffu, 0x3f808000u, 0x3f818000u, 0x7f7f8000u,
                                     0x7f7fffffu, 0x7f800000u, 0x7fa12345u, 0xffc00001u, 0x80000001u}) {
        values.push_back(std::bit_cast<float>(bits));
    }
    while (values.size() < 200) values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
    for (std::size_t offset = 0; offset < 3; ++offset)
        for (std::size_t n = 0; n <= 80; ++n) {
            std::vector<std::uint16_t> out(n + 1, 0xabcd);
            kernels::round_to_bf16(values.data() + offset, n, out.data());
            for (std::size_t k = 0; k < n; ++k) {
                BOOST_TEST_REQUIRE(out[k] == bfloat16_from_float(values[offset + k]), "n " << n << " k " << k);
            }
            BOOST_TEST_REQUIRE(out[n] == 0xabcd);  // nothing written past n
        }
}

BOOST_AUTO_TEST_CASE(a_bfloat16_tape_records_matmul_bf16_and_only_a_float_tape_takes_the_policy) {
    std::mt19937_64 rng(1);
    Tape<float> tape;
    BOOST_TEST((tape.product_precision() == ProductPrecision::tape));
    tape.set_product_precision(ProductPrecision::bfloat16);
    const Var<float> A = tape.leaf(uniform_tensor(Shape{3, 4}, rng, -1, 1), "A");
    const Var<float> B = tape.leaf(uniform_tensor(Shape{4, 2}, rng, -1, 1), "B");
    BOOST_TEST(tape.info(matmul(A, B).index()).op == "matmul_bf16");
    tape.clear();  // the policy outlives the graph
    const Var<float> A2 = tape.leaf(uniform_tensor(Shape{3, 4}, rng, -1, 1), "A");
    BOOST_TEST(tape.info(matmul(A2, tape.leaf(uniform_tensor(Shape{4, 2}, rng, -1, 1))).index()).op == "matmul_bf16");
    const std::string inner = testing::message_of<shape_error>([&] { (void)matmul(A2, A2); });
    BOOST_TEST(inner.find("matmul_bf16: inner dimensions differ: A is [3x4], B is [3x4]") != std::string::npos, inner);
    tape.set_product_precision(ProductPrecision::tape);
    BOOST_TEST(tape.info(matmul(A2, tape.leaf(uniform_tensor(Shape{4, 2}, rng, -1, 1))).index()).op == "matmul");

    Tape<double> precise;
    const std::string refused =
        testing::message_of<usage_error>([&] { precise.set_product_precision(ProductPrecision::bfloat16); });
    BOOST_TEST(refused.find("bfloat16 products are a float32 tape's policy") != std::string::npos, refused);
    BOOST_TEST((precise.product_precision() == ProductPrecision::tape));
}

BOOST_AUTO_TEST_CASE(forward_and_vjp_are_the_float32_sum_of_bfloat16_products) {
    std::mt19937_64 rng(7);
    for (const bool shared : {true, false}) {  // B [k, n] shared by the batch, or one per matrix
        Tape<float> tape;
        tape.set_product_precision(ProductPrecision::bfloat16);
        const std::size_t batch = 2, m = 5, k = 7, n = 3;  // k odd: the last pair's second half is zero
        const Var<float> A = tape.leaf(uniform_tensor(Shape{batch, m, k}, rng, -1, 1), "A");
        const Var<float> B = tape.leaf(uniform_tensor(shared ? Shape{k, n} : Shape{batch, k, n}, rng, -1, 1), "B");
        const Tensor<float> P = uniform_tensor(Shape{batch, m, n}, rng, -1, 1);  // G = P
        const Var<float> C = matmul(A, B);
        tape.backward(sum(mul(C, tape.constant(P))));
        const Tensor<float>&a = A.value(), &b = B.value(), &c = C.value();
        const auto b_at = [&](std::size_t s, std::size_t p, std::size_t j) {
            return b[(shared ? 0 : s * k * n) + p * n + j];
        };
        std::size_t moved = 0;
        for (std::size_t s = 0; s < batch; ++s)
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                    const Reference r = reference(
                        k, [&](std::size_t p) { return a[(s * m + i) * k + p]; },
                        [&](std::size_t p) { return b_at(s, p, j); });
                    BOOST_TEST(std::fabs(c[(s * m + i) * n + j] - r.value) <= r.bound);
                    moved += std::fabs(c[(s * m + i) * n + j] - r.unrounded) > r.bound ? 1 : 0;
                }
        BOOST_TEST(moved > batch * m * n / 2);   // the operands were rounded: most sums moved past the bound
        for (std::size_t s = 0; s < batch; ++s)  // dA = G·Bᵀ
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t p = 0; p < k; ++p) {
                    const Reference r = reference(
                        n, [&](std::size_t j) { return P[(s * m + i) * n + j]; },
                        [&](std::size_t j) { return b_at(s, p, j); });
                    BOOST_TEST(std::fabs(A.grad()[(s * m + i) * k + p] - r.value) <= r.bound);
                }
        const std::size_t rows = shared ? batch * m : m;        // a shared B sums over the batch's rows
        for (std::size_t s = 0; s < (shared ? 1 : batch); ++s)  // dB = Aᵀ·G
            for (std::size_t p = 0; p < k; ++p)
                for (std::size_t j = 0; j < n; ++j) {
                    const Reference r = reference(
                        rows, [&](std::size_t i) { return a[(s * m + i) * k + p]; },
                        [&](std::size_t i) { return P[(s * m + i) * n + j]; });
                    BOOST_TEST(std::fabs(B.grad()[(shared ? 0 : s * k * n) + p * n + j] - r.value) <= r.bound);
                }
    }
}

// The VJP rounds G once when both products read it (ops/matmul_bf16.hpp): each gradient is,
// bit for bit, kernels::gemm_bf16 of the floats, which rounds its operands itself. With both
// inputs wanting a gradient (G rounded once) and with one (the floats passed on), B shared or one
// per matrix, k odd and even, sizes past a tile (8 rows, 48 columns) in every direction; and at
// every CPU level by this test's reruns (the widened product there, vdpbf16ps here).
BOOST_AUTO_TEST_CASE(the_vjp_gives_the_bits_of_each_product_rounding_its_own_operands) {
    std::mt19937_64 rng(11);
    const auto same_bits = [](const Tensor<float>& got, const std::vector<float>& want) {
        if (got.size() != want.size()) return false;
        for (std::size_t x = 0; x < want.size(); ++x)
            if (std::bit_cast<std::uint32_t>(got[x]) != std::bit_cast<std::uint32_t>(want[x])) return false;
        return true;
    };
    const std::size_t batch = 2;
    for (const bool shared : {true, false})
        for (const auto& [m, k, n] : {std::array<std::size_t, 3>{5, 7, 3}, {37, 20, 50}, {19, 64, 97}})
            for (const bool want_dA : {true, false})
                for (const bool want_dB : {true, false}) {
                    if (!want_dA && !want_dB) continue;
                    Tape<float> tape;
                    tape.set_product_precision(ProductPrecision::bfloat16);
                    const Tensor<float> a = uniform_tensor(Shape{batch, m, k}, rng, -1, 1);
                    const Tensor<float> b = uniform_tensor(shared ? Shape{k, n} : Shape{batch, k, n}, rng, -1, 1);
                    const Tensor<float> G = uniform_tensor(Shape{batch, m, n}, rng, -1, 1);
                    const Var<float> A = tape.leaf(a, "A", want_dA);
                    const Var<float> B = tape.leaf(b, "B", want_dB);
                    tape.backward(matmul(A, B), G);
                    // A shared B sees the batch as one matrix of batch·m rows.
                    const std::size_t matrices = shared ? 1 : batch, rows = shared ? batch * m : m;
                    std::vector<float> dA(a.size()), dB(b.size());
                    for (std::size_t s = 0; s < matrices; ++s) {
                        const float* const G_s = G.data().data() + s * rows * n;
                        const float* const a_s = a.data().data() + s * rows * k;
                        const float* const b_s = b.data().data() + s * k * n;
                        kernels::gemm_bf16(kernels::Form::abT, rows, k, n, G_s, b_s, dA.data() + s * rows * k, false);
                        kernels::gemm_bf16(kernels::Form::aTb, k, n, rows, a_s, G_s, dB.data() + s * k * n, false);
                    }
                    const std::string where =
                        fmt::format("m {} k {} n {} shared {} dA {} dB {}", m, k, n, shared, want_dA, want_dB);
                    if (want_dA) BOOST_TEST(same_bits(A.grad(), dA), where);
                    if (want_dB) BOOST_TEST(same_bits(B.grad(), dB), where);
                }
}

BOOST_AUTO_TEST_CASE(the_recorded_check_accepts_a_bfloat16_tape_and_rejects_a_fault_of_its_float_path) {
    Tape<float> tape;
    tape.set_product_precision(ProductPrecision::bfloat16);
    const AttentionGraph graph = attention_graph(tape, 8, 8, 41);
    BOOST_TEST(count_op(tape, "matmul_bf16") == 6u);  // Q, K, V, S = QKᵀ, A·V, O·W_O
    tape.backward(graph.J);
    const CheckReport report = check_gradients(tape, graph.J);
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST_REQUIRE(report.float_gradients.size() == 7u);
    for (const FloatGradientCheck& f : report.float_gradients) {
        // The spread sees bfloat16 (u = 2⁻⁸): were the bfloat16 rounding not drawn, a float32
        // spread of ~1e-7 would put the bound below the bfloat16 error, and the check would fail.
        BOOST_TEST(f.estimate > 0x1p-16, f.leaf);
        BOOST_TEST(f.error > 0x1p-20, f.leaf);  // the gradient really is a bfloat16 one
    }

    std::mt19937_64 rng(3);
    Tape<float> faulty;
    faulty.set_product_precision(ProductPrecision::bfloat16);
    const Var<float> X = faulty.leaf(uniform_tensor(Shape{6, 8}, rng, -1, 1), "X");
    const Var<float> W = faulty.leaf(uniform_tensor(Shape{8, 8}, rng, -1, 1), "W");
    const Var<float> J = sum(mul(tanh(faulty.record<MatMulBf16UntransposedB>({X, W})),
                                 faulty.constant(uniform_tensor(Shape{6, 8}, rng, 0.5, 1.5))));
    faulty.backward(J);
    const CheckReport rejected = check_gradients(faulty, J);
    BOOST_TEST(!rejected.passed);
    BOOST_TEST(rejected.failures == 0u);  // the function's derivatives (double, 50 digits) are right
    BOOST_TEST_REQUIRE(rejected.float_gradients.size() == 2u);
    BOOST_TEST(!rejected.float_gradients[0].passed, rejected.float_gradients[0].leaf);  // X's, through dA
    BOOST_TEST(rejected.float_gradients[1].passed, rejected.float_gradients[1].leaf);   // W's is right
}

BOOST_AUTO_TEST_CASE(the_audit_predicts_each_leafs_bfloat16_error_within_a_factor_of_3) {
    for (const std::size_t T : {16u, 64u}) {
        Tape<float> tape, single;
        tape.set_product_precision(ProductPrecision::bfloat16);
        const AttentionGraph graph = attention_graph(tape, T, 16, 100 + T);
        const AttentionGraph reference = attention_graph(single, T, 16, 100 + T);
        const PrecisionAudit audit = audit_precision(tape, graph.J);
        const PrecisionAudit float32 = audit_precision(single, reference.J);
        BOOST_TEST_REQUIRE(audit.leaves.size() == 7u);
        for (std::size_t l = 0; l < audit.leaves.size(); ++l) {
            const LeafAudit& leaf = audit.leaves[l];
            BOOST_TEST_REQUIRE(leaf.predicted.has_value());
            const double measured = leaf.gradient.normwise, predicted = *leaf.predicted;
            BOOST_TEST_MESSAGE(fmt::format(
                "T = {:2} {:<5} measured {:.2e}, predicted {:.2e} (ratio {:.2f}); "
                "float32 {:.2e}",
                T, leaf.name, measured, predicted, predicted / measured, float32.leaves[l].gradient.normwise));
            BOOST_TEST(predicted >= measured / 3, leaf.name);
            BOOST_TEST(predicted <= measured * 3, leaf.name);
            // The run was bfloat16: its error stands 30 times above float32's on the same graph.
            BOOST_TEST(measured > 30 * float32.leaves[l].gradient.normwise, leaf.name);
        }
        BOOST_TEST(audit.worst().op == "matmul_bf16");  // the node losing the most digits is a product
    }
}

BOOST_AUTO_TEST_CASE(accumulating_in_bfloat16_is_ranked_first_and_measured_far_above_its_prediction) {
    // Positive operands: the product H·W2 sums 256 terms near 0.025 to about 6, where bfloat16's
    // half spacing (1/64) is most of a term, the regime where a bfloat16 running sum stalls; its
    // VJP's dW2 = Hᵀ·G sums 128. J = Σ Y∘Y∘C (C > 0), so the forward's error reaches G.
    const auto graph = [](Tape<float>& tape, bool faulty) {
        std::mt19937_64 rng(5);
        tape.set_product_precision(ProductPrecision::bfloat16);
        const Var<float> X = tape.leaf(uniform_tensor(Shape{128, 16}, rng, 0, 1), "X");
        const Var<float> W1 = tape.leaf(uniform_tensor(Shape{16, 256}, rng, -0.2, 0.2), "W1");
        const Var<float> W2 = tape.leaf(uniform_tensor(Shape{256, 16}, rng, 0, 0.1), "W2");
        const Var<float> H = sigmoid(matmul(X, W1));
        const Var<float> Y = faulty ? tape.record<MatMulBf16AccumulatingInBf16>({H, W2}) : matmul(H, W2);
        return sum(mul(mul(Y, Y), tape.constant(uniform_tensor(Shape{128, 16}, rng, 0.5, 1.5))));
    };
    Tape<float> correct_tape, faulty_tape;
    const PrecisionAudit correct = audit_precision(correct_tape, graph(correct_tape, false));
    const PrecisionAudit faulty = audit_precision(faulty_tape, graph(faulty_tape, true));
    BOOST_TEST(faulty.worst().op == MatMulBf16AccumulatingInBf16::name);
    // By a digit: its own error is at least 10 times the correct product's in the same place.
    const auto same_place = std::find_if(correct.nodes.begin(), correct.nodes.end(),
                                         [&](const NodeAudit& n) { return n.node == faulty.worst().node; });
    BOOST_TEST_REQUIRE((same_place != correct.nodes.end() && same_place->op == "matmul_bf16"));
    BOOST_TEST(faulty.worst().local_in_u > 10 * same_place->local_in_u);
    for (std::size_t l = 0; l < correct.leaves.size(); ++l) {
        const double right = correct.leaves[l].gradient.normwise / *correct.leaves[l].predicted;
        const double wrong = faulty.leaves[l].gradient.normwise / *faulty.leaves[l].predicted;
        BOOST_TEST_MESSAGE(fmt::format("{:<3} measured/predicted: correct {:.2f}, bfloat16 accumulation {:.2f}",
                                       correct.leaves[l].name, right, wrong));
        BOOST_TEST(right < 3.0, correct.leaves[l].name);
        BOOST_TEST(wrong > 3.0, faulty.leaves[l].name);  // the prediction models the policy, not the fault
        BOOST_TEST(faulty.leaves[l].top_contributor_op == MatMulBf16AccumulatingInBf16::name);
    }
}

// ---- fused attention under the policy: fused_attention_bf16 ----

BOOST_AUTO_TEST_CASE(a_bfloat16_tape_records_fused_attention_bf16_and_its_errors_name_it) {
    std::mt19937_64 rng(2);
    Tape<float> tape;
    tape.set_product_precision(ProductPrecision::bfloat16);
    const Var<float> X = tape.leaf(uniform_tensor(Shape{2, 6, 4}, rng, -1, 1), "X");
    BOOST_TEST(tape.info(fused_attention(X, X, X, true, 0).index()).op == "fused_attention_bf16");
    BOOST_TEST(tape.info(fused_attention(X, X, X, false, 0, FusedAttentionTiles{2, 3}).index()).op ==
               "fused_attention_bf16");
    BOOST_TEST(tape.info(fused_attention(X, X, X, {.pattern = {.causal = true, .window = 2}}).index()).op ==
               "fused_attention_bf16");
    const Var<float> wide = tape.leaf(uniform_tensor(Shape{2, 6, 5}, rng, -1, 1), "wide");
    const std::string shapes = testing::message_of<shape_error>([&] { (void)fused_attention(X, wide, X, true, 0); });
    BOOST_TEST(shapes.starts_with("fused_attention_bf16: "), shapes);
    const std::string tiles = testing::message_of<value_error>([&] {
        (void)fused_attention(X, X, X, true, 0, FusedAttentionTiles{0, 2});
    });
    BOOST_TEST(tiles == "fused_attention_bf16: tile sizes must be positive, got 0×2", tiles);
    const std::string large = testing::message_of<value_error>([&] {
        const Var<float> huge = tape.leaf(Tensor<float>(Shape{2, 6, 4}, 1e30f), "huge");
        (void)fused_attention(huge, huge, X, true, 0);
    });
    BOOST_TEST(large.starts_with("fused_attention_bf16: score S = Q·Kᵀ/√d is inf at query 0, key 0"), large);
    tape.set_product_precision(ProductPrecision::tape);
    BOOST_TEST(tape.info(fused_attention(X, X, X, true, 0).index()).op == "fused_attention");
    // By name on a double tape: recorded as itself, computed exactly (fused_attention's values).
    Tape<double> precise;
    const Var<double> Y = precise.leaf(tensor_cast<double>(uniform_tensor(Shape{6, 4}, rng, -1, 1)), "Y");
    const Var<double> exact = fused_attention(Y, Y, Y, true, 0);
    const Var<double> named = fused_attention_bf16(Y, Y, Y, {.pattern = {.causal = true}});
    BOOST_TEST(precise.info(named.index()).op == "fused_attention_bf16");
    BOOST_TEST(named.value().data() == exact.value().data(), boost::test_tools::per_element());
}

namespace {

// O and the three gradients of J = Σ O ∘ C for fused attention with `settings` on a tape of T
// (float: under `products`), from the same inputs; each flattened to double.
template <Scalar T>
std::array<std::vector<double>, 4> attention_results(const std::array<Tensor<float>, 4>& in,
                                                     const FusedAttention::Settings& settings,
                                                     ProductPrecision products) {
    Tape<T> tape;
    if constexpr (std::is_same_v<T, float>) tape.set_product_precision(products);
    const Var<T> Q = tape.leaf(tensor_cast<T>(in[0]), "Q"), K = tape.leaf(tensor_cast<T>(in[1]), "K");
    const Var<T> V = tape.leaf(tensor_cast<T>(in[2]), "V");
    const Var<T> O = fused_attention(Q, K, V, settings);
    tape.backward(sum(mul(O, tape.constant(tensor_cast<T>(in[3])))));
    const auto flat = [](const Tensor<T>& t) {
        std::vector<double> v;
        for (const T& x : t.data()) v.push_back(static_cast<double>(x));
        return v;
    };
    return {flat(O.value()), flat(Q.grad()), flat(K.grad()), flat(V.grad())};
}

double normwise(const std::vector<double>& got, const std::vector<double>& truth) {
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
        diff += (got[k] - truth[k]) * (got[k] - truth[k]);
        norm += truth[k] * truth[k];
    }
    return std::sqrt(diff / norm);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fused_attention_bf16_is_within_bfloat16s_error_of_the_exact_attention_and_far_from_float32s) {
    // Two heads, 5 queries after 2 cached keys over 7 keys, d = 8, r = 6; tiles that cross the
    // online softmax's tile boundaries; with a window and ALiBi; and one tile holding everything.
    const FusedAttention::Settings settings[] = {
        {.pattern = {.causal = false}, .tiles = {64, 64}},
        {.pattern = {.causal = true, .query_offset = 2}, .tiles = {3, 2}},
        {.pattern = {.causal = true, .query_offset = 2, .window = 3, .alibi_heads = 2}, .tiles = {2, 3}},
    };
    std::mt19937_64 rng(17);
    for (const FusedAttention::Settings& s : settings) {
        const std::array<Tensor<float>, 4> in{
            uniform_tensor(Shape{2, 5, 8}, rng, -1, 1), uniform_tensor(Shape{2, 7, 8}, rng, -1, 1),
            uniform_tensor(Shape{2, 7, 6}, rng, -1.5, 0.5), uniform_tensor(Shape{2, 5, 6}, rng, -1, 2)};
        const auto exact = attention_results<double>(in, s, ProductPrecision::tape);
        const auto bf16 = attention_results<float>(in, s, ProductPrecision::bfloat16);
        const auto f32 = attention_results<float>(in, s, ProductPrecision::tape);
        for (std::size_t k = 0; k < 4; ++k) {
            const double e_bf16 = normwise(bf16[k], exact[k]), e_f32 = normwise(f32[k], exact[k]);
            BOOST_TEST_MESSAGE(fmt::format("tiles {}x{} result {}: bfloat16 {:.2e}, float32 {:.2e}", s.tiles.query,
                                           s.tiles.key, k, e_bf16, e_f32));
            // Each result is at most three tile products deep (dQ: S, then dP, then dS·K), each
            // reading operands rounded by at most 2⁻⁹ relatively; with entries within [-2, 2] and
            // d = 8, an S off by c·d·2·2⁻⁹·4 ≈ 0.04 moves P by about 4%, so 2⁻⁴ normwise bounds a
            // correct bfloat16 run with room; a product left in float32 everywhere stays near
            // float32's 2⁻²⁴, and one fed unrounded operands only in part lands between.
            BOOST_TEST(e_bf16 <= 0x1p-4);
            BOOST_TEST(e_bf16 > 0x1p-12);      // the operands were rounded: bfloat16's error, not float32's
            BOOST_TEST(e_bf16 > 256 * e_f32);  // and float32's own run is far more precise
        }
    }
}

BOOST_AUTO_TEST_CASE(the_recorded_check_accepts_a_fused_bfloat16_tape_and_rejects_a_fault_of_its_float_path) {
    Tape<float> tape;
    tape.set_product_precision(ProductPrecision::bfloat16);
    const AttentionGraph graph = attention_graph(tape, 8, 8, 43, true);
    BOOST_TEST(count_op(tape, "fused_attention_bf16") == 1u);
    BOOST_TEST(count_op(tape, "matmul_bf16") == 4u);  // Q, K, V, O·W_O
    tape.backward(graph.J);
    const CheckReport report = check_gradients(tape, graph.J);
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST_REQUIRE(report.float_gradients.size() == 7u);
    for (const FloatGradientCheck& f : report.float_gradients) BOOST_TEST(f.error > 0x1p-20, f.leaf);

    std::mt19937_64 rng(9);
    Tape<float> faulty;
    faulty.set_product_precision(ProductPrecision::bfloat16);
    const Var<float> Q = faulty.leaf(uniform_tensor(Shape{2, 6, 4}, rng, -1, 1), "Q");
    const Var<float> K = faulty.leaf(uniform_tensor(Shape{2, 6, 4}, rng, -1, 1), "K");
    const Var<float> V = faulty.leaf(uniform_tensor(Shape{2, 6, 3}, rng, -1, 1), "V");
    const Var<float> O = faulty.record<FusedAttentionBf16UnscaledInVjp>({Q, K, V}, FusedAttention::Settings{});
    const Var<float> J = sum(mul(tanh(O), faulty.constant(uniform_tensor(Shape{2, 6, 3}, rng, 0.5, 1.5))));
    faulty.backward(J);
    const CheckReport rejected = check_gradients(faulty, J);
    BOOST_TEST(!rejected.passed);
    BOOST_TEST(rejected.failures == 0u);  // the function's derivatives (double, 50 digits) are right
    BOOST_TEST_REQUIRE(rejected.float_gradients.size() == 3u);
    for (const FloatGradientCheck& f : rejected.float_gradients) BOOST_TEST(!f.passed, f.leaf);
}

BOOST_AUTO_TEST_CASE(the_audit_predicts_each_leafs_error_through_fused_bfloat16_attention_within_a_factor_of_3) {
    for (const std::size_t T : {16u, 64u}) {
        Tape<float> tape;
        tape.set_product_precision(ProductPrecision::bfloat16);
        const AttentionGraph graph = attention_graph(tape, T, 16, 200 + T, true);
        const PrecisionAudit audit = audit_precision(tape, graph.J);
        BOOST_TEST_REQUIRE(audit.leaves.size() == 7u);
        for (const LeafAudit& leaf : audit.leaves) {
            BOOST_TEST_REQUIRE(leaf.predicted.has_value());
            const double measured = leaf.gradient.normwise, predicted = *leaf.predicted;
            BOOST_TEST_MESSAGE(fmt::format("fused, T = {:2} {:<5} measured {:.2e}, predicted {:.2e} (ratio {:.2f})", T,
                                           leaf.name, measured, predicted, predicted / measured));
            BOOST_TEST(predicted >= measured / 3, leaf.name);
            BOOST_TEST(predicted <= measured * 3, leaf.name);
        }
        const std::string worst = audit.worst().op;
        BOOST_TEST((worst == "matmul_bf16" || worst == "fused_attention_bf16"), worst);
    }
}
