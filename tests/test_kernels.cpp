// The float/double GEMM kernels: each of the three forms (A·B, A·Bᵀ, Aᵀ·B) agrees with the
// generic loop the multiprecision path uses (run in long double), and splitting a large product over threads gives the
// same result as one thread.
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

}  // namespace

BOOST_AUTO_TEST_CASE(threaded_products_match_one_thread_and_the_reference_loop) {
    // 300·260·200 = 15.6M multiply-adds: above the threshold, so two threads split the rows.
    constexpr std::size_t m = 300, n = 260, k = 200;
    static_assert(m * n * k >= kernels::parallel_madds);
    std::mt19937_64 rng(4);
    const Tensor<double> A = testing::random_tensor({m * k}, rng), B = testing::random_tensor({k * n}, rng);
    for (const kernels::Form form : {kernels::Form::ab, kernels::Form::abT, kernels::Form::aTb}) {
        // The generic loop (the multiprecision path) in long double, rounded to double: the
        // reference (64-bit significand: its own error is ~k·5e-20, far below the tolerance).
        const Tensor<long double> A_long = tensor_cast<long double>(A), B_long = tensor_cast<long double>(B);
        std::vector<long double> C_long(m * n);
        kernels::gemm(form, m, n, k, A_long.data().data(), B_long.data().data(), C_long.data(), false);
        const std::vector<double> reference(C_long.begin(), C_long.end());

        std::vector<double> one(m * n), two(m * n);
        set_threads(1);
        kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), one.data(), false);
        set_threads(2);
        kernels::gemm(form, m, n, k, A.data().data(), B.data().data(), two.data(), false);
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
