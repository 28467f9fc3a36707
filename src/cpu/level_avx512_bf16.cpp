// The kernels of the avx512_bf16 level: the avx512 level's table with the bfloat16 product run by
// vdpbf16ps (compiled with the avx512 flags and -mavx512bf16, set in CMakeLists.txt). Only the
// bfloat16 product is compiled here; every other kernel is the avx512 level's own code, reached
// through its table, so the two levels differ in that product alone (and give the same bits in it:
// src/cpu/bf16_product.hpp's emulation is exact). src/cpu/dispatch.cpp calls this table only when
// the CPU reports AVX512_BF16.
#include "src/cpu/bf16_product.hpp"
#include "src/cpu/kernel_table.hpp"

#include <immintrin.h>

#include <cstring>

namespace tapegrad::cpu_detail {
namespace {

// Tile rows × (16·V columns): rows·V accumulators of 16 floats in zmm registers, V loads of B
// and `rows` broadcasts of A's pairs per rows·V vdpbf16ps. Each accumulator lane is one element
// of C, its steps in the order of k. (x86-64 is little-endian: a pair read as 32 bits has its
// first element in the low half, as vdpbf16ps pairs them.)
template <std::size_t rows, std::size_t V>
void native_bf16_tile(std::size_t pairs, const Bf16Pairs& a, const std::uint16_t* b, float* C, std::size_t ldc,
                      bool start_from_zero) {
    __m512 acc[rows][V];
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t v = 0; v < V; ++v)
            acc[r][v] = start_from_zero ? _mm512_setzero_ps() : _mm512_loadu_ps(C + r * ldc + 16 * v);
    for (std::size_t q = 0; q < pairs; ++q, b += 32 * V) {
        __m512bh b_pairs[V];
        for (std::size_t v = 0; v < V; ++v) b_pairs[v] = __m512bh(_mm512_load_si512(b + 32 * v));
        for (std::size_t r = 0; r < rows; ++r) {
            std::uint32_t pair;
            std::memcpy(&pair, a.x + r * a.lane + q * a.pair, sizeof pair);
            const __m512bh a_pair = __m512bh(_mm512_set1_epi32(int(pair)));
            for (std::size_t v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_pair, b_pairs[v]);
        }
    }
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t v = 0; v < V; ++v) _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

// 8 rows × up to 48 columns: 24 accumulators of the 32 zmm registers, enough independent chains to
// cover the instruction's latency (about 6 cycles at one a cycle on Zen 4); a narrower last
// panel (16 or 32 columns) runs with 8 or 16.
struct NativeBf16Tile {
    static constexpr std::size_t rows = 8, vectors = 3;
    static void run(std::size_t pairs, const Bf16Pairs& a, const std::uint16_t* b, std::size_t v, float* C,
                    std::size_t ldc, bool start_from_zero) {
        switch (v) {
            case 1:
                native_bf16_tile<rows, 1>(pairs, a, b, C, ldc, start_from_zero);
                break;
            case 2:
                native_bf16_tile<rows, 2>(pairs, a, b, C, ldc, start_from_zero);
                break;
            default:
                native_bf16_tile<rows, 3>(pairs, a, b, C, ldc, start_from_zero);
                break;
        }
    }
};

}  // namespace
}  // namespace tapegrad::cpu_detail

extern "C" const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx512_bf16() {
    using namespace tapegrad::cpu_detail;
    static const KernelTable table = [] {
        KernelTable t = *tapegrad_kernels_avx512();
        t.level = tapegrad::CpuLevel::avx512_bf16;
        t.engine_f32.gemm_bf16_block = &gemm_bf16_block<NativeBf16Tile>;
        return t;
    }();
    return &table;
}
