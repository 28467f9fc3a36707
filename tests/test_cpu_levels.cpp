// The compiled kernels at every instruction-set level this machine supports (autodiff/cpu.hpp):
// the level API (report, force, refuse), and the results of every level held to a higher-precision
// reference within a bound derived before the run: the three product forms in double and float,
// the softmax rows, GELU, silu, rms_norm, the NaN scan, and attention (composed and fused, values and gradients) against 50 digits.
// CTest also runs the kernel tests under TAPEGRAD_CPU=<level> (tests/CMakeLists.txt), and
// tests/check_cpu_levels.cmake checks on the binaries that the levels are separate code.
#define BOOST_TEST_MODULE cpu_levels
#include "support.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::random_tensor;

namespace {

// C = op(A)·op(B) at the active level, for row-major buffers of the Form's shapes.
template <class T>
std::vector<T> product(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const std::vector<T>& A,
                       const std::vector<T>& B) {
    std::vector<T> C(m * n);
    kernels::gemm(form, m, n, k, A.data(), B.data(), C.data(), false);
    return C;
}

// Worst ratio |C − C_ref| / (γ_k (|A|·|B|)) over the entries, with γ_k = k·u / (1 − k·u) (u the
// unit roundoff of T): the classical bound on a k-term dot product in T, whatever the order of
// summation or the use of FMA. A correct kernel at any level gives ≤ 1; the reference is the
// generic loop in long double, whose own error (k·2^-64 relative) is far below the bound.
template <class T>
double bound_ratio(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const std::vector<T>& A,
                   const std::vector<T>& B, const std::vector<T>& C) {
    const std::vector<long double> A_long(A.begin(), A.end()), B_long(B.begin(), B.end());
    std::vector<long double> A_abs(A_long), B_abs(B_long);
    for (long double& x : A_abs) x = std::abs(x);
    for (long double& x : B_abs) x = std::abs(x);
    const std::vector<long double> reference = product(form, m, n, k, A_long, B_long);
    const std::vector<long double> magnitude = product(form, m, n, k, A_abs, B_abs);
    const long double u = std::numeric_limits<T>::epsilon() / 2, gamma = k * u / (1 - k * u);
    double worst = 0;
    for (std::size_t x = 0; x < m * n; ++x)
        worst = std::max(worst, double(std::abs(C[x] - reference[x]) / (gamma * magnitude[x])));
    return worst;
}

template <class T>
void check_products_at_every_level() {
    const testing::RestoreCpuLevel restore;
    constexpr std::size_t m = 37, n = 29, k = 70;  // not multiples of any vector width
    std::mt19937_64 rng(10);
    const Tensor<double> A_values = random_tensor({m * k}, rng), B_values = random_tensor({k * n}, rng);
    const std::vector<T> A(A_values.data().begin(), A_values.data().end());
    const std::vector<T> B(B_values.data().begin(), B_values.data().end());
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
                BOOST_TEST(bound_ratio(form, m, n, k, A, B, product(form, m, n, k, A, B)) <= 1.0);
            }
        }
    }
}

// Largest |a − b| / max(1, |b|) between a T tensor and its 50-digit reference.
template <class T>
double mixed_error(const Tensor<T>& a, const Tensor<mp50>& reference) {
    double worst = 0;
    for (std::size_t x = 0; x < a.size(); ++x) {
        const double r = to_double(reference[x]);
        worst = std::max(worst, std::abs(double(a[x]) - r) / std::max(1.0, std::abs(r)));
    }
    return worst;
}

// Output and input gradients of attention on a T tape (composed graph, or the fused op).
template <Scalar T>
std::vector<Tensor<T>> attention_results(const std::array<Tensor<double>, 3>& qkv, bool fused) {
    Tape<T> tape;
    const Var<T> Q = tape.leaf(tensor_cast<T>(qkv[0]), "Q"), K = tape.leaf(tensor_cast<T>(qkv[1]), "K"),
                 V = tape.leaf(tensor_cast<T>(qkv[2]), "V");
    const Var<T> O = fused ? fused_attention(Q, K, V, false, 0) : attention_from_qkv(Q, K, V).O;
    tape.backward(testing::probe(O));
    return {O.value(), Q.grad(), K.grad(), V.grad()};
}

