// bench_bf16: the bfloat16 product (kernels::gemm_bf16, autodiff/kernels.hpp) at every CPU level
// this host has, beside the host's bfloat16 peak measured in the same run, and the float32 product
// (kernels::gemm<float>) of the same sizes at the same level. One thread; CPU time of the thread
// (the machine is shared); each contender in alternating batches of about 0.05 s, the median of
// `--rounds` batches. The peak is a loop of independent vdpbf16ps on registers only (16
// accumulators, more than the instruction's latency times its throughput on the CPUs we know), each
// 512-bit instruction 32 multiply-adds (16 float lanes × a pair), 64 flops; it needs AVX512_BF16,
// and without it the lines carry no ratio. Prints:
//   host …                                        (host.hpp: CPU, level, this host's GEMM rate)
//   bf16_peak gflops=…
//   bf16 cpu=<level> arithmetic=<fastest|vdpbf16ps> form=<ab|abT|aTb> m=… n=… k=… gflops=… peak_ratio=… float32_gflops=…
//        [of_floats_gflops=… rounded_copies_gflops=…]   (fastest only: see bench below)
// (2 flops a multiply-add; peak_ratio = gflops / the peak), at a level without vdpbf16ps once in
// each arithmetic (Bf16Arithmetic, autodiff/cpu.hpp: widened to float32, and the exact emulation),
// at the avx512_bf16 level once (both are vdpbf16ps there). Sizes: n×n×n for n = 256, 512, 1024,
// and a training-shaped layer, X [1024×64] times W [64×192], in its three products (forward X·W,
// dX = dY·Wᵀ, dW = Xᵀ·dY).
//
// Usage: OPENBLAS_NUM_THREADS=1 bench_bf16 [--rounds R]   (R ≥ 1, default 7)
#include "autodiff/low_precision.hpp"
#include "host.hpp"
#include "timing.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

using namespace tapegrad;

namespace {

constexpr double batch_seconds = 0.05;

#if defined(__x86_64__)
constexpr std::size_t peak_chains = 16, peak_iterations = 1 << 16;

// peak_iterations × peak_chains vdpbf16ps on registers, the chains independent (each starts from
// its own value, so the compiler cannot merge them; the operands come from the caller, so it
// cannot fold them). Compiled for AVX512_BF16 whatever the file's flags; called only on a CPU
// that has it.
__attribute__((target("avx512f,avx512bf16"), noinline)) float vdpbf16ps_loop(int x_pair, int y_pair) {
    const __m512bh x = (__m512bh)_mm512_set1_epi32(x_pair), y = (__m512bh)_mm512_set1_epi32(y_pair);
    __m512 acc[peak_chains];  // (a plain array: std::array would drop __m512's alignment attribute)
    for (std::size_t c = 0; c < peak_chains; ++c) acc[c] = _mm512_set1_ps(float(c));
    for (std::size_t i = 0; i < peak_iterations; ++i)
        for (__m512& a : acc) a = _mm512_dpbf16_ps(a, x, y);
    __m512 total = _mm512_setzero_ps();
    for (const __m512& a : acc) total = _mm512_add_ps(total, a);
    alignas(64) std::array<float, 16> lanes;
    _mm512_store_ps(lanes.data(), total);
    return lanes[0] + lanes[15];
}

// The host's bfloat16 peak in GFLOP/s, or nothing without AVX512_BF16.
std::optional<double> bf16_peak_gflops(std::size_t rounds) {
    if (!cpu_level_available(CpuLevel::avx512_bf16)) return std::nullopt;
    volatile float sink = 0;
    volatile int one = 0x3f803f80, small = 0x3c003c00;  // (1, 1) and (2⁻⁷, 2⁻⁷): no overflow in 2¹⁶ steps
    const timing::Timing t =
        timing::alternate_timings({[&] { sink = sink + vdpbf16ps_loop(one, small); }}, rounds, batch_seconds)[0];
    return 64.0 * peak_chains * peak_iterations / t.median_us / 1e3;
}
#else
std::optional<double> bf16_peak_gflops(std::size_t) { return std::nullopt; }
#endif

struct Size {
    kernels::Form form;
    std::size_t m, n, k;
};

const char* form_name(kernels::Form form) {
    switch (form) {
        case kernels::Form::ab:
            return "ab";
        case kernels::Form::abT:
            return "abT";
        case kernels::Form::aTb:
            return "aTb";
    }
    return "?";
}

// One line: the bfloat16 and the float32 product of `size` at the active level, alternating; in
// the fastest arithmetic (what a float tape's products run by default) also the bfloat16 product of
// float operands, rounded as it packs them (of_floats), and the same product made as matmul_bf16
// made it before it passed floats: both operands rounded into copies (kernels::round_to_bf16) and
// the product of the copies (rounded_copies); their GFLOP/s count the product's flops only.
void bench(const Size& size, std::optional<double> peak, std::size_t rounds, std::mt19937_64& rng) {
    const kernels::Form form = size.form;  // (not a structured binding: Clang 14 cannot capture one in a lambda)
    const std::size_t m = size.m, n = size.n, k = size.k;
    std::normal_distribution<float> normal;
    std::vector<float> A(m * k), B(k * n), C(m * n);
    for (float& x : A) x = normal(rng);
    for (float& x : B) x = normal(rng);
    std::vector<std::uint16_t> A16(A.size()), B16(B.size());
    for (std::size_t x = 0; x < A.size(); ++x) A16[x] = bfloat16_bits(A[x]);
    for (std::size_t x = 0; x < B.size(); ++x) B16[x] = bfloat16_bits(B[x]);
    std::vector<std::function<void()>> contenders{
        [&] { kernels::gemm_bf16(form, m, n, k, A16.data(), B16.data(), C.data(), false); },
        [&] { kernels::gemm(form, m, n, k, A.data(), B.data(), C.data(), false); }};
    const bool with_floats = bf16_arithmetic() == Bf16Arithmetic::fastest;
    std::vector<std::uint16_t> a(A.size()), b(B.size());
    if (with_floats) {
        contenders.emplace_back([&] { kernels::gemm_bf16(form, m, n, k, A.data(), B.data(), C.data(), false); });
        contenders.emplace_back([&] {
            kernels::round_to_bf16(A.data(), A.size(), a.data());
            kernels::round_to_bf16(B.data(), B.size(), b.data());
            kernels::gemm_bf16(form, m, n, k, a.data(), b.data(), C.data(), false);
        });
    }
    const std::vector<timing::Timing> t = timing::alternate_timings(contenders, rounds, batch_seconds);
    const double flops = 2.0 * double(m) * double(n) * double(k), gflops = flops / t[0].median_us / 1e3;
    const std::string floats = with_floats ? fmt::format(" of_floats_gflops={:.1f} rounded_copies_gflops={:.1f}",
                                                         flops / t[2].median_us / 1e3, flops / t[3].median_us / 1e3)
                                           : std::string();
    fmt::print("bf16 cpu={} arithmetic={} form={} m={} n={} k={} gflops={:.1f}{} float32_gflops={:.1f}{}\n",
               cpu_level_name(cpu_level()), bf16_arithmetic_name(bf16_arithmetic()), form_name(form), m, n, k, gflops,
               peak ? fmt::format(" peak_ratio={:.3f}", gflops / *peak) : "", flops / t[1].median_us / 1e3, floats);
}

}  // namespace

