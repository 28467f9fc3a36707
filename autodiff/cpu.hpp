/// \file
/// The compiled part of tapegrad: the float/double kernels (matrix-product blocks, softmax rows,
/// fused attention's tile rows) are compiled once per instruction-set level inside the library
/// (src/cpu/), and the best level this CPU supports is chosen at run time, so a user's plain
/// Release build gets AVX2 or AVX-512 code without any flag. This header declares the level API
/// and the engine's compiled kernels (the ops' are in ops/fast/kernels.hpp); the header-only code
/// (autodiff/kernels.hpp, ops/fast/) calls them for float and double, and keeps its generic loops
/// for every other scalar (the 50-digit type).
/// The environment variable TAPEGRAD_CPU=baseline|avx2|avx512|avx512_bf16 forces a level at start-up;
/// TAPEGRAD_BF16=fastest|vdpbf16ps chooses the bfloat16 product's arithmetic (Bf16Arithmetic).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tapegrad {

/// Instruction-set levels the kernels are compiled for. baseline: x86-64 (SSE2) or the target's
/// default elsewhere; avx2: AVX2 + FMA; avx512: AVX-512 F, DQ, VL and BW (with AVX2 + FMA);
/// avx512_bf16: avx512 plus AVX512_BF16, whose vdpbf16ps runs the bfloat16 product
/// (kernels::gemm_bf16): every other kernel of that level is the avx512 level's (the other levels
/// widen the bfloat16 product to float32, or emulate vdpbf16ps exactly: Bf16Arithmetic). A level is
/// chosen by default only when the CPU reports it (avx512_bf16: CPUID leaf 7 subleaf 1, EAX bit 5,
/// with the OS saving the AVX-512 registers).
enum class CpuLevel { baseline, avx2, avx512, avx512_bf16 };

inline constexpr std::array<CpuLevel, 4> all_cpu_levels{CpuLevel::baseline, CpuLevel::avx2, CpuLevel::avx512,
                                                        CpuLevel::avx512_bf16};

/// The word TAPEGRAD_CPU takes for a level (and what benchmarks print as `cpu=<level>`).
constexpr std::string_view cpu_level_name(CpuLevel level) {
    switch (level) {
        case CpuLevel::baseline: return "baseline";
        case CpuLevel::avx2: return "avx2";
        case CpuLevel::avx512: return "avx512";
        case CpuLevel::avx512_bf16: return "avx512_bf16";
    }
    return "unknown";
}

/// The level the kernels run at: TAPEGRAD_CPU when set (value_error if the word is unknown or this
/// CPU lacks the level), else the best level built into the library that this CPU supports.
CpuLevel cpu_level();
/// Whether `level` is built into the library (only baseline off x86-64) and this CPU supports it.
bool cpu_level_available(CpuLevel level);
/// The available levels, lowest first.
std::vector<CpuLevel> available_cpu_levels();
/// Switches every later kernel call to `level` (tests and benchmarks compare levels in one run);
/// value_error when it is not available. Not to be called while kernels run on other threads.
void set_cpu_level(CpuLevel level);

/// How the bfloat16 product (kernels::gemm_bf16) sums its products. Both read the same bfloat16
/// operands, and every product of two bfloat16 numbers is exact in float32; they differ in the order
/// and the rounding of the float32 sums (autodiff/kernels.hpp gives each arithmetic and its bound).
/// The environment variable TAPEGRAD_BF16=fastest|vdpbf16ps chooses at start-up (fastest by default).
enum class Bf16Arithmetic {
    /// vdpbf16ps where the CPU has AVX512_BF16; elsewhere the operands widened to float32 and
    /// multiplied by the level's float32 product (18 to 30 times the emulation's speed on the development host).
    fastest,
    /// vdpbf16ps's arithmetic at every level, emulated exactly where the instruction is missing: the
    /// same bits as an AVX512_BF16 machine, to reproduce its run bit for bit.
    vdpbf16ps,
};

inline constexpr std::array<Bf16Arithmetic, 2> all_bf16_arithmetics{Bf16Arithmetic::fastest, Bf16Arithmetic::vdpbf16ps};

/// The word TAPEGRAD_BF16 takes for an arithmetic.
constexpr std::string_view bf16_arithmetic_name(Bf16Arithmetic arithmetic) {
    return arithmetic == Bf16Arithmetic::fastest ? "fastest" : "vdpbf16ps";
}

/// The arithmetic of the bfloat16 product: TAPEGRAD_BF16 when set and not empty (value_error for an
/// unknown word), else fastest.
Bf16Arithmetic bf16_arithmetic();
/// Switches every later bfloat16 product to `arithmetic`. Not to be called while kernels run on
/// other threads.
void set_bf16_arithmetic(Bf16Arithmetic arithmetic);
/// Whether the bfloat16 product runs widened to float32 now: fastest arithmetic, at a level
/// without vdpbf16ps.
inline bool bf16_products_widened() {
    return bf16_arithmetic() == Bf16Arithmetic::fastest && cpu_level() != CpuLevel::avx512_bf16;
}

