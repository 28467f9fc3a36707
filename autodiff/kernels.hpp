/// \file
/// Dense kernels shared by the ops: matrix products in the three forms the matmul VJPs need
/// (A·B, A·Bᵀ, Aᵀ·B), without materialising a transpose. float and double go to the library's
/// compiled GEMM (Eigen's, compiled once per instruction-set level and chosen at run time:
/// autodiff/cpu.hpp); any other scalar (the 50-digit reference type) takes a plain loop ordered
/// for contiguous access. A large float/double product is split over the library's threads
/// (autodiff/parallel.hpp) into blocks of rows of C, or of columns when C has few rows; either way
/// each element comes out as one thread computes it (gemm says how). Products of dual matrices
/// (forward mode) are an overload in autodiff/dual_kernels.hpp, which includes this file: code that
/// calls kernels::gemm on any scalar (the ops) includes that one, so the dual overload is declared
/// wherever the call is.
/// gemm_bf16 is the bfloat16 product (A and B bfloat16, C float32), widened to float32 where the
/// CPU lacks vdpbf16ps, or in vdpbf16ps's arithmetic at every level (both defined below).
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/low_precision.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tensor.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tapegrad::kernels {

/// Products smaller than this many multiply-adds (about 45 µs of one core in float, 90 in double)
/// stay on the calling thread: a hand-over to the pool costs a few microseconds. At T = 1024 this
/// splits attention's projections X·W (1024×64×64) as well as its T×T products.
inline constexpr std::size_t parallel_madds = std::size_t{1} << 22;
/// Each thread gets at least this many rows of C, in a multiple of row_granule (see gemm).
inline constexpr std::size_t rows_per_thread = 64;
inline constexpr std::size_t row_granule = 16;
/// A large product with too few rows of C to split (fewer than 2·rows_per_thread: Qᵀ·dS, the
/// gradient of Kᵀ in attention, is d × T) is cut into blocks of this many columns instead, once
/// it has two of them.
inline constexpr std::size_t columns_per_block = 256;
/// Two independent products (a matmul's dA and dB) of which one cannot be split run side by side,
/// one per thread, from this many multiply-adds together (ops/matmul.hpp).
inline constexpr std::size_t side_by_side_madds = std::size_t{1} << 21;

/// How gemm cuts a product, C (m×n) summed over k, among the threads.
enum class Split { none, rows, columns };
inline Split split_of(std::size_t m, std::size_t n, std::size_t k) {
    if (m * n * k < parallel_madds) return Split::none;
    if (m >= 2 * rows_per_thread) return Split::rows;
    if (n >= 2 * columns_per_block) return Split::columns;
    return Split::none;
}

/// Calls product(block) for blocks of C (m×n, summed over k) that cover it once, on the library's
/// threads when the product is large (split_of): the one way gemm and gemm_bf16 share the work.
template <class Product>
void for_each_block(std::size_t m, std::size_t n, std::size_t k, const Product& product) {
    switch (split_of(m, n, k)) {
        case Split::rows: {
            // One row block per thread, each a multiple of row_granule rows long: Eigen's kernel
            // takes a row-major C's rows in panels of 4 and sums a leftover row differently, so
            // a row comes out the same in any block that starts at a multiple of 4 (at m = 300
            // cut at 150, 16 elements of the double product differed from one thread's in the
            // last bit). Then the blocks may follow the threads.
            const std::size_t workers = std::min<std::size_t>(thread_count(), m / rows_per_thread);
            const std::size_t rows = ((m + workers - 1) / workers + row_granule - 1) / row_granule * row_granule;
            parallel_for((m + rows - 1) / rows, [&](std::size_t w, unsigned) {
                product(Block{w * rows, std::min(rows, m - w * rows), 0, n});
            });
            break;
        }
        case Split::columns:
            // Column blocks, the same whatever the threads: a column's rounding depends on where
            // its block starts (Eigen's kernel takes a row-major C's columns in panels of several
            // widths, which sum in different orders), so the blocks must not move with the count.
            parallel_for((n + columns_per_block - 1) / columns_per_block, [&](std::size_t b, unsigned) {
                const std::size_t first = b * columns_per_block;
                product(Block{0, m, first, std::min(columns_per_block, n - first)});
            });
            break;
        case Split::none:
            product(Block{0, m, 0, n});
            break;
    }
}

/// c += a·b for the plain loops below: a scalar may give its own `multiply_add_in_place(c, a, b)`
/// (found by argument-dependent lookup), the same product rounded and then added, without a
/// temporary (the 50-digit intervals of autodiff/interval.hpp, whose every temporary is an
/// allocation).
template <class T>
void multiply_add(T& c, const T& a, const T& b) {
    if constexpr (requires { multiply_add_in_place(c, a, b); }) {
        multiply_add_in_place(c, a, b);
    } else {
        c += a * b;
    }
}

/// C (m×n) = op(A)·op(B) (accumulate == false) or C += op(A)·op(B), for row-major buffers.
/// ab:  A is m×k, B is k×n.   abT: A is m×k, B is n×k.   aTb: A is k×m, B is k×n.
template <Scalar T>
void gemm(Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C, bool accumulate) {
    if constexpr (has_compiled_kernels<T>) {
        for_each_block(m, n, k, [&](Block block) {
            engine_kernels<T>().gemm_block(form, m, n, k, A, B, C, accumulate, block);
        });
    } else {
        if (!accumulate) {
            for (std::size_t x = 0; x < m * n; ++x) C[x] = T(0);
        }
        switch (form) {
            case Form::ab:  // C[i,j] += A[i,p] B[p,j]: stream rows of B
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t p = 0; p < k; ++p) {
                        const T& a = A[i * k + p];
                        for (std::size_t j = 0; j < n; ++j) kernels::multiply_add(C[i * n + j], a, B[p * n + j]);
                    }
                break;
            case Form::abT:  // C[i,j] = row i of A · row j of B
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t j = 0; j < n; ++j) {
                        T dot(0);
                        for (std::size_t p = 0; p < k; ++p) kernels::multiply_add(dot, A[i * k + p], B[j * k + p]);
                        C[i * n + j] += dot;
                    }
                break;
            case Form::aTb:  // C[i,j] += A[p,i] B[p,j]: stream rows of A and B together
                for (std::size_t p = 0; p < k; ++p)
                    for (std::size_t i = 0; i < m; ++i) {
                        const T& a = A[p * m + i];
                        for (std::size_t j = 0; j < n; ++j) kernels::multiply_add(C[i * n + j], a, B[p * n + j]);
                    }
                break;
        }
    }
}