int main(int argc, char** argv) {
    timing::keep_freed_memory();  // before anything allocates (timing.hpp says why)
    set_threads(1);
    std::size_t rounds = 7;
    try {  // read the way every program of the project reads its numbers (tools/options.hpp)
        for (int a = 1; a < argc; ++a) {
            if (std::string_view(argv[a]) != "--rounds")
                throw cli::usage_error(fmt::format("unknown argument '{}'", argv[a]));
            if (a + 1 == argc) throw cli::usage_error("--rounds needs a number");
            rounds = cli::integer_argument("--rounds", argv[++a], std::size_t{1}, std::size_t{1000});
        }
    } catch (const cli::usage_error& e) {
        fmt::print(stderr, "bench_bf16: {} (usage: bench_bf16 [--rounds R])\n", e.what());
        return cli::exit_usage;
    }
    timing::print_host_line();
    const std::optional<double> peak = bf16_peak_gflops(rounds);
    fmt::print("bf16_peak {}\n",
               peak ? fmt::format("gflops={:.1f}", *peak) : std::string("unavailable (no AVX512_BF16)"));
    const std::vector<Size> sizes{{kernels::Form::ab, 256, 256, 256},    {kernels::Form::ab, 512, 512, 512},
                                  {kernels::Form::ab, 1024, 1024, 1024}, {kernels::Form::ab, 1024, 192, 64},
                                  {kernels::Form::abT, 1024, 64, 192},   {kernels::Form::aTb, 64, 192, 1024}};
    std::mt19937_64 rng(61);
    const CpuLevel start = cpu_level();
    const Bf16Arithmetic start_arithmetic = bf16_arithmetic();
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        for (const Bf16Arithmetic arithmetic : all_bf16_arithmetics) {
            if (level == CpuLevel::avx512_bf16 && arithmetic == Bf16Arithmetic::vdpbf16ps) continue;  // the same
            set_bf16_arithmetic(arithmetic);
            for (const Size& size : sizes) bench(size, peak, rounds, rng);
        }
    }
    set_cpu_level(start);
    set_bf16_arithmetic(start_arithmetic);
    return 0;
}
