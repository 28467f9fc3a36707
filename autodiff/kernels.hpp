/// \file
/// Dense kernels shared by the ops: matrix products in the three forms the matmul VJPs need
/// (A·B, A·Bᵀ, Aᵀ·B), without materialising a transpose. float and double go to the library's
/// compiled GEMM (Eigen's, compiled once per instruction-set level and chosen at run time:
/// autodiff/cpu.hpp); any other scalar (the 50-digit reference type) takes a plain loop ordered
/// for contiguous access. A large float/double product is split by rows of C over the library's
/// threads (autodiff/parallel.hpp); each row of C is computed by one thread as it would be by a
/// single one. Products of dual matrices (forward mode) are an overload in autodiff/dual_kernels.hpp,
/// which includes this file: code that calls kernels::gemm on any scalar (the ops) includes that one,
/// so the dual overload is declared wherever the call is.
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tensor.hpp"

#include <algorithm>
#include <cstddef>

namespace tapegrad::kernels {

/// Products smaller than this many multiply-adds (about 0.2 ms of one core) stay on the calling
/// thread. Set when every parallel_for started its threads (tens of microseconds); the pool now
/// wakes a sleeping worker in a few (autodiff/parallel.hpp), so a lower threshold may pay: not yet
/// re-measured. Each thread gets at least 64 rows of C.
inline constexpr std::size_t parallel_madds = std::size_t{1} << 23;
inline constexpr std::size_t rows_per_thread = 64;

/// C (m×n) = op(A)·op(B) (accumulate == false) or C += op(A)·op(B), for row-major buffers.
/// ab:  A is m×k, B is k×n.   abT: A is m×k, B is n×k.   aTb: A is k×m, B is k×n.
template <Scalar T>
void gemm(Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C, bool accumulate) {
    if constexpr (has_compiled_kernels<T>) {
        const std::size_t workers = m * n * k < parallel_madds
                                        ? 1
                                        : std::min<std::size_t>(thread_count(), std::max<std::size_t>(1, m / rows_per_thread));
        if (workers <= 1) {
            engine_kernels<T>().gemm_rows(form, m, n, k, A, B, C, accumulate, 0, m);
            return;
        }
        // Rows [first, first + block) of C: each thread writes its own rows.
        const std::size_t block = (m + workers - 1) / workers;
        parallel_for((m + block - 1) / block, [&](std::size_t w, unsigned) {
            const std::size_t first = w * block;
            engine_kernels<T>().gemm_rows(form, m, n, k, A, B, C, accumulate, first, std::min(block, m - first));
        });
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