/// float and double take the compiled kernels; any other scalar takes the header's generic loops.
template <class T>
inline constexpr bool has_compiled_kernels = std::is_same_v<T, double> || std::is_same_v<T, float>;

namespace kernels {
/// The three forms of a matrix product the VJPs need (autodiff/kernels.hpp says which is which).
enum class Form { ab, abT, aTb };
/// A block of C: rows [first_row, first_row + rows), columns [first_col, first_col + cols).
struct Block {
    std::size_t first_row, rows, first_col, cols;
};
/// An operand of the bfloat16 product: bfloat16 bit patterns (autodiff/low_precision.hpp), or
/// floats that the product rounds to bfloat16 (bfloat16_from_float) as it packs them, so that no
/// rounded copy of the whole operand is made first. Either way the product reads the same bfloat16.
class Bf16Operand {
public:
    Bf16Operand(const std::uint16_t* bits) : bits_(bits) {}  // NOLINT: either kind converts implicitly
    Bf16Operand(const float* floats) : floats_(floats) {}    // NOLINT
    const std::uint16_t* bits() const { return bits_; }      ///< null for floats
    const float* floats() const { return floats_; }          ///< null for bit patterns

private:
    const std::uint16_t* bits_ = nullptr;
    const float* floats_ = nullptr;
};
/// One block of C (m×n) = op(A)·op(B), or += when accumulate, for bfloat16 A and B (Bf16Operand)
/// and float32 C, in the arithmetic autodiff/kernels.hpp's gemm_bf16 defines; on the calling thread.
using Bf16GemmBlock = void (*)(Form form, std::size_t m, std::size_t n, std::size_t k, Bf16Operand A, Bf16Operand B,
                               float* C, bool accumulate, Block block);
/// x[0..n) rounded to bfloat16 into out[0..n) (bit patterns), to nearest even as
/// autodiff/low_precision.hpp's bfloat16_from_float rounds, the same bits at every level: the
/// copies fused_attention_bf16 rounds once per call and the widened product widens.
using RoundToBf16 = void (*)(const float* x, std::size_t n, std::uint16_t* out);
/// The place, in a table of another type, of a kernel only one type's table has (the bfloat16
/// product is float's: the double table has none to call).
struct Absent {};
}  // namespace kernels

/// The engine's kernels (products, the bfloat16 product and rounding, the tape's NaN scan, the dual planes),
/// compiled once per level for float and double: one table per level and type, filled by name
/// (src/cpu/level_kernels.hpp, with designated initializers, so two kernels of the same signature
/// cannot change places unnoticed).
/// The ops' own kernels (softmax rows, fused attention's rows, GELU) sit beside the ops, in
/// ops/fast/kernels.hpp: adding an op's kernel does not touch the engine.
template <class T>
struct EngineKernels {
    /// One block of C (m×n) = op(A)·op(B), or += when accumulate, on the calling thread.
    void (*gemm_block)(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C,
                       bool accumulate, kernels::Block block);
    /// Whether any of x[0..n) is NaN (the tape's check of every value and gradient it stores).
    bool (*any_nan)(const T* x, std::size_t n);
    /// n pairs (the value and tangent of n duals, autodiff/dual_kernels.hpp) into two planes,
    /// first[k] = pairs[2k], second[k] = pairs[2k + 1]; and back (or added to the pairs, when accumulate).
    void (*deinterleave)(const T* pairs, std::size_t n, T* first, T* second);
    void (*interleave)(const T* first, const T* second, std::size_t n, T* pairs, bool accumulate);
    /// float's table only: the bfloat16 product accumulated in float32 in vdpbf16ps's arithmetic
    /// (kernels::gemm_bf16 calls it unless it widens): the instruction at the avx512_bf16 level, its
    /// exact emulation at the others.
    std::conditional_t<std::is_same_v<T, float>, kernels::Bf16GemmBlock, kernels::Absent> gemm_bf16_block;
    /// float's table only: floats rounded to bfloat16 (the products' copies), vectorised per level.
    std::conditional_t<std::is_same_v<T, float>, kernels::RoundToBf16, kernels::Absent> round_to_bf16;
};

/// The engine kernels of the level running now (cpu_level()), for T = float or double.
template <class T>
const EngineKernels<T>& engine_kernels();
template <>
const EngineKernels<double>& engine_kernels<double>();
template <>
const EngineKernels<float>& engine_kernels<float>();

}  // namespace tapegrad