// Attention at T = 80 (several fused tiles, rows longer than any vector), d = 16, at every level
// against 50 digits. Thresholds: each value is a chain of at most 6 stages (products with k ≤ 80,
// softmax rows, their VJPs), each stage adding at most k·u relative to values of order 1:
// 6·80·u = 5.3e-14 in double and 2.9e-5 in float; 1e-12 and 1e-4 leave room for Eigen's exp
// (a few ulps) and the gradient's sums. A kernel with any wrong element misses by O(1e-2) or more.
template <Scalar T>
void check_attention_at_every_level(double threshold) {
    const testing::RestoreCpuLevel restore;
    std::mt19937_64 rng(11);
    const std::array<Tensor<double>, 3> qkv{random_tensor({80, 16}, rng), random_tensor({80, 16}, rng),
                                            random_tensor({80, 16}, rng)};
    for (const bool fused : {false, true}) {
        const std::vector<Tensor<mp50>> reference = attention_results<mp50>(qkv, fused);
        for (const CpuLevel level : available_cpu_levels()) {
            set_cpu_level(level);
            const std::vector<Tensor<T>> results = attention_results<T>(qkv, fused);
            for (std::size_t r = 0; r < results.size(); ++r) {
                BOOST_TEST_CONTEXT(cpu_level_name(level) << (fused ? " fused" : " composed") << ", result " << r) {
                    BOOST_TEST(mixed_error(results[r], reference[r]) <= threshold);
                }
            }
        }
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(levels_are_reported_forced_and_refused) {
    const testing::RestoreCpuLevel restore;
    const std::vector<CpuLevel> levels = available_cpu_levels();
    BOOST_TEST_REQUIRE(!levels.empty());
    BOOST_TEST((levels.front() == CpuLevel::baseline));
    BOOST_TEST((std::ranges::find(levels, cpu_level()) != levels.end()));
    BOOST_TEST_MESSAGE("active level: " << cpu_level_name(cpu_level()) << ", available: " << levels.size());
    for (const CpuLevel level : all_cpu_levels) {
        if (cpu_level_available(level)) {
            set_cpu_level(level);
            BOOST_TEST((cpu_level() == level));
        } else {
            BOOST_CHECK_EXCEPTION(set_cpu_level(level), value_error, [&](const value_error& e) {
                return std::string(e.what()).find(cpu_level_name(level)) != std::string::npos;
            });
        }
    }
}

BOOST_AUTO_TEST_CASE(products_are_within_the_rounding_bound_at_every_level) {
    check_products_at_every_level<double>();
    check_products_at_every_level<float>();
}

// Fault control: the bound rejects a product that is wrong by one term (the last multiply-add of
// one entry dropped), so the test above can fail.
BOOST_AUTO_TEST_CASE(the_rounding_bound_rejects_a_product_missing_one_term) {
    constexpr std::size_t m = 5, n = 4, k = 70;
    std::mt19937_64 rng(12);
    const Tensor<double> A_values = random_tensor({m * k}, rng), B_values = random_tensor({k * n}, rng);
    const std::vector<double> A(A_values.data().begin(), A_values.data().end());
    const std::vector<double> B(B_values.data().begin(), B_values.data().end());
    std::vector<double> C = product(kernels::Form::ab, m, n, k, A, B);
    C[0] -= A[k - 1] * B[(k - 1) * n];
    BOOST_TEST(bound_ratio(kernels::Form::ab, m, n, k, A, B, C) > 1.0);
}

// Rows of 37 (past fast::inline_row_size, so the compiled max, row and VJP kernels run), values
// and the VJP dS = A ∘ (G − Σ G·A) for an upstream G, against 50 digits.
BOOST_AUTO_TEST_CASE(softmax_rows_agree_at_every_level) {
    const testing::RestoreCpuLevel restore;
    std::mt19937_64 rng(13);
    Tensor<double> S = random_tensor({3, 37}, rng, 5.0);
    S[5] = S[40] = -std::numeric_limits<double>::infinity();  // hidden positions: exactly 0
    const Tensor<double> G = random_tensor({3, 37}, rng, 2.0);
    Tape<mp50> reference_tape;
    const Var<mp50> S_reference = reference_tape.leaf(tensor_cast<mp50>(S));
    const Var<mp50> A_reference = softmax(S_reference);
    reference_tape.backward(A_reference, tensor_cast<mp50>(G));
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        Tape<double> tape;
        const Var<double> S_var = tape.leaf(S);
        const Var<double> A = softmax(S_var);
        tape.backward(A, G);
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            BOOST_TEST(A.value()[5] == 0.0);
            BOOST_TEST(A.value()[40] == 0.0);
            // n = 37 exps (a few ulps each) and one sum of 37 terms: ≤ 37·u + 4u ≈ 1e-14.
            BOOST_TEST(mixed_error(A.value(), A_reference.value()) <= 1e-14);
            BOOST_TEST(S_var.grad()[5] == 0.0);  // a hidden position passes no gradient
            // dS_j = A_j·(G_j − mean): A's 1e-14 times |G_j − mean| ≤ 2·|G|max (≤ 4: ~4e-14), the
            // mean's 37 products and sums ≤ 38·u·Σ|G_k|A_k (≤ 2: ~2e-14); 1e-13 bounds both.
            BOOST_TEST(mixed_error(S_var.grad(), S_reference.grad()) <= 1e-13);
        }
    }
}

