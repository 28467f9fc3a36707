// Chooses the instruction-set level the compiled kernels run at, and hands out that level's
// tables (engine_kernels<T>(), autodiff/cpu.hpp; op_kernels<T>(), ops/fast/kernels.hpp). The choice is made once, at the first call:
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
