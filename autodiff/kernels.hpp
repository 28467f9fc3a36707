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
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tensor.hpp"

#include <algorithm>
#include <cstddef>

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

/// C (m×n) = op(A)·op(B) (accumulate == false) or C += op(A)·op(B), for row-major buffers.
/// ab:  A is m×k, B is k×n.   abT: A is m×k, B is n×k.   aTb: A is k×m, B is k×n.
template <Scalar T>
void gemm(Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C, bool accumulate) {
    if constexpr (has_compiled_kernels<T>) {
        const auto product = [&](Block block) {
            engine_kernels<T>().gemm_block(form, m, n, k, A, B, C, accumulate, block);
        };
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
                    product({w * rows, std::min(rows, m - w * rows), 0, n});
                });
                break;
            }
            case Split::columns:
                // Column blocks, the same whatever the threads: a column's rounding depends on where
                // its block starts (Eigen's kernel takes a row-major C's columns in panels of several
                // widths, which sum in different orders), so the blocks must not move with the count.
                parallel_for((n + columns_per_block - 1) / columns_per_block, [&](std::size_t b, unsigned) {
                    const std::size_t first = b * columns_per_block;
                    product({0, m, first, std::min(columns_per_block, n - first)});
                });
                break;
            case Split::none:
                product({0, m, 0, n});
                break;
        }
    } else {
        if (!accumulate) {
            for (std::size_t x = 0; x < m * n; ++x) C[x] = T(0);
        }
        switch (form) {
            case Form::ab:  // C[i,j] += A[i,p] B[p,j]: stream rows of B
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t p = 0; p < k; ++p) {
                        const T a = A[i * k + p];
                        for (std::size_t j = 0; j < n; ++j) C[i * n + j] += a * B[p * n + j];
                    }
                break;
            case Form::abT:  // C[i,j] = row i of A · row j of B
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t j = 0; j < n; ++j) {
                        T dot(0);
                        for (std::size_t p = 0; p < k; ++p) dot += A[i * k + p] * B[j * k + p];
                        C[i * n + j] += dot;
                    }
                break;
            case Form::aTb:  // C[i,j] += A[p,i] B[p,j]: stream rows of A and B together
                for (std::size_t p = 0; p < k; ++p)
                    for (std::size_t i = 0; i < m; ++i) {
                        const T a = A[p * m + i];
                        for (std::size_t j = 0; j < n; ++j) C[i * n + j] += a * B[p * n + j];
                    }
                break;
        }
    }
}

}  // namespace tapegrad::kernels