// The compiled max propagates NaN, so a NaN score in a long row is refused by name, as in a short
// one (Softmax::forward called directly: a tape would have refused the NaN before softmax saw it).
BOOST_AUTO_TEST_CASE(softmax_refuses_nan_and_inf_in_long_rows_at_every_level) {
    const testing::RestoreCpuLevel restore;
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
            Tensor<double> S(Shape{2, 40}, 0.5);
            S[70] = bad;
            const std::array<const Tensor<double>*, 1> inputs{&S};
            Tensor<double> A, saved;
            BOOST_TEST_CONTEXT(cpu_level_name(level) << ", score " << bad) {
                BOOST_CHECK_EXCEPTION(Softmax::forward<double>({}, Inputs<double>(inputs), A, saved), value_error,
                                      [&](const value_error& e) {
                                          const std::string message = e.what();
                                          return message.find("softmax: score") != std::string::npos &&
                                                 message.find("(1, 30)") != std::string::npos;
                                      });
            }
        }
    }
}

// exp_shifted takes whole blocks of 64 and the rest in blocks of 16. An element's exponential
// must not depend on which block it fell in (a packet computes each lane alone); otherwise a
// softmax row's bits would change with its length. Exact equality: the claim is the same bits.
template <class T>
void check_exponentials_do_not_depend_on_their_block() {
    std::mt19937_64 rng(19);
    const Tensor<double> draws = random_tensor({64}, rng, 8.0);
    std::vector<T> whole(64), pieces(64);
    for (std::size_t j = 0; j < 64; ++j) whole[j] = pieces[j] = static_cast<T>(draws[j]);
    const T shift = T(1.5);
    op_kernels<T>().exp_shifted(whole.data(), 64, shift);  // one block of 64
    op_kernels<T>().exp_shifted(pieces.data(), 21, shift);  // 16 + 5: two tail blocks
    op_kernels<T>().exp_shifted(pieces.data() + 21, 43, shift);  // 16 + 16 + 11
    for (std::size_t j = 0; j < 64; ++j) BOOST_TEST(pieces[j] == whole[j], "element " << j);
}

BOOST_AUTO_TEST_CASE(exponentials_do_not_depend_on_their_block_at_every_level) {
    const testing::RestoreCpuLevel restore;
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            check_exponentials_do_not_depend_on_their_block<double>();
            check_exponentials_do_not_depend_on_their_block<float>();
        }
    }
}

