// The float/double GEMM kernels: each of the three forms (A·B, A·Bᵀ, Aᵀ·B) agrees with the
// generic loop the multiprecision path uses (run in long double), and splitting a large product
// over threads (by rows, or by columns when C has few rows) gives one thread's result bit for bit;
// so do matmul's two gradients computed side by side.
#define BOOST_TEST_MODULE kernels
#include "support.hpp"

using namespace tapegrad;

namespace {

// Largest |a − b| / max(1, |b|).
double max_mixed(const std::vector<double>& a, const std::vector<double>& b) {
    double worst = 0;
    for (std::size_t x = 0; x < a.size(); ++x) worst = std::max(worst, std::abs(a[x] - b[x]) / std::max(1.0, std::abs(b[x])));
    return worst;
}

// C = op(A)·op(B) by the generic loop (the multiprecision path) in long double, rounded to double:
// the reference (64-bit significand: its own error is ~k·5e-20, far below every tolerance here).
template <class T>
std::vector<double> reference_product(kernels::Form form, std::size_t m, std::size_t n, std::size_t k,
                                      std::span<const T> A, std::span<const T> B) {
    const std::vector<long double> A_long(A.begin(), A.end()), B_long(B.begin(), B.end());
    std::vector<long double> C(m * n);
    kernels::gemm(form, m, n, k, A_long.data(), B_long.data(), C.data(), false);
    return std::vector<double>(C.begin(), C.end());
}

}  // namespace

BOOST_AUTO_TEST_CASE(threaded_products_match_one_thread_and_the_reference_loop) {
    // 300·260·200 = 15.6M multiply-adds: above the threshold, so two threads split the rows.
    constexpr std::size_t m = 300, n = 260, k = 200;
    static_assert(m * n * k >= kernels::parallel_madds);
    std::mt19937_64 rng(4);
    const Tensor<double> A = testing::random_tensor({m * k}, rng), B = testing::random_tensor({k * n}, rng);
    for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
        const std::vector<double> reference = reference_product(form, m, n, k, A.data(), B.data());

        std::vector<double> one(m * n), two(m * n);
        set_threads(1);
        kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), one.data(), false);
        set_threads(2);
        kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), two.data(), false);
        BOOST_TEST((two == one), "form " << int(form) << ": row blocks differ from one thread");
        // Accumulate mode adds onto what is there: C + A·B = 2·(A·B).
        kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), two.data(), true);
        for (double& x : two) x /= 2;
        set_threads(0);
        // Sums of k = 200 products of values in [-1, 1]: rounding below k·u·(sum of |terms|) ≈ 2e-12.
        BOOST_TEST(max_mixed(one, reference) <= 1e-12);
        BOOST_TEST(max_mixed(two, reference) <= 1e-12);
        BOOST_TEST(max_mixed(two, one) <= 1e-12);
    }
}

// Which cut gemm makes (kernels::split_of): the shapes of the tests here take the one they are named for.
BOOST_AUTO_TEST_CASE(products_are_cut_by_rows_by_columns_or_not_at_all) {
    using kernels::Split, kernels::split_of;
    BOOST_TEST((split_of(300, 260, 200) == Split::rows));
    BOOST_TEST((split_of(64, 1024, 1024) == Split::columns));  // d × T, as Qᵀ·dS in attention
    BOOST_TEST((split_of(64, 64, 1024) == Split::none));       // too few rows and columns to cut
    BOOST_TEST((split_of(1024, 64, 32) == Split::none));       // too small to pay for a hand-over
}

namespace {

// C = op(A)·op(B) for C of 64 rows and 1024 columns, 1024 deep, on `threads` threads.
template <class T>
std::vector<T> wide_product(kernels::Form form, const Tensor<T>& A, const Tensor<T>& B, unsigned threads) {
    constexpr std::size_t m = 64, n = 1024, k = 1024;
    std::vector<T> C(m * n);
    set_threads(threads);
    kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), C.data(), false);
    set_threads(0);
    return C;
}

// A and B of the given sizes, drawn uniformly from [-1, 1] (testing::random_tensor) and rounded to T.
template <class T>
std::pair<Tensor<T>, Tensor<T>> operands(std::size_t a_size, std::size_t b_size, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    Tensor<T> A = tensor_cast<T>(testing::random_tensor({a_size}, rng));
    return {std::move(A), tensor_cast<T>(testing::random_tensor({b_size}, rng))};
}

template <class T>
void wide_products_match_one_thread(const char* type) {
    constexpr std::size_t m = 64, n = 1024, k = 1024;
    const auto [A, B] = operands<T>(m * k, k * n, 6);
    for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
        const std::vector<T> one = wide_product(form, A, B, 1), two = wide_product(form, A, B, 2);
        BOOST_TEST((two == one), type << " form " << int(form) << ": column blocks differ from one thread");
        const std::vector<double> reference = reference_product(form, m, n, k, A.data(), B.data());
        // Sums of k = 1024 products of values in [-1, 1]: rounding below γ_k·Σ|terms| ≈ k·u·k = k²·u
        // (6.3e-2 in float, 1.2e-10 in double), far below what a wrong element would be off by.
        const double bound = double(k) * double(k) * std::numeric_limits<T>::epsilon() / 2;
        double worst = 0;
        for (std::size_t x = 0; x < m * n; ++x) worst = std::max(worst, double(std::abs(one[x] - reference[x])));
        BOOST_TEST(worst <= bound, type << " form " << int(form) << ": off by " << worst);
    }
}

}  // namespace