/// x[0..n) rounded to bfloat16 into out[0..n), as bfloat16_from_float (autodiff/low_precision.hpp)
/// rounds each, at the active CPU level (vectorised; the same bits at every level).
inline void round_to_bf16(const float* x, std::size_t n, std::uint16_t* out) {
    engine_kernels<float>().round_to_bf16(x, n, out);
}

namespace detail {
/// n elements of a bfloat16 operand as the floats they are: bit patterns widened (the high half of
/// a float's bits, exact); floats rounded to bfloat16 first, by the level's vectorised rounding
/// (rounding and widening in one loop here, compiled for the baseline level, took longer than the
/// two passes: bench_bf16, docs/performance.md, 2026-12-07, second session).
inline std::unique_ptr<float[]> widened_bf16(Bf16Operand x, std::size_t n) {
    std::unique_ptr<std::uint16_t[]> rounded;
    const std::uint16_t* bits = x.bits();
    if (bits == nullptr) {
        rounded = std::make_unique_for_overwrite<std::uint16_t[]>(n);
        round_to_bf16(x.floats(), n, rounded.get());
        bits = rounded.get();
    }
    std::unique_ptr<float[]> out = std::make_unique_for_overwrite<float[]>(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = float_from_bfloat16(bits[i]);
    return out;
}
}  // namespace detail

/// C (m×n) = op(A)·op(B) (accumulate == false) or C += op(A)·op(B), with A and B bfloat16 (bit
/// patterns: autodiff/low_precision.hpp's bfloat16_bits and bfloat16_value) and C float32, in the
/// forms and row-major shapes of gemm, at the active CPU level (autodiff/cpu.hpp), in one of two
/// arithmetics (Bf16Arithmetic, autodiff/cpu.hpp: TAPEGRAD_BF16 or set_bf16_arithmetic).
///
/// **Widened** (Bf16Arithmetic::fastest at a level without vdpbf16ps, the default there): A and B
/// widened to float32 (exactly) and multiplied by gemm<float> at that level, so every product a·b
/// is exact (8 + 8 significant bits in float's 24, the same exponent range) and only the sums round,
/// in the float32 kernel's order, to nearest, with IEEE 754's subnormals, infinities and NaN (no
/// DAZ, no FTZ). Bits as gemm<float>'s: the same on any number of threads, and different from
/// vdpbf16ps's and between levels (their kernels sum in different orders). The k products and C₀
/// (the C added to; 0 without accumulate, an exact start) are summed in some order by at most k
/// additions, each rounding relatively by at most 2⁻²⁴ (Higham's sum of any order), and a product
/// rounds only below float's normals, by at most 2⁻¹⁵⁰ (a sum landing there is exact), so
///   |C − (C₀ + Σ_p a_p·b_p)| ≤ γ_k·(|C₀| + Σ_p |a_p·b_p|) + k·2⁻¹⁴⁹,
/// which lies within the vdpbf16ps bound below (k ≤ s): what holds a product to that bound holds both.
///
/// **vdpbf16ps** (Bf16Arithmetic::vdpbf16ps, or fastest on the avx512_bf16 level): the arithmetic
/// of vdpbf16ps (Intel SDM vol. 2, VDPBF16PS, "Operation"), the same bits at every level (the
/// avx512_bf16 level runs the instruction, the others emulate it exactly, 18 to 30 times slower than
/// the widened path), on any number of threads and for any split of C, since each element is one
/// chain of roundings:
///   c ← C[i,j] when accumulate (a subnormal read as a zero of its sign), else +0;
///   for q = 0, 1, …, ⌈k/2⌉ − 1 (the pairs of k):  c ← step(c, a₂q₊₁, b₂q₊₁);  c ← step(c, a₂q, b₂q);
///   C[i,j] ← c;
/// with a_p = op(A)[i,p], b_p = op(B)[p,j], and a_k = b_k = +0 when k is odd (the last pair's
/// second half). Within a pair the second product comes first: the instruction adds the upper
/// halves of its 32-bit lanes first. step(c, a, b) is one float32 fused multiply-add:
///  - inputs: a bfloat16 subnormal, or a subnormal c, is read as a zero of its sign (DAZ);
///  - c + a·b computed exactly, rounded once to float32, to nearest, ties to even;
///  - a result whose rounded value (to 24 bits, exponent unbounded: tininess after rounding) is
///    below 2⁻¹²⁶ in magnitude becomes a zero of its sign (FTZ); an exact zero takes IEEE 754's sign
///    (+0 unless both c and a·b are −0); past the largest float it is ±inf;
///  - ±inf and NaN follow IEEE 754 (inf·0 and inf − inf give NaN, a NaN in gives NaN out); a NaN's
///    sign and payload are not promised, and may differ between levels (NaN is NaN everywhere).
/// The order, the rounding, DAZ and FTZ are the SDM's pseudo-code ("FP32 FMA with DAZ in, FTZ out
/// and RNE rounding"); tininess after rounding and the sign of a flushed zero were established on an
/// AMD Zen 4 (tests/test_bf16_kernels.cpp holds the instruction to the emulation on such inputs).
/// Error: each of the s = 2⌈k/2⌉ steps rounds once (relative 2⁻²⁴) or flushes (absolute < 2⁻¹²⁶), and
/// a subnormal C₀ (the C added to; 0 without accumulate) is read as 0, so for a finite result and
/// inputs without bfloat16 subnormals (whose products DAZ may drop whole)
///   |C − (C₀ + Σ_p a_p·b_p)| ≤ γ_s·(|C₀| + Σ_p |a_p·b_p|) + (s + 1)·2⁻¹²⁶,  γ_s = s·2⁻²⁴/(1 − s·2⁻²⁴).
/// A and B are bit patterns or floats (Bf16Operand): floats are rounded to bfloat16 as the product
/// packs them (or widens them), the same bits as a product of their rounded copies (round_to_bf16)
/// without making those copies.
inline void gemm_bf16(Form form, std::size_t m, std::size_t n, std::size_t k, Bf16Operand A, Bf16Operand B, float* C,
                      bool accumulate) {
    if (bf16_products_widened()) {
        // op(A) and op(B) hold m·k and k·n elements in every form.
        gemm<float>(form, m, n, k, detail::widened_bf16(A, m * k).get(), detail::widened_bf16(B, k * n).get(), C,
                    accumulate);
        return;
    }
    for_each_block(m, n, k, [&](Block block) {
        engine_kernels<float>().gemm_bf16_block(form, m, n, k, A, B, C, accumulate, block);
    });
}

}  // namespace tapegrad::kernels