// GELU's tanh form (compiled as a·σ(2u)) against the generic formula in 50 digits, values and
// VJP, over ordinary inputs and the tails where 1 + tanh u would cancel.
BOOST_AUTO_TEST_CASE(gelu_agrees_with_50_digits_at_every_level) {
    const testing::RestoreCpuLevel restore;
    std::mt19937_64 rng(17);
    Tensor<double> A = random_tensor({3, 37}, rng, 4.0);
    const std::array<double, 7> tails{-40.0, -12.0, -1e-9, 0.0, 1e-9, 12.0, 40.0};
    std::copy(tails.begin(), tails.end(), A.data().begin());
    const Tensor<double> G = random_tensor({3, 37}, rng);
    Tape<mp50> reference_tape;
    const Var<mp50> A_mp = reference_tape.leaf(tensor_cast<mp50>(A));
    const Var<mp50> Y_mp = gelu(A_mp);
    reference_tape.backward(sum(mul(Y_mp, reference_tape.constant(tensor_cast<mp50>(G)))));
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        Tape<double> tape;
        const Var<double> A_d = tape.leaf(A);
        const Var<double> Y = gelu(A_d);
        tape.backward(sum(mul(Y, tape.constant(G))));
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            // One exp (a few ulps) and about ten roundings per element: ≤ 20u ≈ 4.4e-15; 1e-14
            // leaves room for the sum of the backward's probe, nothing for a wrong formula.
            BOOST_TEST(mixed_error(Y.value(), Y_mp.value()) <= 1e-14);
            BOOST_TEST(mixed_error(A_d.grad(), A_mp.grad()) <= 1e-14);
        }
    }
}

// silu (compiled per level, ops/silu.hpp) against its generic formula in 50 digits, values and
// VJP, over ordinary inputs and both tails of σ (e^(−|a|) underflowing at ±800).
BOOST_AUTO_TEST_CASE(silu_agrees_with_50_digits_at_every_level) {
    const testing::RestoreCpuLevel restore;
    std::mt19937_64 rng(18);
    Tensor<double> A = random_tensor({3, 37}, rng, 6.0);
    const std::array<double, 9> tails{-800.0, -40.0, -12.0, -1e-9, 0.0, 1e-9, 12.0, 40.0, 800.0};
    std::copy(tails.begin(), tails.end(), A.data().begin());
    const Tensor<double> G = random_tensor({3, 37}, rng);
    Tape<mp50> reference_tape;
    const Var<mp50> A_mp = reference_tape.leaf(tensor_cast<mp50>(A));
    reference_tape.backward(sum(mul(silu(A_mp), reference_tape.constant(tensor_cast<mp50>(G)))));
    const Tensor<mp50> Y_mp = silu(A_mp).value();
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        Tape<double> tape;
        const Var<double> A_d = tape.leaf(A);
        const Var<double> Y = silu(A_d);
        tape.backward(sum(mul(Y, tape.constant(G))));
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            // One exp (a few ulps) and a handful of roundings per element: ≤ 10u ≈ 2.2e-15 of
            // values up to 800 in size (the mixed error divides by them); 1e-14 as GELU's.
            BOOST_TEST(mixed_error(Y.value(), Y_mp) <= 1e-14);
            BOOST_TEST(mixed_error(A_d.grad(), A_mp.grad()) <= 1e-14);
        }
    }
}

