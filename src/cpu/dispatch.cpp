// Chooses the instruction-set level the compiled kernels run at, and forwards each kernel call
// of autodiff/cpu.hpp to that level's table. The choice is made once, at the first call:
// TAPEGRAD_CPU when set, else the best level built in that the CPU supports (CPUID, through
// __builtin_cpu_supports, which also checks that the OS saves the AVX/AVX-512 registers).
#include "src/cpu/kernel_table.hpp"

#include "autodiff/error.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace tapegrad {
namespace {

using cpu_detail::KernelTable;

// This CPU has the instructions `level` is compiled with.
bool cpu_supports(CpuLevel level) {
#if defined(TAPEGRAD_X86_LEVELS)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (level) {
        case CpuLevel::baseline: return true;
        case CpuLevel::avx2: return avx2;
        case CpuLevel::avx512:
            return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    }
    return false;
#else
    return level == CpuLevel::baseline;
#endif
}

// The level's table, or nullptr when the library was built without it (off x86-64).
const KernelTable* table_of(CpuLevel level) {
    switch (level) {
        case CpuLevel::baseline: return tapegrad_kernels_baseline();
#if defined(TAPEGRAD_X86_LEVELS)
        case CpuLevel::avx2: return tapegrad_kernels_avx2();
        case CpuLevel::avx512: return tapegrad_kernels_avx512();
#else
        case CpuLevel::avx2:
        case CpuLevel::avx512: return nullptr;
#endif
    }
    return nullptr;
}

std::string available_list() {
    std::string names;
    for (const CpuLevel level : available_cpu_levels()) names += fmt::format("{}{}", names.empty() ? "" : ", ", cpu_level_name(level));
    return names;
}

// The level TAPEGRAD_CPU asks for, or the best available one when it is unset or empty.
CpuLevel chosen_at_start() {
    const char* const word = std::getenv("TAPEGRAD_CPU");
    if (word == nullptr || *word == '\0') return available_cpu_levels().back();
    for (const CpuLevel level : all_cpu_levels) {
        if (cpu_level_name(level) != word) continue;
        if (!cpu_level_available(level)) {
            throw value_error(fmt::format("TAPEGRAD_CPU={}: this {} does not support it; available here: {}", word,
                                          table_of(level) ? "CPU" : "build of tapegrad (not x86-64)", available_list()));
        }
        return level;
    }
    throw value_error(fmt::format("TAPEGRAD_CPU={}: unknown level; expected baseline, avx2 or avx512", word));
}

// The active table: chosen at the first use, changed only by set_cpu_level.
std::atomic<const KernelTable*>& active_slot() {
    static std::atomic<const KernelTable*> slot{table_of(chosen_at_start())};
    return slot;
}

const KernelTable& active() { return *active_slot().load(std::memory_order_relaxed); }

}  // namespace

CpuLevel cpu_level() { return active().level; }

bool cpu_level_available(CpuLevel level) { return table_of(level) != nullptr && cpu_supports(level); }

std::vector<CpuLevel> available_cpu_levels() {
    std::vector<CpuLevel> levels;
    for (const CpuLevel level : all_cpu_levels)
        if (cpu_level_available(level)) levels.push_back(level);
    return levels;
}

void set_cpu_level(CpuLevel level) {
    if (!cpu_level_available(level)) {
        throw value_error(fmt::format("set_cpu_level({}): not available here; available: {}", cpu_level_name(level),
                                      available_list()));
    }
    active_slot().store(table_of(level));
}

namespace compiled {

void gemm_rows(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const double* A, const double* B,
               double* C, bool accumulate, std::size_t first, std::size_t rows) {
    active().f64.gemm_rows(form, m, n, k, A, B, C, accumulate, first, rows);
}
void gemm_rows(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B,
               float* C, bool accumulate, std::size_t first, std::size_t rows) {
    active().f32.gemm_rows(form, m, n, k, A, B, C, accumulate, first, rows);
}
void softmax_row(const double* scores, std::size_t n, double row_max, double* weights) {
    active().f64.softmax_row(scores, n, row_max, weights);
}
void softmax_row(const float* scores, std::size_t n, float row_max, float* weights) {
    active().f32.softmax_row(scores, n, row_max, weights);
}
void softmax_vjp_row(const double* weights, const double* upstream, std::size_t n, double* dS) {
    active().f64.softmax_vjp_row(weights, upstream, n, dS);
}
void softmax_vjp_row(const float* weights, const float* upstream, std::size_t n, float* dS) {
    active().f32.softmax_vjp_row(weights, upstream, n, dS);
}
void exp_shifted(double* x, std::size_t n, double shift) { active().f64.exp_shifted(x, n, shift); }
void exp_shifted(float* x, std::size_t n, float shift) { active().f32.exp_shifted(x, n, shift); }
bool scale_row(double* x, std::size_t n, double c) { return active().f64.scale_row(x, n, c); }
bool scale_row(float* x, std::size_t n, float c) { return active().f32.scale_row(x, n, c); }
double max_of(const double* x, std::size_t n) { return active().f64.max_of(x, n); }
float max_of(const float* x, std::size_t n) { return active().f32.max_of(x, n); }
double sum_of(const double* x, std::size_t n) { return active().f64.sum_of(x, n); }
float sum_of(const float* x, std::size_t n) { return active().f32.sum_of(x, n); }
void score_gradient_row(double* p, const double* dp, std::size_t n, double mean, double c) {
    active().f64.score_gradient_row(p, dp, n, mean, c);
}
void score_gradient_row(float* p, const float* dp, std::size_t n, float mean, float c) {
    active().f32.score_gradient_row(p, dp, n, mean, c);
}
bool any_nan(const double* x, std::size_t n) { return active().f64.any_nan(x, n); }
bool any_nan(const float* x, std::size_t n) { return active().f32.any_nan(x, n); }
void gelu_tanh(const double* a, std::size_t n, double* y) { active().f64.gelu_tanh(a, n, y); }
void gelu_tanh(const float* a, std::size_t n, float* y) { active().f32.gelu_tanh(a, n, y); }
void gelu_tanh_vjp(const double* a, const double* g, std::size_t n, double* da) {
    active().f64.gelu_tanh_vjp(a, g, n, da);
}
void gelu_tanh_vjp(const float* a, const float* g, std::size_t n, float* da) {
    active().f32.gelu_tanh_vjp(a, g, n, da);
}
void deinterleave(const double* pairs, std::size_t n, double* first, double* second) {
    active().f64.deinterleave(pairs, n, first, second);
}
void deinterleave(const float* pairs, std::size_t n, float* first, float* second) {
    active().f32.deinterleave(pairs, n, first, second);
}
void interleave(const double* first, const double* second, std::size_t n, double* pairs, bool accumulate) {
    active().f64.interleave(first, second, n, pairs, accumulate);
}
void interleave(const float* first, const float* second, std::size_t n, float* pairs, bool accumulate) {
    active().f32.interleave(first, second, n, pairs, accumulate);
}

}  // namespace compiled
}  // namespace tapegrad
