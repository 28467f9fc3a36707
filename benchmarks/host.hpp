// The host line every benchmark prints first: the CPU model, the level tapegrad's kernels run at,
// and the GEMM rate this host reaches in the same run, ours and (when linked) LibTorch's, which
// goes to the system BLAS, OpenBLAS on a machine set up as the README says. Machines of one kind
// are not the same CPU, so each line of a benchmark is read beside this rate: as a ratio to
// LibTorch and as a fraction of the host's GEMM rate.
//   host cpu_model="…" cpu=avx512 OPENBLAS_CORETYPE=… gemm n=512 dtype=float64 tapegrad_gflops=… libtorch_gflops=…
#pragma once

#include "timing.hpp"

#include "autodiff/cpu.hpp"
#include "autodiff/kernels.hpp"
#include "autodiff/parallel.hpp"

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif

#include <fmt/format.h>

#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace tapegrad::timing {

// The median rate of one warm n×n×n product on this thread, in GFLOP/s (2 flops a multiply-add).
template <class T>
double tapegrad_gemm_gflops(std::size_t n) {
    const unsigned threads_before = thread_count();
    set_threads(1);
    std::mt19937_64 generator(11);
    std::uniform_real_distribution<double> uniform(-1, 1);
    std::vector<T> a(n * n), b(n * n), c(n * n);
    for (T& x : a) x = static_cast<T>(uniform(generator));
    for (T& x : b) x = static_cast<T>(uniform(generator));
    std::vector<double> samples;
    for (int round = 0; round < 14; ++round) {
        const double start = thread_seconds();
        kernels::gemm(kernels::Form::ab, n, n, n, a.data(), b.data(), c.data(), false);
        if (round >= 3) samples.push_back(thread_seconds() - start);  // three warm-up rounds
    }
    set_threads(threads_before);
    return 2.0 * static_cast<double>(n * n * n) / median(samples) / 1e9;
}

#ifdef TAPEGRAD_HAVE_TORCH
template <class T>
double libtorch_gemm_gflops(std::size_t n) {
    const auto type = std::is_same_v<T, float> ? torch::kFloat : torch::kDouble;
    const int threads_before = torch::get_num_threads();
    torch::set_num_threads(1);
    const torch::Tensor a = torch::rand({long(n), long(n)}, type), b = torch::rand({long(n), long(n)}, type);
    std::vector<double> samples;
    for (int round = 0; round < 14; ++round) {
        const double start = thread_seconds();
        const torch::Tensor product = a.mm(b);
        if (round >= 3) samples.push_back(thread_seconds() - start);
    }
    torch::set_num_threads(threads_before);
    return 2.0 * static_cast<double>(n * n * n) / median(samples) / 1e9;
}
#endif

inline void print_host_line(std::size_t n = 512) {
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    std::string line = fmt::format("host cpu_model=\"{}\" cpu={} OPENBLAS_CORETYPE={}", cpu_model(),
                                   cpu_level_name(cpu_level()), coretype ? coretype : "unset");
    for (const bool single : {false, true}) {
        const double ours = single ? tapegrad_gemm_gflops<float>(n) : tapegrad_gemm_gflops<double>(n);
        line += fmt::format(" gemm n={} dtype={} tapegrad_gflops={:.1f}", n, single ? "float32" : "float64", ours);
#ifdef TAPEGRAD_HAVE_TORCH
        line += fmt::format(" libtorch_gflops={:.1f}",
                            single ? libtorch_gemm_gflops<float>(n) : libtorch_gemm_gflops<double>(n));
#endif
    }
    fmt::print("{}\n", line);
}

}  // namespace tapegrad::timing