// rms_norm (compiled per level, ops/rms_norm.hpp) against its generic formula in 50 digits, at
// widths 1, 37 (no multiple of a vector width) and 64, with a dominant element at the first, a
// middle and the last position of a row (its x² most of Σ x²), one whose ĝ·x is most of Σ |ĝ·x|
// (G large there: P less that term loses digits of P_j, but times x_j they are a rounding of the
// first term, ĝ_j·S_j, so the kernel takes no care of it), and rows of ordinary values. dX at a dominant element is a difference of two
// nearly equal totals were it taken as the total less its own term (the kernel's way for the other
// elements): 1e6 + 12 less 1e6 keeps 12 of 1e-10's accuracy, so there the bound is relative,
// 64 u as tests/test_decoder_ops.cpp's rms_norm_gradient_keeps_its_digits_where_a_row_is_one_element
// derives; elsewhere the mixed error ≤ 1e-14, a few dozen roundings of the row's formula.
BOOST_AUTO_TEST_CASE(rms_norm_agrees_with_50_digits_at_every_level_and_keeps_a_dominant_elements_digits) {
    const testing::RestoreCpuLevel restore;
    const double u = std::numeric_limits<double>::epsilon() / 2;
    std::mt19937_64 rng(19);
    for (const std::size_t D : {1u, 37u, 64u}) {
        Tensor<double> X = random_tensor({5, D}, rng), G = random_tensor({5, D}, rng);
        const Tensor<double> gain = random_tensor({D}, rng);
        // (row, element) dominant in Σ x² (rows 0-2) and in Σ |ĝ·x| (row 3); row 4 is ordinary.
        const std::vector<std::pair<std::size_t, std::size_t>> dominant{{0, 0}, {1, D / 2}, {2, D - 1}, {3, D / 3}};
        for (std::size_t r = 0; r < 3; ++r) X[r * D + dominant[r].second] = r == 1 ? -1e3 : 1e3;
        G[3 * D + dominant[3].second] = 1e8;
        Tape<mp50> reference_tape;
        const Var<mp50> X_mp = reference_tape.leaf(tensor_cast<mp50>(X)),
                        g_mp = reference_tape.leaf(tensor_cast<mp50>(gain));
        const Var<mp50> Y_mp = rms_norm(X_mp, g_mp);
        reference_tape.backward(Y_mp, tensor_cast<mp50>(G));
        for (const CpuLevel level : available_cpu_levels()) {
            set_cpu_level(level);
            Tape<double> tape;
            const Var<double> X_d = tape.leaf(X), g_d = tape.leaf(gain);
            const Var<double> Y = rms_norm(X_d, g_d);
            tape.backward(Y, G);
            BOOST_TEST_CONTEXT(cpu_level_name(level) << ", D = " << D) {
                BOOST_TEST(mixed_error(Y.value(), Y_mp.value()) <= 1e-14);
                BOOST_TEST(mixed_error(X_d.grad(), X_mp.grad()) <= 1e-14);
                BOOST_TEST(mixed_error(g_d.grad(), g_mp.grad()) <= 1e-14);
                for (const auto& [row, j] : dominant) {
                    const mp50& exact = X_mp.grad()[row * D + j];
                    const double error = to_double(abs(mp50(X_d.grad()[row * D + j]) - exact) / abs(exact));
                    BOOST_TEST(error <= 64 * u, "row " << row << ", element " << j);
                }
            }
        }
    }
}

// The tape's NaN scan (compiled per level; inline up to 16 elements) finds a NaN at the first, a
// middle and the last of a row, on both sides of the inline size and at lengths that are no
// multiple of any vector width, and lets ±inf through.
BOOST_AUTO_TEST_CASE(the_nan_scan_finds_every_position_at_every_level) {
    const testing::RestoreCpuLevel restore;
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            for (const std::size_t n : {1u, 16u, 17u, 37u, 130u}) {
                Tensor<double> clean({n}, 1.0);
                clean[0] = std::numeric_limits<double>::infinity();
                clean[n - 1] = -std::numeric_limits<double>::infinity();
                Tape<double> tape;
                Tape<float> tape_f;  // float scans too
                BOOST_CHECK_NO_THROW(tape.leaf(clean));
                BOOST_CHECK_NO_THROW(tape_f.leaf(tensor_cast<float>(clean)));
                for (const std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
                    Tensor<double> dirty({n}, 1.0);
                    dirty[at] = std::numeric_limits<double>::quiet_NaN();
                    BOOST_CHECK_THROW(tape.leaf(dirty), value_error);
                    BOOST_CHECK_THROW(tape_f.leaf(tensor_cast<float>(dirty)), value_error);
                }
            }
        }
    }
}

