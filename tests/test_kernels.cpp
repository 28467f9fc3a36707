// The float/double GEMM kernels: each of the three forms (A·B, A·Bᵀ, Aᵀ·B) agrees with the
// generic loop the multiprecision path uses (run in long double), and splitting a large product
// over threads (by rows, or by columns when C has few rows) gives one thread's result bit for bit,
// also at sizes that are no multiple of the blocks (the last, short row or column block); so do
// matmul's two gradients computed side by side.
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

// C (m×n) = op(A)·op(B), k deep, on `threads` threads. C starts as NaN, so an element the product
// never writes is wrong in every comparison.
template <class T>
std::vector<T> product_on_threads(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const Tensor<T>& A,
                                  const Tensor<T>& B, unsigned threads) {
    std::vector<T> C(m * n, std::numeric_limits<T>::quiet_NaN());
    set_threads(threads);
    kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), C.data(), false);
    set_threads(0);
    return C;
}

// C = op(A)·op(B) for C of 64 rows and 1024 columns, 1024 deep, on `threads` threads.
template <class T>
std::vector<T> wide_product(kernels::Form form, const Tensor<T>& A, const Tensor<T>& B, unsigned threads) {
    return product_on_threads(form, 64, 1024, 1024, A, B, threads);
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

namespace {

// A product of the test below: C is m×n, k deep, cut as `split` (kernels::split_of), with its rows
// (row split) or columns (column split) no multiple of their blocks, so the last block is short.
struct UnevenProduct {
    std::size_t m, n, k;
    kernels::Split split;
};

// Each just past kernels::parallel_madds (4 194 304 multiply-adds), k odd. Row blocks (multiples of
// 16 rows): m = 131 is cut 80 + 51 on any count from 2; 301 is 160 + 141 on 2 threads, 112·2 + 77
// on 3, 80·3 + 61 on 4; 257 is 144 + 113, 96·2 + 65, 80·3 + 17. Column blocks (256 columns, m < 128):
// n = 600 is 256·2 + 88, n = 1031 is 256·4 + 7.
constexpr std::array<UnevenProduct, 7> uneven_products{{
    {131, 257, 127, kernels::Split::rows},
    {301, 600, 25, kernels::Split::rows},
    {257, 1031, 17, kernels::Split::rows},
    {1, 1031, 4099, kernels::Split::columns},
    {3, 600, 2333, kernels::Split::columns},
    {17, 1031, 241, kernels::Split::columns},
    {127, 600, 57, kernels::Split::columns},
}};

// How many elements of C fail a comparison, and the first of them.
struct Misses {
    std::size_t count = 0, first = 0;
};

template <class Ok>
Misses misses(std::size_t size, const Ok& ok) {
    Misses found;
    for (std::size_t x = 0; x < size; ++x)
        if (!ok(x) && found.count++ == 0) found.first = x;
    return found;
}

std::string describe(const Misses& found, std::size_t m, std::size_t n) {
    return fmt::format("{} of {} wrong, first at ({}, {})", found.count, m * n, found.first / n, found.first % n);
}

// One uneven product on 1 to 5, 7 and 16 threads (from 3 or 5 on, fewer row blocks than threads). Each result within the rounding bound of the long-double
// reference, element by element: γ_k·Σ_p |a_p·b_p| (γ_k = k·u/(1 − k·u): k products summed in any
// order, with or without FMA; the bound of wide_products_match_one_thread, with Σ|terms| taken per
// element instead of bounded by k), plus u·|C| for the reference's rounding to double (its own
// error, k·5e-20·Σ|terms|, is far below). On more threads, one thread's result bit for bit.
template <class T>
void uneven_product_matches(const UnevenProduct& p, kernels::Form form, const char* type) {
    const auto [A, B] = operands<T>(p.m * p.k, p.k * p.n, p.m + p.n + p.k);
    const auto absolute = [](Tensor<T> t) {
        for (T& x : t.data()) x = std::abs(x);
        return t;
    };
    const Tensor<T> A_abs = absolute(A), B_abs = absolute(B);
    const std::vector<double> reference = reference_product(form, p.m, p.n, p.k, A.data(), B.data());
    const std::vector<double> magnitude = reference_product(form, p.m, p.n, p.k, A_abs.data(), B_abs.data());
    const double u = std::numeric_limits<T>::epsilon() / 2, k = double(p.k);
    const double per_magnitude = k * u / (1 - k * u) + u;
    const std::vector<T> one = product_on_threads(form, p.m, p.n, p.k, A, B, 1);
    // 1 to 5 threads give every cut these shapes have (at most m / 64 = 4 row blocks; column blocks
    // do not depend on the count); 7 and testing::most_threads_tested (16) stand for the counts
    // above, where the blocks are fewer than the threads. (All 16 counts cost 5 s a run, and this
    // test runs at every CPU level, under AddressSanitizer and under ThreadSanitizer.)
    for (const unsigned threads : {1u, 2u, 3u, 4u, 5u, 7u, testing::most_threads_tested}) {
        const std::vector<T> C = threads == 1 ? one : product_on_threads(form, p.m, p.n, p.k, A, B, threads);
        const Misses off = misses(C.size(), [&](std::size_t x) {
            return std::abs(double(C[x]) - reference[x]) <= per_magnitude * magnitude[x];
        });
        const Misses differ = misses(C.size(), [&](std::size_t x) { return threads == 1 || C[x] == one[x]; });
        BOOST_TEST_CONTEXT(type << " form " << int(form) << " m=" << p.m << " n=" << p.n << " k=" << p.k << ", "
                                << threads << " threads") {
            BOOST_TEST(off.count == 0u, "off the reference: " << describe(off, p.m, p.n));
            BOOST_TEST(differ.count == 0u, "not one thread's bits: " << describe(differ, p.m, p.n));
        }
    }
}

}  // namespace

// Every cut gemm makes (row blocks; column blocks when C has few rows), in each of the three forms,
// with the last block short: on any thread count, every element is computed, as one thread computes it.
BOOST_AUTO_TEST_CASE(uneven_products_match_one_thread_and_the_reference) {
    for (const UnevenProduct& p : uneven_products) {
        BOOST_TEST((kernels::split_of(p.m, p.n, p.k) == p.split), "m=" << p.m << " n=" << p.n << " k=" << p.k);
        for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
            uneven_product_matches<float>(p, form, "float");
            uneven_product_matches<double>(p, form, "double");
        }
    }
}

