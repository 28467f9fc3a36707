// Chooses the instruction-set level the compiled kernels run at, and hands out that level's
// tables (engine_kernels<T>(), autodiff/cpu.hpp; op_kernels<T>(), ops/fast/kernels.hpp). The choice is made once, at the first call:
// TAPEGRAD_CPU when set, else the best level built in that the CPU supports (CPUID, through
// __builtin_cpu_supports, which also checks that the OS saves the AVX/AVX-512 registers; the
// AVX512_BF16 bit read from CPUID itself, on top of the avx512 level's checks). It also keeps the
// bfloat16 product's arithmetic (TAPEGRAD_BF16, Bf16Arithmetic).
#include "src/cpu/kernel_table.hpp"

#include "autodiff/error.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <string>

#if defined(TAPEGRAD_X86_LEVELS)
#include <cpuid.h>
#endif

namespace tapegrad {
namespace {

using cpu_detail::KernelTable;

#if defined(TAPEGRAD_X86_LEVELS)
// CPUID leaf 7, subleaf 1, EAX bit 5: AVX512_BF16 (Intel SDM vol. 2, CPUID, "Structured Extended
// Feature Enumeration Sub-leaf 1"), read only when leaf 7 exists and reports subleaf 1.
bool cpuid_reports_avx512_bf16() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || eax < 1) return false;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return ((eax >> 5) & 1u) != 0;
}
#endif

// This CPU has the instructions `level` is compiled with.
bool cpu_supports(CpuLevel level) {
#if defined(TAPEGRAD_X86_LEVELS)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    // (The builtin's avx512* answers include XGETBV's check that the OS saves the zmm and mask registers.)
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    switch (level) {
        case CpuLevel::baseline: return true;
        case CpuLevel::avx2: return avx2;
        case CpuLevel::avx512: return avx512;
        case CpuLevel::avx512_bf16: return avx512 && cpuid_reports_avx512_bf16();
    }
    return false;
#else
    return level == CpuLevel::baseline;
#endif
}

using TableFunction = const KernelTable* (*)();

// The function that makes the level's table, or nullptr when the library was built without the
// level (off x86-64, every level but baseline). Handed out, not called: a table function may run the
// level's own instructions (the avx512_bf16 table is built by copying the avx512 one with AVX-512
// moves), which on a CPU without the level are an illegal instruction.
TableFunction table_function_of(CpuLevel level) {
    switch (level) {
        case CpuLevel::baseline:
            return &tapegrad_kernels_baseline;
#if defined(TAPEGRAD_X86_LEVELS)
        case CpuLevel::avx2:
            return &tapegrad_kernels_avx2;
        case CpuLevel::avx512:
            return &tapegrad_kernels_avx512;
        case CpuLevel::avx512_bf16:
            return &tapegrad_kernels_avx512_bf16;
#else
        case CpuLevel::avx2:
        case CpuLevel::avx512:
        case CpuLevel::avx512_bf16: return nullptr;
#endif
    }
    return nullptr;
}

// The library holds the level's kernels.
bool built_in(CpuLevel level) { return table_function_of(level) != nullptr; }

// The level's table, for a level cpu_level_available() admits only (see table_function_of).
const KernelTable* table_of(CpuLevel level) { return table_function_of(level)(); }

// The levels' words, comma-separated: the available ones, or all.
std::string names_of(const auto& levels) {
    std::string names;
    for (const CpuLevel level : levels) names += fmt::format("{}{}", names.empty() ? "" : ", ", cpu_level_name(level));
    return names;
}

std::string available_list() { return names_of(available_cpu_levels()); }

// The level TAPEGRAD_CPU asks for, or the best available one when it is unset or empty.
CpuLevel chosen_at_start() {
    const char* const word = std::getenv("TAPEGRAD_CPU");
    if (word == nullptr || *word == '\0') return available_cpu_levels().back();
    for (const CpuLevel level : all_cpu_levels) {
        if (cpu_level_name(level) != word) continue;
        if (!cpu_level_available(level)) {
            throw value_error(fmt::format("TAPEGRAD_CPU={}: this {} does not support it; available here: {}", word,
                                          built_in(level) ? "CPU" : "build of tapegrad (not x86-64)",
                                          available_list()));
        }
        return level;
    }
    throw value_error(fmt::format("TAPEGRAD_CPU={}: unknown level; expected one of {}", word, names_of(all_cpu_levels)));
}

// The active table: chosen at the first use, changed only by set_cpu_level.
std::atomic<const KernelTable*>& active_slot() {
    static std::atomic<const KernelTable*> slot{table_of(chosen_at_start())};
    return slot;
}

const KernelTable& active() { return *active_slot().load(std::memory_order_relaxed); }

}  // namespace

CpuLevel cpu_level() { return active().level; }

bool cpu_level_available(CpuLevel level) { return built_in(level) && cpu_supports(level); }

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

namespace {

// The arithmetic TAPEGRAD_BF16 asks for, or fastest when it is unset or empty.
Bf16Arithmetic bf16_arithmetic_at_start() {
    const char* const word = std::getenv("TAPEGRAD_BF16");
    if (word == nullptr || *word == '\0') return Bf16Arithmetic::fastest;
    for (const Bf16Arithmetic arithmetic : all_bf16_arithmetics) {
        if (bf16_arithmetic_name(arithmetic) == word) return arithmetic;
    }
    throw value_error(fmt::format("TAPEGRAD_BF16={}: unknown arithmetic; expected fastest or vdpbf16ps", word));
}

std::atomic<Bf16Arithmetic>& bf16_arithmetic_slot() {
    static std::atomic<Bf16Arithmetic> slot{bf16_arithmetic_at_start()};
    return slot;
}

}  // namespace

Bf16Arithmetic bf16_arithmetic() { return bf16_arithmetic_slot().load(std::memory_order_relaxed); }

void set_bf16_arithmetic(Bf16Arithmetic arithmetic) { bf16_arithmetic_slot().store(arithmetic); }

template <>
const EngineKernels<double>& engine_kernels<double>() {
    return active().engine_f64;
}
template <>
const EngineKernels<float>& engine_kernels<float>() {
    return active().engine_f32;
}
template <>
const OpKernels<double>& op_kernels<double>() {
    return active().ops_f64;
}
template <>
const OpKernels<float>& op_kernels<float>() {
    return active().ops_f32;
}

}  // namespace tapegrad
