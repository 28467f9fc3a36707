// The bfloat16 product's blocking, shared by every level (kernels::gemm_bf16, autodiff/kernels.hpp,
// defines its arithmetic): op(A) and op(B) as pairs of bfloat16 along k, the layout vdpbf16ps
// reads, and C cut into register tiles, each computed by a level's tile kernel: the exact
// emulation here (level_kernels.hpp, for baseline, avx2 and avx512) or vdpbf16ps
// (level_avx512_bf16.cpp). Every element of C is one chain of roundings in the order of k whatever
// the blocking, so the tiles, the cache blocks and the threads change no bit.
// Everything has internal linkage: each level's object keeps its own copy (CMakeLists.txt).
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/low_precision.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace tapegrad::cpu_detail {
namespace {

// Cache blocks, in pairs of k, rows and columns of C. A tile's A panel (its rows × the block's
// pairs) stays in L1 and its B panel (the pairs × its columns) in L2 while it runs; the packed B
// block is reused by every row block, and C is read and written once per block of pairs.
constexpr std::size_t bf16_block_pairs = 256, bf16_block_rows = 192, bf16_block_cols = 1024;

// An operand seen as lanes × k, the lanes being the rows of op(A) or the columns of op(B):
// element (l, p) at x[l * lane_stride + p * k_stride], one of the two strides 1. Src is the
// operand's element: bfloat16 bit patterns, or floats rounded as they are packed (round_run).
template <class Src>
struct Bf16Lanes {
    const Src* x;
    std::size_t lane_stride, k_stride;
};

template <class Src>
Bf16Lanes<Src> rows_of_a(kernels::Form form, std::size_t m, std::size_t k, const Src* A) {
    return form == kernels::Form::aTb ? Bf16Lanes<Src>{A, 1, m} : Bf16Lanes<Src>{A, k, 1};
}

template <class Src>
Bf16Lanes<Src> columns_of_b(kernels::Form form, std::size_t n, std::size_t k, const Src* B) {
    return form == kernels::Form::abT ? Bf16Lanes<Src>{B, k, 1} : Bf16Lanes<Src>{B, 1, n};
}

// Pairs as the tiles read them: pair q of lane l is the two bfloat16 at x[l * lane + q * pair]
// and the one after, element 2q first (the low half of a 32-bit lane of vdpbf16ps, on a
// little-endian machine), +0 for element k when k is odd.
struct Bf16Pairs {
    const std::uint16_t* x;
    std::size_t lane, pair;
};

// Stores a pair, `low` first in memory: as one 32-bit word on a little-endian machine, which lets
// the compiler vectorise the packing loops (two 16-bit stores apart would not).
inline void store_pair(std::uint16_t* to, std::uint16_t low, std::uint16_t high) {
    if constexpr (std::endian::native == std::endian::little) {
        const std::uint32_t word = low | (std::uint32_t(high) << 16);
        std::memcpy(to, &word, sizeof word);
    } else {
        to[0] = low;
        to[1] = high;
    }
}

// Two rows' lanes as pairs, to[2l] = even[l] and to[2l + 1] = odd[l] (+0 when odd is null), for l
// below Lanes when it is not 0 (a tile's rows, a panel's columns: a count known when compiling, so
// no loop and no remainder is left), else below `lanes`. The pointers never overlap (`to` is a
// packed block, the rows an operand): saying so spares the compiler a test for overlap at every
// call, and a row of zeros in place of a null `odd` leaves one loop to vectorise. At the 8 lanes of
// a tile's rows those tests and the loop cost more than the copying (perf).
template <std::size_t Lanes>
inline void interleave_pairs(const std::uint16_t* __restrict even, const std::uint16_t* __restrict odd,
                             std::uint16_t* __restrict to, std::size_t lanes) {
    if constexpr (Lanes == 0) {
        for (std::size_t l = 0; l < lanes; ++l) store_pair(to + 2 * l, even[l], odd == nullptr ? 0 : odd[l]);
    } else {
        static constexpr std::array<std::uint16_t, Lanes> zeros{};
        const std::uint16_t* __restrict high = odd == nullptr ? zeros.data() : odd;
        for (std::size_t l = 0; l < Lanes; ++l) store_pair(to + 2 * l, even[l], high[l]);
    }
}

// n floats rounded to bfloat16 (nearest even, bfloat16_from_float) into `to`: one plain loop, which
// the compiler vectorises at the level's width (rounding inside the packing loops, a pair at a
// time, ran at a fraction of that: perf, docs/performance.md, 2026-12-07, second session).
inline void round_run(const float* __restrict from, std::size_t n, std::uint16_t* __restrict to) {
    for (std::size_t e = 0; e < n; ++e) to[e] = bfloat16_from_float(from[e]);
}

// Bit patterns as they are, or a run of floats rounded into `rounded` first (n elements).
inline const std::uint16_t* bits_of_run(const std::uint16_t* x, std::size_t, std::uint16_t*) { return x; }
inline const std::uint16_t* bits_of_run(const float* x, std::size_t n, std::uint16_t* rounded) {
    round_run(x, n, rounded);
    return rounded;
}

constexpr std::size_t round_up(std::size_t x, std::size_t step) { return (x + step - 1) / step * step; }

// pack_bf16's loop for pairs whose halves lie in two rows (lane_stride 1): row by row across every
// panel, whole panels of Panel lanes interleaved with the count known when compiling, then the last
// panel when it is narrower, `last_width` wide.
template <std::size_t Panel, class Src>
void pack_two_rows(const Bf16Lanes<Src>& op, std::size_t first, std::size_t lanes, std::size_t last_width,
                   std::size_t q0, std::size_t pairs, std::size_t whole, std::uint16_t* out) {
    const std::size_t full = lanes / Panel * Panel;  // the lanes of the whole panels
    // Two rows of floats rounded (lanes <= a block's rows or columns).
    std::array<std::uint16_t, 2 * std::max(bf16_block_rows, bf16_block_cols)> rounded;
    for (std::size_t q = 0; q < pairs; ++q) {
        const Src* const even_row = op.x + 2 * (q0 + q) * op.k_stride + first;
        const std::uint16_t* even = bits_of_run(even_row, lanes, rounded.data());
        const std::uint16_t* odd =
            q < whole ? bits_of_run(even_row + op.k_stride, lanes, rounded.data() + lanes) : nullptr;
        for (std::size_t p = 0; p < full; p += Panel)
            interleave_pairs<Panel>(even + p, odd == nullptr ? nullptr : odd + p, out + 2 * (p * pairs + q * Panel),
                                    Panel);
        if (full < lanes) {
            interleave_pairs<0>(even + full, odd == nullptr ? nullptr : odd + full,
                                out + 2 * (full * pairs + q * last_width), lanes - full);
        }
    }
}

// Lanes [first, first + lanes) × pairs [q0, q0 + pairs) packed in panels of Panel lanes (a tile's
// rows, a panel's columns): panel p holds the lanes from first + p·Panel, its lane l's pair q at
// out + 2(p·Panel·pairs + q·width + l), width = min(Panel, the lanes left rounded up to `align`), and
// lanes past the operand's +0. Two loops, by where a pair's halves lie: side by side in a row
// (k_stride 1: each lane's pairs copied in order) or in two rows (lane_stride 1: the two rows
// interleaved, row by row across every panel, so that each row is read once and in order; a panel
// at a time, each row's cache lines were read again for every panel, and the packing took a third
// of Xᵀ·dY's time, perf).
template <std::size_t Panel, class Src>
void pack_bf16(const Bf16Lanes<Src>& op, std::size_t k, std::size_t first, std::size_t lanes, std::size_t align,
               std::size_t q0, std::size_t pairs, std::uint16_t* out) {
    const bool half_last = 2 * (q0 + pairs) > k;  // k odd, and its last pair among these
    const std::size_t whole = pairs - (half_last ? 1 : 0);
    const auto width_at = [&](std::size_t p) { return std::min(Panel, round_up(lanes - p, align)); };
    if (op.k_stride == 1) {
        std::array<std::uint16_t, 2 * bf16_block_pairs> rounded;  // a lane of floats rounded
        for (std::size_t l = 0; l < lanes; ++l) {
            const std::size_t p = l / Panel * Panel, width = width_at(p);
            std::uint16_t* const to = out + 2 * (p * pairs + l - p);
            const std::uint16_t* const from = bits_of_run(op.x + (first + l) * op.lane_stride + 2 * q0,
                                                          2 * whole + (half_last ? 1 : 0), rounded.data());
            for (std::size_t q = 0; q < whole; ++q) std::memcpy(to + 2 * q * width, from + 2 * q, 2 * sizeof *from);
            if (half_last) store_pair(to + 2 * whole * width, from[2 * whole], 0);
        }
    } else {
        pack_two_rows<Panel>(op, first, lanes, width_at(lanes / Panel * Panel), q0, pairs, whole, out);
    }
    for (std::size_t p = 0; p < lanes; p += Panel) {
        const std::size_t width = width_at(p), used = std::min(Panel, lanes - p);
        for (std::size_t q = 0; q < pairs && used < width; ++q)
            std::fill(out + 2 * (p * pairs + q * width + used), out + 2 * (p * pairs + (q + 1) * width), 0);
    }
}

// bfloat16 for a packed block, 64-byte aligned (a whole zmm register per load of B), left
// uninitialised: packing writes every element a tile reads.
class PackedBf16 {
public:
    explicit PackedBf16(std::size_t elements) : storage_(new std::uint16_t[elements + 32]) {}
    std::uint16_t* data() {
        const auto address = reinterpret_cast<std::uintptr_t>(storage_.get());
        return storage_.get() + (round_up(address, 64) - address) / sizeof(std::uint16_t);
    }

private:
    std::unique_ptr<std::uint16_t[]> storage_;
};

// A Tile computes Tile::rows rows of C by 16·v columns (v ≤ Tile::vectors: 16 floats a vector)
// over `pairs` pairs: run(pairs, a, b, v, C, ldc, start_from_zero), from +0 or from C's values,
// with a the rows' pairs and b packed (pair q of column c at b + 2(q·16v + c)). One tile of C: on
// C itself when whole, else on a full-size copy whose rows and columns past C's edge are dropped.
template <class Tile>
void bf16_tile(std::size_t pairs, const Bf16Pairs& a, const std::uint16_t* b, float* C, std::size_t ldc,
               std::size_t rows, std::size_t cols, bool start_from_zero) {
    const std::size_t vectors = (cols + 15) / 16, width = 16 * vectors;
    if (rows == Tile::rows && cols == width) {
        Tile::run(pairs, a, b, vectors, C, ldc, start_from_zero);
        return;
    }
    std::array<float, Tile::rows * Tile::vectors * 16> edge{};
    for (std::size_t r = 0; r < rows && !start_from_zero; ++r) std::copy_n(C + r * ldc, cols, edge.data() + r * width);
    Tile::run(pairs, a, b, vectors, edge.data(), width, start_from_zero);
    for (std::size_t r = 0; r < rows; ++r) std::copy_n(edge.data() + r * width, cols, C + r * ldc);
}

// Where a tile of rows [i, i + rows) finds its pairs [q0, q0 + pairs): in op(A) itself when each
// row's pairs lie side by side there as bit patterns and whole (k even) for all Tile::rows rows;
// for floats whose rows' pairs lie side by side, rounded into `packed` in the same layout (each row
// in one loop the compiler vectorises; +0 past k and in rows past the operand); else packed into
// `packed`.
template <class Tile, class Src>
Bf16Pairs rows_for_tile(const Bf16Lanes<Src>& a_rows, std::size_t k, std::size_t i, std::size_t rows, std::size_t q0,
                        std::size_t pairs, std::uint16_t* packed) {
    if constexpr (std::is_same_v<Src, std::uint16_t>) {
        if (a_rows.k_stride == 1 && k % 2 == 0 && rows == Tile::rows) {
            return {a_rows.x + i * a_rows.lane_stride + 2 * q0, a_rows.lane_stride, 2};
        }
    } else if (a_rows.k_stride == 1) {
        const std::size_t count = std::min(2 * pairs, k - 2 * q0);  // the elements this block reads per row
        for (std::size_t r = 0; r < Tile::rows; ++r) {
            std::uint16_t* const to = packed + 2 * r * pairs;
            const std::size_t written = r < rows ? count : 0;
            if (r < rows) round_run(a_rows.x + (i + r) * a_rows.lane_stride + 2 * q0, count, to);
            std::fill(to + written, to + 2 * pairs, std::uint16_t{0});
        }
        return {packed, 2 * pairs, 2};
    }
    pack_bf16<Tile::rows>(a_rows, k, i, rows, Tile::rows, q0, pairs, packed);
    return {packed, 2, 2 * Tile::rows};
}

// One block of C (rows × cols at C, leading dimension ldc) over pairs [q0, q0 + pairs): op(B)'s
// columns packed once into panels of Tile::vectors vectors (the last one narrower), then, row
// block by row block, the tiles, column panel by column panel down the row block.
template <class Tile, class SrcA, class SrcB>
void bf16_block(const Bf16Lanes<SrcA>& a_rows, const Bf16Lanes<SrcB>& b_cols, std::size_t k, std::size_t i0,
                std::size_t j0, std::size_t rows, std::size_t cols, std::size_t q0, std::size_t pairs, float* C,
                std::size_t ldc, bool start_from_zero, std::uint16_t* a, std::uint16_t* b) {
    constexpr std::size_t panel_cols = 16 * Tile::vectors;
    pack_bf16<panel_cols>(b_cols, k, j0, cols, 16, q0, pairs, b);
    std::array<Bf16Pairs, round_up(bf16_block_rows, Tile::rows) / Tile::rows> row_pairs;
    for (std::size_t i = 0; i < rows; i += bf16_block_rows) {
        const std::size_t block_rows = std::min(bf16_block_rows, rows - i);
        // Rows whose pairs lie in two rows of A are packed for every tile at once (pack_bf16).
        const bool interleaved = a_rows.k_stride != 1;
        if (interleaved) pack_bf16<Tile::rows>(a_rows, k, i0 + i, block_rows, Tile::rows, q0, pairs, a);
        for (std::size_t r = 0; r < block_rows; r += Tile::rows) {
            row_pairs[r / Tile::rows] =
                interleaved ? Bf16Pairs{a + 2 * r * pairs, 2, 2 * Tile::rows}
                            : rows_for_tile<Tile>(a_rows, k, i0 + i + r, std::min(Tile::rows, block_rows - r), q0,
                                                  pairs, a + 2 * r * pairs);
        }
        for (std::size_t j = 0; j < cols; j += panel_cols)
            for (std::size_t r = 0; r < block_rows; r += Tile::rows) {
                bf16_tile<Tile>(pairs, row_pairs[r / Tile::rows], b + 2 * j * pairs, C + (i + r) * ldc + j, ldc,
                                std::min(Tile::rows, block_rows - r), std::min(panel_cols, cols - j), start_from_zero);
            }
    }
}

// gemm_bf16_block for operands of elements SrcA and SrcB: C's block cut into blocks of columns
// and of pairs of k (each pair block continuing from the C the previous one left), each computed
// by bf16_block.
template <class Tile, class SrcA, class SrcB>
void gemm_bf16_block_of(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const SrcA* A, const SrcB* B,
                        float* C, bool accumulate, kernels::Block block) {
    if (k == 0) {  // no step: C stays, or is +0
        for (std::size_t i = block.first_row; i < block.first_row + block.rows && !accumulate; ++i)
            std::fill_n(C + i * n + block.first_col, block.cols, 0.0f);
        return;
    }
    const auto a_rows = rows_of_a(form, m, k, A);
    const auto b_cols = columns_of_b(form, n, k, B);
    const std::size_t all_pairs = (k + 1) / 2, most_pairs = std::min(bf16_block_pairs, all_pairs);
    PackedBf16 a(2 * round_up(std::min(bf16_block_rows, block.rows), Tile::rows) * most_pairs);
    PackedBf16 b(2 * round_up(std::min(bf16_block_cols, block.cols), 16 * Tile::vectors) * most_pairs);
    for (std::size_t j = 0; j < block.cols; j += bf16_block_cols)
        for (std::size_t q0 = 0; q0 < all_pairs; q0 += bf16_block_pairs) {
            const std::size_t cols = std::min(bf16_block_cols, block.cols - j),
                              pairs = std::min(bf16_block_pairs, all_pairs - q0);
            bf16_block<Tile>(a_rows, b_cols, k, block.first_row, block.first_col + j, block.rows, cols, q0, pairs,
                             C + block.first_row * n + block.first_col + j, n, q0 == 0 && !accumulate, a.data(),
                             b.data());
        }
}

// The block kernel of EngineKernels<float>::gemm_bf16_block for a level's Tile: each operand's
// kind (bit patterns, or floats rounded as they are packed) chooses gemm_bf16_block_of's.
template <class Tile>
void gemm_bf16_block(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, kernels::Bf16Operand A,
                     kernels::Bf16Operand B, float* C, bool accumulate, kernels::Block block) {
    const auto with_a = [&](const auto* a) {
        if (B.bits() != nullptr) {
            gemm_bf16_block_of<Tile>(form, m, n, k, a, B.bits(), C, accumulate, block);
        } else {
            gemm_bf16_block_of<Tile>(form, m, n, k, a, B.floats(), C, accumulate, block);
        }
    };
    if (A.bits() != nullptr) {
        with_a(A.bits());
    } else {
        with_a(A.floats());
    }
}

// ---- The emulation (levels without AVX512_BF16) ------------------------------------------------

// A step's exact result below this in magnitude is flushed: the midpoint of 2⁻¹²⁶ and the number
// below it at 24 bits (2⁻¹²⁶ − 2⁻¹⁵⁰), which rounds (ties to even) to 2⁻¹²⁶; below it a sum rounds,
// at 24 bits with an unbounded exponent, below 2⁻¹²⁶ (tiny after rounding).
constexpr double bf16_flush_below = 0x1p-126 - 0x1p-151;

// One step, c + a·b, as vdpbf16ps computes it, for c, a and b free of subnormals (the chain's
// values are flushed, C's are read through bf16_read_c, a and b through bf16_float). a·b is exact
// in double (8-bit significands), and the sum's rounding to double followed by the rounding to
// float is its rounding to float: double rounding is innocuous for a sum of two 24-bit numbers in
// 53 bits (53 ≥ 2·24 + 2, Figueroa 1995), and a double sum of these never underflows. Below
// bf16_flush_below the result is a zero of the sum's sign; in [bf16_flush_below, 2⁻¹²⁶) the
// conversion's own rounding gives 2⁻¹²⁶, as the 24-bit rounding does.
inline float bf16_step(float c, float a, float b) {
    const double sum = double(c) + double(a) * double(b);
    const float rounded = float(sum);
    return std::fabs(sum) < bf16_flush_below ? std::copysign(0.0f, rounded) : rounded;
}

inline float bf16_read_c(float c) { return std::fpclassify(c) == FP_SUBNORMAL ? std::copysign(0.0f, c) : c; }

// A bfloat16 as a float, a subnormal as a zero of its sign (vdpbf16ps's DAZ).
inline float bf16_float(std::uint16_t bits) {
    const std::uint32_t high = std::uint32_t(bits) << 16;
    return std::bit_cast<float>((high & 0x7f800000u) == 0 ? high & 0x80000000u : high);
}

// The emulated tile: 4 rows × 16 columns, plain loops over the columns, which the compiler
// vectorises at each level's width (the steps of one element stay in order: only elements run
// side by side).
struct EmulatedBf16Tile {
    static constexpr std::size_t rows = 4, vectors = 1, cols = 16;
    static void run(std::size_t pairs, const Bf16Pairs& a, const std::uint16_t* b, std::size_t, float* C,
                    std::size_t ldc, bool start_from_zero) {
        std::array<float, rows * cols> acc{};
        for (std::size_t r = 0; r < rows && !start_from_zero; ++r)
            for (std::size_t c = 0; c < cols; ++c) acc[r * cols + c] = bf16_read_c(C[r * ldc + c]);
        for (std::size_t q = 0; q < pairs; ++q, b += 2 * cols)
            for (std::size_t r = 0; r < rows; ++r) {
                const std::uint16_t* pair = a.x + r * a.lane + q * a.pair;
                const float a_low = bf16_float(pair[0]), a_high = bf16_float(pair[1]);
                for (std::size_t c = 0; c < cols; ++c) {
                    float& sum = acc[r * cols + c];
                    sum = bf16_step(bf16_step(sum, a_high, bf16_float(b[2 * c + 1])), a_low, bf16_float(b[2 * c]));
                }
            }
        for (std::size_t r = 0; r < rows; ++r) std::copy_n(acc.data() + r * cols, cols, C + r * ldc);
    }
};

}  // namespace
}  // namespace tapegrad::cpu_detail