namespace {

// One small product at type T against the reference, assigning and accumulating.
template <class T>
void small_product_matches(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, std::mt19937_64& rng,
                           double tolerance) {
    const auto values = [&](std::size_t size) {
        const Tensor<double> t = testing::random_tensor({size}, rng);
        return std::vector<T>(t.data().begin(), t.data().end());
    };
    const std::vector<T> A = values(m * k), B = values(k * n), C0 = values(m * n);
    const std::vector<double> reference = reference_product<T>(form, m, n, k, A, B);
    std::vector<T> C(m * n);
    kernels::gemm(form, m, n, k, A.data(), B.data(), C.data(), false);
    BOOST_TEST(max_mixed(std::vector<double>(C.begin(), C.end()), reference) <= tolerance,
               "form " << int(form) << " m=" << m << " n=" << n << " k=" << k);
    C = C0;
    kernels::gemm(form, m, n, k, A.data(), B.data(), C.data(), true);
    std::vector<double> accumulated(m * n);
    for (std::size_t x = 0; x < m * n; ++x) accumulated[x] = double(C0[x]) + reference[x];
    BOOST_TEST(max_mixed(std::vector<double>(C.begin(), C.end()), accumulated) <= tolerance,
               "accumulating, form " << int(form) << " m=" << m << " n=" << n << " k=" << k);
}

}  // namespace

// Products with m + n + k under small_product_size are one block that each level computes by its
// plain loop (small_product in src/cpu/level_kernels.hpp), not by Eigen's GEMM: every form, at
// shapes whose m, n and k all differ (an index of one for another cannot hide), assigning and
// accumulating, in float and double (run at every CPU level by the test_kernels_cpu_* rows). The
// sums have at most 6 products of values in [-1, 1]: rounding below 6·u·6 ≈ 4e-15 (double) and
// 2.2e-6 (float), relative to max(1, |C|).
BOOST_AUTO_TEST_CASE(small_products_take_the_plain_loop_and_match_the_reference) {
    std::mt19937_64 rng(19);
    constexpr std::size_t small_product_size = 20;  // src/cpu/level_kernels.hpp's (not visible here)
    constexpr std::size_t shapes[][3] = {{2, 3, 4}, {5, 1, 3}, {1, 6, 2}, {4, 5, 6}, {3, 2, 1}};  // m, n, k
    for (const auto& s : shapes) {
        BOOST_TEST_REQUIRE(s[0] + s[1] + s[2] < small_product_size);
        for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
            small_product_matches<double>(form, s[0], s[1], s[2], rng, 1e-14);
            small_product_matches<float>(form, s[0], s[1], s[2], rng, 1e-5);
        }
    }
}