namespace {

// The dual planes' copies (autodiff/dual_kernels.hpp): every length around the vector widths, each
// number to its place exactly, and accumulate adds instead of writing.
template <class T>
void check_planes_at_level(std::size_t n) {
    std::vector<T> pairs(2 * n), first(n), second(n);
    for (std::size_t k = 0; k < 2 * n; ++k) pairs[k] = T(k) + T(0.25);
    engine_kernels<T>().deinterleave(pairs.data(), n, first.data(), second.data());
    bool placed = true;
    for (std::size_t k = 0; k < n; ++k) placed = placed && first[k] == pairs[2 * k] && second[k] == pairs[2 * k + 1];
    BOOST_TEST(placed, "deinterleave, n = " << n);
    std::vector<T> merged(2 * n, T(-1));
    engine_kernels<T>().interleave(first.data(), second.data(), n, merged.data(), false);
    BOOST_TEST(merged == pairs, "interleave, n = " << n);
    engine_kernels<T>().interleave(first.data(), second.data(), n, merged.data(), true);
    bool doubled = true;
    for (std::size_t k = 0; k < 2 * n; ++k) doubled = doubled && merged[k] == 2 * pairs[k];
    BOOST_TEST(doubled, "interleave accumulating, n = " << n);
}

}  // namespace

BOOST_AUTO_TEST_CASE(dual_planes_split_and_merge_exactly_at_every_level) {
    const testing::RestoreCpuLevel restore;
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        BOOST_TEST_CONTEXT(cpu_level_name(level)) {
            for (const std::size_t n : {1u, 3u, 8u, 15u, 16u, 17u, 33u, 130u}) {
                check_planes_at_level<double>(n);
                check_planes_at_level<float>(n);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(attention_agrees_with_50_digits_at_every_level_double) {
    check_attention_at_every_level<double>(1e-12);
}

BOOST_AUTO_TEST_CASE(attention_agrees_with_50_digits_at_every_level_float) {
    check_attention_at_every_level<float>(1e-4);
}

// Each kernel gives the same bits wherever its buffers lie (src/cpu/level_kernels.hpp,
// REPRODUCIBLE): the same data at 8 different offsets from a 64-byte boundary, at every level.
// Without it, equal computations on two tapes (tests/test_fused_attention.cpp, gradients requested
// in part) differ in the last bit at the AVX levels.
template <class T>
void check_offsets_at_every_level() {
    const testing::RestoreCpuLevel restore;
    std::mt19937_64 rng(14);
    const Tensor<double> values = random_tensor({2000}, rng, 3.0);
    // The data at `offset` elements into a fresh buffer.
    const auto placed = [&](std::size_t offset, std::size_t n) {
        std::vector<T> buffer(offset + n);
        std::copy_n(values.data().begin(), n, buffer.begin() + std::ptrdiff_t(offset));
        return buffer;
    };
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        std::vector<std::vector<T>> results(8);
        for (std::size_t offset = 0; offset < results.size(); ++offset) {
            std::vector<T>& r = results[offset];
            const std::vector<T> scores = placed(offset, 301);
            std::vector<T> weights(offset + 301);
            op_kernels<T>().softmax_row(scores.data() + offset, 301, T(3), weights.data() + offset);
            r.assign(weights.begin() + std::ptrdiff_t(offset), weights.end());
            r.push_back(op_kernels<T>().sum_of(scores.data() + offset, 301));
            std::vector<T> dS(offset + 301);
            op_kernels<T>().softmax_vjp_row(weights.data() + offset, scores.data() + offset, 301, dS.data() + offset);
            r.insert(r.end(), dS.begin() + std::ptrdiff_t(offset), dS.end());
            // A tiny product (plain loops) and one through the blocked GEMM.
            for (const std::size_t size : {5, 40}) {
                const std::vector<T> A = placed(offset, size * size);
                std::vector<T> C(offset + size * size);
                kernels::gemm(kernels::Form::ab, size, size, size, A.data() + offset, A.data() + offset,
                              C.data() + offset, false);
                r.insert(r.end(), C.begin() + std::ptrdiff_t(offset), C.end());
            }
        }
        for (std::size_t offset = 1; offset < results.size(); ++offset) {
            BOOST_TEST_CONTEXT(cpu_level_name(level) << ", offset " << offset) {
                BOOST_TEST((results[offset] == results[0]));
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(results_do_not_depend_on_where_buffers_lie) {
    check_offsets_at_every_level<double>();
    check_offsets_at_every_level<float>();
}