// Qᵀ·dS in attention (d × T) has too few rows to cut: it is cut into blocks of columns, the same
// blocks on any number of threads, so the result is one thread's bit for bit.
BOOST_AUTO_TEST_CASE(products_cut_by_columns_match_one_thread_bit_for_bit) {
    wide_products_match_one_thread<float>("float");
    wide_products_match_one_thread<double>("double");
}

// Why the column blocks must not follow the thread count: the same float product cut into thirds
// (blocks of 342 columns, as three threads would cut 1024) rounds differently from the fixed
// blocks of 256 at every level, so the bitwise comparison above would tell the two apart.
BOOST_AUTO_TEST_CASE(column_blocks_at_other_starts_round_differently) {
    static_assert(kernels::columns_per_block == 256);
    constexpr std::size_t m = 64, n = 1024, k = 1024, third = 342;
    const auto [A, B] = operands<float>(m * k, k * n, 6);
    const std::vector<float> fixed = wide_product(kernels::Form::ab, A, B, 1);
    std::vector<float> thirds(m * n);
    for (std::size_t first = 0; first < n; first += third) {
        engine_kernels<float>().gemm_block(kernels::Form::ab, m, n, k, A.data().data(), B.data().data(), thirds.data(),
                                           false, {0, m, first, std::min(third, n - first)});
    }
    BOOST_TEST(!(thirds == fixed));
}

// Why row blocks are multiples of kernels::row_granule: a product of the row-block test's shape
// cut at row 150 (as two threads cut 300 rows before the granule) rounds differently from one
// thread (in float at every level; in double at the AVX-512 level), so a bitwise comparison tells
// such blocks apart; cut at row 160 it does not.
BOOST_AUTO_TEST_CASE(row_blocks_cut_off_the_granule_round_differently) {
    constexpr std::size_t m = 300, n = 260, k = 200;
    const auto drawn = operands<float>(m * k, k * n, 4);  // (a lambda may not capture a structured binding in Clang 14)
    const Tensor<float>& A = drawn.first;
    const Tensor<float>& B = drawn.second;
    const auto cut_into = [&](std::initializer_list<kernels::Block> blocks) {
        std::vector<float> C(m * n);
        for (const kernels::Block block : blocks) {
            engine_kernels<float>().gemm_block(kernels::Form::ab, m, n, k, A.data().data(), B.data().data(), C.data(),
                                               false, block);
        }
        return C;
    };
    const auto cut_at = [&](std::size_t row) { return cut_into({{0, row, 0, n}, {row, m - row, 0, n}}); };
    const std::vector<float> whole = cut_into({{0, m, 0, n}});
    BOOST_TEST(!(cut_at(150) == whole));
    BOOST_TEST((cut_at(160) == whole));
}

// matmul's dA = G·Bᵀ and dB = Aᵀ·G run side by side when one cannot be cut (dW = Xᵀ·G of a
// projection, 64 × 64): the gradients are one thread's bit for bit, and the right ones.
BOOST_AUTO_TEST_CASE(matmul_gradients_side_by_side_match_one_thread) {
    constexpr std::size_t T = 1024, D = 64, d = 64;
    using kernels::Split, kernels::split_of;
    BOOST_TEST((split_of(D, d, T) == Split::none));  // dW: one thread
    BOOST_TEST(T * D * d >= kernels::side_by_side_madds);
    std::mt19937_64 rng(8);
    const Tensor<double> x = testing::random_tensor({T, D}, rng), w = testing::random_tensor({D, d}, rng),
                         g = testing::random_tensor({T, d}, rng);
    const auto gradients = [&](unsigned threads) {
        set_threads(threads);
        Tape<double> tape;
        const Var<double> X = tape.leaf(x), W = tape.leaf(w);
        tape.backward(matmul(X, W), g);
        set_threads(0);
        return std::pair{X.grad(), W.grad()};
    };
    const auto [dX_one, dW_one] = gradients(1);
    const auto [dX_two, dW_two] = gradients(2);
    BOOST_TEST((dX_two == dX_one));
    BOOST_TEST((dW_two == dW_one));
    // Against the generic loop in long double: sums of at most T = 1024 products of values in
    // [-1, 1], rounding below γ_T·Σ|terms| ≈ T·u·T = T²·u = 1.2e-10.
    const std::vector<double> dX_data(dX_one.data().begin(), dX_one.data().end());
    const std::vector<double> dW_data(dW_one.data().begin(), dW_one.data().end());
    BOOST_TEST(max_mixed(dX_data, reference_product(kernels::Form::abT, T, D, d, g.data(), w.data())) <= 1.2e-10);
    BOOST_TEST(max_mixed(dW_data, reference_product(kernels::Form::aTb, D, d, T, x.data(), g.data())) <= 1.2e-10);
}
