/// \file
/// fused_attention: attention as one op, O = softmax(Q·Kᵀ/√d + causal mask)·V, with a hand-derived
/// VJP, that never stores the T×T score or weight matrices. It computes the same function as the
/// composed graph softmax(mask(scale(matmul(Q, transpose(K)), 1/√d), M))·V (models/attention.hpp)
/// and is held to the same values, gradients and tests; only its memory and time differ.
///   Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r] -> O [..., Tq, r]   (rank 2, 3 or 4, same
///   leading dimensions: batch × heads), c = 1/√d applied inside.
///   settings.pattern (ops/attention_pattern.hpp, the description the composed path reads too):
///   causal: query i sees key j only when j <= query_offset + i (query_offset = keys already
///   cached before the first query). Row i always sees key 0 (with a window, its own position), so
///   no row is ever fully hidden and every output row is a proper weighted mean of V's rows (no
///   NaN, no all-zero convention needed).
///   window w (causal only): query i, at absolute position p = query_offset + i, sees keys
///   p − w < j <= p; the block must lie within the keys (query_offset + Tq <= Tk), so each row
///   still sees its own position. Key tiles outside every row's window are skipped, so time is
///   O(Tq·w·d) rather than O(Tq·Tk·d).
///   alibi_heads H (ALiBi, ops/alibi.hpp): S_ij gains the constant −m_h·|p − j| of the query's head
///   h (the dimension before [Tq, d] must be H), at the query's absolute position, causal or not.
///   A constant added to S leaves every formula below as it is: dS is the same expression, and no
///   gradient flows into the bias.
///
/// Forward, per query tile Q_i (rows) and key tiles K_j, V_j in order (an online softmax):
///   S = c·Q_i·K_jᵀ (hidden positions skipped), m' = max(m, rowmax S), α = exp(m − m'),
///   P = exp(S − m'), l = α·l + rowsum P, acc = α·acc + P·V_j, m = m'.
///   O_i = acc / l, and one log-sum-exp per row, L = m + log l, is saved: A_ij = exp(S_ij − L_i).
/// So the op keeps O (its output) and L ([..., Tq]) only; S and A exist one tile at a time.
///
/// VJP (G = dO = dJ/dO), recomputing P = exp(S − L) tile by tile from Q, K and L:
///   dV = Pᵀ·dO                   from O_il = Σ_j P_ij V_jl: ∂J/∂V_jl = Σ_i P_ij dO_il.
///   dP = dO·Vᵀ                   likewise ∂J/∂P_ij = Σ_l dO_il V_jl.
///   D_i = rowsum(dO_i ∘ O_i)     the softmax VJP's mean Σ_k P_ik dP_ik = Σ_l dO_il Σ_k P_ik V_kl
///                                = Σ_l dO_il O_il: one number per row, from O and dO alone.
///   dS = P ∘ (dP − D)            softmax's VJP, ∂P_ij/∂S_ik = P_ij(δ_jk − P_ik) (see ops/softmax.hpp);
///                                hidden positions have P = 0, so they get no gradient (ops/mask.hpp).
///   dQ = c·dS·K, dK = c·dSᵀ·Q    from S_ij = c·Σ_a Q_ia K_ja (ops/matmul.hpp, ops/scale.hpp).
/// One pass over key tiles recomputes S and P once and forms dV, dP, dS, dK and dQ from them: 5
/// tile products per tile pair (S, dP, Pᵀ·dO, dSᵀ·Q, dS·K), 7 with the forward's 2. Each key
/// tile's dK, dV rows are its own; dQ rows are summed over key tiles in key-tile order under a
/// per-query-tile ticket, so the result does not depend on the thread count.
///
/// Tiles: 128 query rows × 128 keys by default: with d = r = 64 in double, Q_i, K_j, V_j, dO_i and
/// the accumulator are 64 KiB each and S, dP 128 KiB each, about 0.6 MiB per thread, sized for a
/// core with at least 1 MiB of L2, and large enough that Eigen's GEMM runs near its peak on each
/// tile product. Work items are (batch·head, tile) pairs handed out dynamically by
/// tapegrad::parallel_for, so one head uses every core. Extra memory beyond inputs, outputs and
/// gradients: L and D (one number per query row) plus the per-thread tiles.
///
/// Bad input: shapes that do not fit, a non-finite Q, K or V, or scores that overflow (|S| = inf)
/// raise shape_error / value_error naming fused_attention and the shapes or values at fault.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/dual_kernels.hpp"
#include "autodiff/kernels.hpp"
#include "autodiff/low_precision.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tape.hpp"
#include "ops/attention_pattern.hpp"
#include "ops/checks.hpp"
#include "ops/fast/fused_attention_rows.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tapegrad {

/// Tile sizes (query rows × keys). Part of the node's settings, so tests can use tiny tiles to
/// drive the online softmax through many tiles at small sizes under the 50-digit checker.
struct FusedAttentionTiles {
    std::size_t query = 128;
    std::size_t key = 128;
    static constexpr auto fields(auto& self) { return std::tuple{field("query", self.query), field("key", self.key)}; }
};

struct FusedAttention {
    static constexpr std::string_view name = "fused_attention";
    static constexpr Arity arity{3};
    using hooks_of = FusedAttention;  ///< the one-pass vjp_all below

    struct Settings {
        AttentionPattern pattern{};  ///< which keys each row sees, and the bias (ops/attention_pattern.hpp)
        FusedAttentionTiles tiles{};
    };
    /// The pattern's fields at the top level (a saved tape's "causal", "query_offset", ...), then the tiles.
    static constexpr auto fields(auto& s) {
        return std::tuple_cat(AttentionPattern::fields(s.pattern), std::tuple{field("tiles", s.tiles)});
    }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return fused_attention(in[0], in[1], in[2], s);
    }

    /// O, and saved = L, the log-sum-exp of each query row's scores, shape [batch·Tq].
    template <Scalar T>
    static void forward(const Settings& settings, Inputs<T> in, Tensor<T>& O, Tensor<T>& saved);

    /// dQ, dK and dV (those requested) in one pass over the key tiles.
    template <Scalar T>
    static void vjp_all(const Settings& settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads);

    /// Tile products of the forward and of vjp_all's single pass (S, dP, Pᵀ·dO, dSᵀ·Q, dS·K), over
    /// min(Tk, window) keys per query. A causal call does about half of this work.
    template <Scalar T>
    static OpCost cost(const Settings& settings, Inputs<T> in);
};

namespace fused_detail {

/// A tile product's operand: its values, and the same values rounded to bfloat16 where the call
/// rounded them ahead (bfloat16 tile products: Q, K, V and dO once per call, dS once per tile;
/// Dims::read_once), null where the product rounds them as it packs them (P, read once).
template <Scalar T>
struct Operand {
    const T* values;
    const std::uint16_t* bf16 = nullptr;
    /// The operand from element `offset` on.
    Operand at(std::size_t offset) const { return {values + offset, bf16 == nullptr ? nullptr : bf16 + offset}; }
};

/// The sizes of one call, from the node's settings and its inputs.
template <Scalar T>
struct Dims {
    std::size_t batch, Tq, Tk, d, r;
    AttentionPattern pattern;    ///< which keys each row sees, and the bias
    std::size_t tile_q, tile_k;
    T c;                         ///< 1/√d, in T's own precision
    std::vector<double> slopes;  ///< ALiBi's m_h per head (empty: no bias)
    std::string_view op;         ///< the op's name, for its errors
    ProductPrecision products;   ///< what the tile products read (fused_attention_bf16's float path: bfloat16)

    Dims(const FusedAttention::Settings& settings, Inputs<T> in, std::string_view op_name = FusedAttention::name,
         ProductPrecision tile_products = ProductPrecision::tape)
        : batch(in[0]->shape().batch()),
          Tq(in[0]->rows()),
          Tk(in[1]->rows()),
          d(in[0]->cols()),
          r(in[2]->cols()),
          pattern(settings.pattern),
          tile_q(settings.tiles.query),
          tile_k(settings.tiles.key),
          c(inv_sqrt<T>(in[0]->cols())),
          slopes(settings.pattern.slopes()),
          op(op_name),
          products(tile_products) {}

    /// Whether the tile products read bfloat16 (fused_attention_bf16 on a float tape).
    bool bf16_products() const { return std::is_same_v<T, float> && products == ProductPrecision::bfloat16; }

    /// A tile product C (+)= op(A)·op(B): in T, or, under bfloat16 tile products, A and B read in
    /// bfloat16 (their rounded copies, or their floats rounded as the product packs them) and
    /// summed in float32 as matmul_bf16 reads and sums (kernels::gemm_bf16).
    void product(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, Operand<T> A, Operand<T> B, T* C,
                 bool accumulate) const {
        if constexpr (std::is_same_v<T, float>) {
            if (bf16_products()) {
                kernels::gemm_bf16(form, m, n, k, bf16_operand(A), bf16_operand(B), C, accumulate);
                return;
            }
        }
        kernels::gemm(form, m, n, k, A.values, B.values, C, accumulate);
    }

    /// x[0, n) as the tile products read it: under bfloat16 tile products rounded once here into
    /// `rounded`, so that no product reading it rounds it again; else as it is.
    Operand<T> read_once(const T* x, std::size_t n, std::vector<std::uint16_t>& rounded) const {
        if constexpr (std::is_same_v<T, float>) {
            if (bf16_products()) {
                rounded.resize(n);
                kernels::round_to_bf16(x, n, rounded.data());
                return {x, rounded.data()};
            }
        }
        return {x};
    }

    /// A float operand as the bfloat16 product reads it: its rounded copy, else its floats.
    static kernels::Bf16Operand bf16_operand(const Operand<float>& x) {
        return x.bf16 != nullptr ? kernels::Bf16Operand(x.bf16) : kernels::Bf16Operand(x.values);
    }

    std::size_t query_tiles() const { return (Tq + tile_q - 1) / tile_q; }
    std::size_t key_tiles() const { return (Tk + tile_k - 1) / tile_k; }
    /// Keys query row i sees: [first_visible(i), visible(i)), the pattern's (one interval per row,
    /// both bounds growing with i by at most one).
    std::size_t visible(std::size_t i) const { return pattern.end_key(i, Tk); }
    std::size_t first_visible(std::size_t i) const { return pattern.first_key(i); }
    /// The key tiles query rows [i0, i0 + bq) see are [key_tile_begin(i0), key_tile_end(i0, bq)).
    std::size_t key_tile_begin(std::size_t i0) const { return first_visible(i0) / tile_k; }
    std::size_t key_tile_end(std::size_t i0, std::size_t bq) const {
        return (visible(i0 + bq - 1) + tile_k - 1) / tile_k;
    }
    /// The first row of the first query tile that sees key j0 (causal: row i sees it once
    /// offset + i >= j0). The query tiles that see a key tile are the ones from here on while
    /// sees_keys_before holds.
    std::size_t first_query_tile(std::size_t j0) const {
        const std::size_t first_row = pattern.causal && j0 > pattern.query_offset ? j0 - pattern.query_offset : 0;
        return first_row / tile_q * tile_q;
    }
    /// Whether query rows from i0 on see any key before j_end (a window hides the early keys from
    /// late rows): the query tiles a key tile reaches, with first_query_tile.
    bool sees_keys_before(std::size_t i0, std::size_t j_end) const { return first_visible(i0) < j_end; }
    /// ALiBi's bias of head b's query row i and key j, in T (only with ALiBi: slopes not empty).
    T bias(std::size_t b, std::size_t i, std::size_t j) const {
        return T(pattern.bias(slopes[b % slopes.size()], i, j));
    }
    /// Head b's block of a tensor that holds one block per head (Q, K, V, O, dO, their gradients, L).
    template <class Values>
    auto head(Values& x, std::size_t b) const {
        return x.data().data() + b * (x.size() / batch);
    }
    /// Head b's block of an input of `size` elements, as the tile products read it.
    Operand<T> head(const Operand<T>& x, std::size_t size, std::size_t b) const { return x.at(b * (size / batch)); }
    /// Small work (under 1e6 multiply-adds) stays on one thread: set when starting threads cost
    /// ~20 µs a call; waking the pool's workers costs a few µs (not yet re-measured here).
    /// 0 lets parallel_for use the library's threads setting.
    unsigned max_threads() const {
        const double madds = double(batch) * double(Tq) * double(Tk) * double(d + r);
        return madds < 1e6 ? 1u : 0u;
    }
};

/// The call's inputs as its tile products read them: Q, K, V (and dO in the VJP), each rounded to
/// bfloat16 once for the whole call under bfloat16 tile products (Dims::read_once), else as they are.
template <Scalar T>
class ProductInputs {
public:
    ProductInputs(const Dims<T>& dims, std::initializer_list<const Tensor<T>*> inputs) : dims_(dims) {
        for (const Tensor<T>* x : inputs) {
            sizes_[count_] = x->size();
            all_[count_] = dims.read_once(x->data().data(), x->size(), rounded_[count_]);
            ++count_;
        }
    }
    ProductInputs(const ProductInputs&) = delete;  // all_ points into rounded_
    ProductInputs& operator=(const ProductInputs&) = delete;
    /// Head b's block of input `which` (0 Q, 1 K, 2 V, 3 dO).
    Operand<T> head(std::size_t which, std::size_t b) const { return dims_.head(all_[which], sizes_[which], b); }

private:
    const Dims<T>& dims_;
    std::size_t count_ = 0;
    std::array<std::size_t, 4> sizes_{};
    std::array<Operand<T>, 4> all_{};
    std::array<std::vector<std::uint16_t>, 4> rounded_;
};

/// The keys of a tile a query row sees: tile columns [first, first + count).
struct SeenKeys {
    std::size_t first = 0, count = 0;
};

/// S = c·Q_i·K_jᵀ (+ ALiBi's bias) for query rows [i0, i0+bq) and keys [j0, j0+bk) of head b,
/// checked finite on the visible part; `seen` gets, per row, the tile's keys the row sees.
template <Scalar T>
void scores(const Dims<T>& dims, std::size_t b, Operand<T> Q, Operand<T> K, std::size_t i0, std::size_t bq,
            std::size_t j0, std::size_t bk, std::vector<T>& S, std::vector<SeenKeys>& seen) {
    S.resize(bq * bk);
    seen.resize(bq);
    dims.product(kernels::Form::abT, bq, bk, dims.d, Q.at(i0 * dims.d), K.at(j0 * dims.d), S.data(), false);
    for (std::size_t i = 0; i < bq; ++i) {
        const std::size_t lo = std::clamp(dims.first_visible(i0 + i), j0, j0 + bk);
        const std::size_t hi = std::clamp(dims.visible(i0 + i), lo, j0 + bk);
        seen[i] = {lo - j0, hi - lo};
        T* row = S.data() + i * bk + seen[i].first;
        const std::size_t j = scale_checked(row, seen[i].count, dims.c);
        if (j != seen[i].count) {
            throw value_error(fmt::format(
                "{}: score S = Q·Kᵀ/√d is {} at query {}, key {}; the scores must be finite (Q or K too large)",
                dims.op, to_double(row[j]), i0 + i, lo + j));
        }
        if (!dims.slopes.empty()) {
            for (std::size_t k = 0; k < seen[i].count; ++k) row[k] += dims.bias(b, i0 + i, lo + k);
        }
    }
}

/// Zeroes a tile row outside the keys it sees.
template <Scalar T>
void hide_unseen(T* row, std::size_t bk, SeenKeys seen) {
    std::fill(row, row + seen.first, T(0));
    std::fill(row + seen.first + seen.count, row + bk, T(0));
}

/// One row of the online softmax on one key tile. `row` holds the row's scores (visible where
/// `seen` says) and is left holding P = exp(S − m') (0 where hidden) for the product P·V_j; the
/// running max m, sum l and the row's accumulator acc (r values) are brought up to date.
template <Scalar T>
void online_softmax_step(T* row, std::size_t bk, SeenKeys seen, T& m, T& l, T* acc, std::size_t r) {
    using std::exp;
    hide_unseen(row, bk, seen);
    if (seen.count == 0) return;  // this row sees none of these keys: P row = 0, nothing changes
    T* const visible = row + seen.first;
    const T row_max = max_of(visible, seen.count, m);
    exp_shifted(visible, seen.count, row_max);
    const T total = sum_of(visible, seen.count);
    if (m != row_max) {   // a larger maximum: rescale what was summed so far
        if (l != T(0)) {  // (nothing summed yet on the row's first visible tile)
            const T alpha = exp(T(m - row_max));
            l *= alpha;
            for (std::size_t k = 0; k < r; ++k) acc[k] *= alpha;
        }
        m = row_max;
    }
    l += total;
}

/// The forward of query rows [i0, i0 + tile) of head b: their rows of O (accumulated in place)
/// and their log-sum-exps L.
template <Scalar T>
void attend_query_tile(const Dims<T>& dims, std::size_t b, Operand<T> Q, Operand<T> K, Operand<T> V, std::size_t i0,
                       T* O, T* L) {
    using std::log;
    const std::size_t bq = std::min(dims.tile_q, dims.Tq - i0);
    T* const acc = O + i0 * dims.r;
    std::fill(acc, acc + bq * dims.r, T(0));
    std::vector<T> m(bq, -std::numeric_limits<T>::infinity()), l(bq, T(0)), S;
    std::vector<SeenKeys> seen;
    const std::size_t end = dims.key_tile_end(i0, bq);
    for (std::size_t jt = dims.key_tile_begin(i0); jt < end; ++jt) {
        const std::size_t j0 = jt * dims.tile_k, bk = std::min(dims.tile_k, dims.Tk - j0);
        scores(dims, b, Q, K, i0, bq, j0, bk, S, seen);
        for (std::size_t i = 0; i < bq; ++i) {
            online_softmax_step(S.data() + i * bk, bk, seen[i], m[i], l[i], acc + i * dims.r, dims.r);
        }
        dims.product(kernels::Form::ab, bq, dims.r, bk, {S.data()}, V.at(j0 * dims.r), acc, true);
    }
    for (std::size_t i = 0; i < bq; ++i) {  // every row saw a key (its largest score gave 1), so l >= 1
        for (std::size_t k = 0; k < dims.r; ++k) acc[i * dims.r + k] /= l[i];
        L[i0 + i] = T(m[i] + T(log(l[i])));
    }
}

/// Recomputes P = exp(S − L) on a tile (zero where hidden), from head b's saved log-sum-exps.
template <Scalar T>
void probabilities(const Dims<T>& dims, std::size_t b, Operand<T> Q, Operand<T> K, const T* L, std::size_t i0,
                   std::size_t bq, std::size_t j0, std::size_t bk, std::vector<T>& P, std::vector<SeenKeys>& seen) {
    scores(dims, b, Q, K, i0, bq, j0, bk, P, seen);
    for (std::size_t i = 0; i < bq; ++i) {
        T* row = P.data() + i * bk;
        exp_shifted(row + seen[i].first, seen[i].count, L[i0 + i]);
        hide_unseen(row, bk, seen[i]);
    }
}

/// D_i = rowsum(dO_i ∘ O_i) for every query row of every head (rows of r values).
template <Scalar T>
std::vector<T> softmax_row_means(const Tensor<T>& dO, const Tensor<T>& O, std::size_t r) {
    std::vector<T> D(O.size() / r);
    for (std::size_t row = 0; row < D.size(); ++row) {
        T dot(0);
        for (std::size_t k = 0; k < r; ++k) dot += dO[row * r + k] * O[row * r + k];
        D[row] = dot;
    }
    return D;
}

/// c·dS = c·P ∘ (dP − D) on a tile (so dS·K and dSᵀ·Q are already dQ's and dK's terms), with
/// dP = dO_i·V_jᵀ; dO, V and D are one head's. P is overwritten with c·dS.
template <Scalar T>
void score_gradient(const Dims<T>& dims, Operand<T> dO, Operand<T> V, const T* D, std::size_t i0, std::size_t bq,
                    std::size_t j0, std::size_t bk, std::vector<T>& P, std::vector<T>& dP) {
    dP.resize(bq * bk);
    dims.product(kernels::Form::abT, bq, bk, dims.r, dO.at(i0 * dims.r), V.at(j0 * dims.r), dP.data(), false);
    for (std::size_t i = 0; i < bq; ++i) {
        score_gradient_row(P.data() + i * bk, dP.data() + i * bk, bk, D[i0 + i], dims.c);
    }
}

/// A turn's top bit: an item failed, so no item waits for its turn any more (stop_turns).
inline constexpr std::size_t turn_failed = std::size_t{1} << (std::numeric_limits<std::size_t>::digits - 1);

/// Runs `add` once `turn` reaches `mine` (every earlier key tile has added its term), then passes
/// the turn on. The wait sleeps (std::atomic::wait) rather than spins: with more threads than
/// cores, a spinning waiter would hold the core the item it waits for needs. Returns false, adding
/// nothing, when another item failed while this one waited.
template <class Add>
bool add_in_turn(std::atomic<std::size_t>& turn, std::size_t mine, const Add& add) {
    for (std::size_t now = turn.load(std::memory_order_acquire); now != mine; now = turn.load(std::memory_order_acquire)) {
        if ((now & turn_failed) != 0) return false;  // that item's error is rethrown by parallel_for
        turn.wait(now, std::memory_order_acquire);
    }
    add();
    turn.fetch_add(1, std::memory_order_release);  // an addition, so a turn_failed set meanwhile stays
    turn.notify_all();
    return true;
}

/// After an item failed: wakes every item waiting for a turn, and keeps any from waiting again.
inline void stop_turns(std::span<std::atomic<std::size_t>> turns) {
    for (std::atomic<std::size_t>& turn : turns) {
        turn.fetch_or(turn_failed, std::memory_order_release);
        turn.notify_all();
    }
}

/// The forward of every head and query tile: O, and L in `saved` (FusedAttention::forward).
template <Scalar T>
void attend(const Dims<T>& dims, Inputs<T> in, Tensor<T>& O, Tensor<T>& saved) {
    O.resize(in[0]->shape().with_matrix(dims.Tq, dims.r));
    saved.resize(Shape{dims.batch * dims.Tq});
    const std::size_t tiles = dims.query_tiles();
    const ProductInputs<T> inputs(dims, {in[0], in[1], in[2]});
    parallel_for(
        dims.batch * tiles,
        [&](std::size_t item, unsigned) {
            const std::size_t b = item / tiles, i0 = (item % tiles) * dims.tile_q;
            attend_query_tile(dims, b, inputs.head(0, b), inputs.head(1, b), inputs.head(2, b), i0, dims.head(O, b),
                              dims.head(saved, b));
        },
        dims.max_threads());
}

/// One item per key tile K_j, V_j, over the query tiles that see it: P = exp(S − L),
/// dV_j += Pᵀ·dO_i, dP = dO_i·V_jᵀ, dS = c·P ∘ (dP − D), dK_j += dSᵀ·Q_i, dQ_i += dS·K_j. dK_j and
/// dV_j belong to the item; dQ_i receives every key tile's term, added strictly in key-tile order (a
/// ticket per query tile), so the sums are those of a single thread whatever the thread count, and
/// no two threads add into one dQ tile at once. No deadlock: key tiles are handed out in order and
/// the key tiles that reach a query tile are a prefix (Dims::first_query_tile), so the lowest
/// unfinished item never waits; on one thread the items run in that order. (With a window, the key
/// tiles that reach a query tile are a run starting at key_tile_begin, where its ticket starts.)
template <Scalar T>
void backward(const Dims<T>& dims, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
    Tensor<T>* const dQ = grads[0];
    Tensor<T>* const dK = grads[1];
    Tensor<T>* const dV = grads[2];
    if (dQ == nullptr && dK == nullptr && dV == nullptr) return;
    const bool need_dS = dQ != nullptr || dK != nullptr;
    const std::vector<T> D = need_dS ? softmax_row_means(at.G, at.out, dims.r) : std::vector<T>{};
    if (dQ != nullptr) dQ->fill(T(0));
    const std::size_t tiles = dims.key_tiles(), query_tiles = dims.query_tiles();
    // ticket[b·query_tiles + it]: the key tile whose dQ term query tile it takes next.
    std::vector<std::atomic<std::size_t>> ticket(dQ != nullptr ? dims.batch * query_tiles : 0);
    for (std::size_t t = 0; t < ticket.size(); ++t) ticket[t] = dims.key_tile_begin(t % query_tiles * dims.tile_q);
    const ProductInputs<T> inputs(dims, {at.in[0], at.in[1], at.in[2], &at.G});
    const auto key_tile = [&](std::size_t b, std::size_t jt) {
        const std::size_t j0 = jt * dims.tile_k, bk = std::min(dims.tile_k, dims.Tk - j0);
        const Operand<T> Q = inputs.head(0, b), K = inputs.head(1, b), V = inputs.head(2, b), dO = inputs.head(3, b);
        const T* const L = dims.head(at.saved, b);
        T* const dK_j = dK ? dims.head(*dK, b) + j0 * dims.d : nullptr;
        T* const dV_j = dV ? dims.head(*dV, b) + j0 * dims.r : nullptr;
        if (dK_j) std::fill(dK_j, dK_j + bk * dims.d, T(0));
        if (dV_j) std::fill(dV_j, dV_j + bk * dims.r, T(0));
        std::vector<T> P, dP;
        std::vector<std::uint16_t> rounded_dS;
        std::vector<SeenKeys> seen;
        for (std::size_t i0 = dims.first_query_tile(j0); i0 < dims.Tq && dims.sees_keys_before(i0, j0 + bk);
             i0 += dims.tile_q) {
            const std::size_t bq = std::min(dims.tile_q, dims.Tq - i0);
            probabilities(dims, b, Q, K, L, i0, bq, j0, bk, P, seen);
            if (dV_j) dims.product(kernels::Form::aTb, bk, dims.r, bq, {P.data()}, dO.at(i0 * dims.r), dV_j, true);
            if (!need_dS) continue;
            score_gradient(dims, dO, V, D.data() + b * dims.Tq, i0, bq, j0, bk, P, dP);
            const Operand<T> dS = dims.read_once(P.data(), bq * bk, rounded_dS);  // P now holds c·dS
            if (dK_j) dims.product(kernels::Form::aTb, bk, dims.d, bq, dS, Q.at(i0 * dims.d), dK_j, true);
            if (dQ == nullptr) continue;
            const auto add_dQ = [&] {
                dims.product(kernels::Form::ab, bq, dims.d, bk, dS, K.at(j0 * dims.d), dims.head(*dQ, b) + i0 * dims.d,
                             true);
            };
            if (!add_in_turn(ticket[b * query_tiles + i0 / dims.tile_q], jt, add_dQ)) return;
        }
    };
    parallel_for(
        dims.batch * tiles,
        [&](std::size_t item, unsigned) {
            try {
                key_tile(item / tiles, item % tiles);
            } catch (...) {
                stop_turns(ticket);
                throw;
            }
        },
        dims.max_threads());
}

}  // namespace fused_detail

template <Scalar T>
void FusedAttention::forward(const Settings& settings, Inputs<T> in, Tensor<T>& O, Tensor<T>& saved) {
    fused_detail::attend(fused_detail::Dims<T>(settings, in), in, O, saved);
}

template <Scalar T>
void FusedAttention::vjp_all(const Settings& settings, const VjpArgs<T>& at, std::span<Tensor<T>* const> grads) {
    fused_detail::backward(fused_detail::Dims<T>(settings, at.in), at, grads);
}

template <Scalar T>
OpCost FusedAttention::cost(const Settings& settings, Inputs<T> in) {
    const fused_detail::Dims<T> dims(settings, in);
    const std::uint64_t keys = dims.pattern.window != 0 ? std::min(dims.Tk, dims.pattern.window) : dims.Tk;
    const std::uint64_t pairs = std::uint64_t(dims.batch) * dims.Tq * keys;
    return {pairs * (dims.d + dims.r), pairs * (3 * dims.d + 2 * dims.r)};
}

namespace fused_detail {

/// The settings' own checks: positive tiles, the pattern's rules (AttentionPattern::check), ALiBi's
/// heads the dimension before [Tq, d].
template <Scalar T>
void check_settings(std::string_view op, const FusedAttention::Settings& s, const Var<T>& Q, const Var<T>& K) {
    if (s.tiles.query == 0 || s.tiles.key == 0) {
        throw value_error(fmt::format("{}: tile sizes must be positive, got {}×{}", op, s.tiles.query, s.tiles.key));
    }
    s.pattern.check(op, Q.shape().rows(), K.shape().rows());
    const Shape& q = Q.shape();
    const std::size_t H = s.pattern.alibi_heads;
    if (H != 0 && (q.rank() < 3 || q[q.rank() - 3] != H)) {
        throw shape_error(
            fmt::format("{}: ALiBi over {} heads needs Q as [..., {}, Tq, d], got {}", op, H, H, q.to_string()));
    }
}

/// fused_attention's checks of shapes, settings and values, its errors naming `op` (the op the
/// call records: fused_attention, or fused_attention_bf16 under the bfloat16 policy).
template <Scalar T>
void check_call(std::string_view op, const Var<T>& Q, const Var<T>& K, const Var<T>& V,
                const FusedAttention::Settings& settings) {
    checks::attention_inputs(op, Q, K, V);
    for (const auto& [argument, x] : {std::pair{"Q", Q}, std::pair{"K", K}, std::pair{"V", V}}) {
        if (x.shape().rank() > 4) {
            throw shape_error(
                fmt::format("{}: {} must have rank 2, 3 or 4, got shape {}", op, argument, x.shape().to_string()));
        }
    }
    check_settings(op, settings, Q, K);
    for (const auto& [argument, x] : {std::pair{"Q", Q}, std::pair{"K", K}, std::pair{"V", V}}) {
        const Tensor<T>& value = x.value();
        const std::size_t i = first_not_finite(value.data().data(), value.size());
        if (i != value.size()) {
            throw value_error(fmt::format("{}: {} has the non-finite value {} at {} (shape {})", op, argument,
                                          to_double(value[i]), index_string(value.shape(), i),
                                          value.shape().to_string()));
        }
    }
}

}  // namespace fused_detail

/// Checks shapes, settings and values and records `Op` (FusedAttention, or a test's faulty variant).
template <class Op, Scalar T>
Var<T> record_fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V,
                              const FusedAttention::Settings& settings) {
    fused_detail::check_call(FusedAttention::name, Q, K, V, settings);
    return Q.tape().template record<Op>({Q, K, V}, settings);
}

template <Scalar T>
Var<T> fused_attention_bf16(const Var<T>& Q, const Var<T>& K, const Var<T>& V,
                            const FusedAttention::Settings& settings);  // ops/fused_attention_bf16.hpp

/// Every setting at once: a sliding window, ALiBi's bias, e.g.
/// fused_attention(Q, K, V, {.pattern = {.causal = true, .window = 256, .alibi_heads = 8}}).
/// On a float tape whose products are bfloat16 (Tape::set_product_precision), fused_attention_bf16.
template <Scalar T>
Var<T> fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, const FusedAttention::Settings& settings) {
    if constexpr (std::is_same_v<T, float>) {
        if (Q.valid() && Q.tape().product_precision() == ProductPrecision::bfloat16) {
            return fused_attention_bf16(Q, K, V, settings);
        }
    }
    return record_fused_attention<FusedAttention>(Q, K, V, settings);
}

/// O = softmax(Q·Kᵀ/√d, causally masked when `causal`)·V as one op (see the top of this file).
template <Scalar T>
Var<T> fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, bool causal, std::size_t query_offset) {
    return fused_attention(Q, K, V, {.pattern = {.causal = causal, .query_offset = query_offset}});
}

/// The same, with chosen tile sizes (tests use tiny tiles to cross many tile boundaries).
template <Scalar T>
Var<T> fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, bool causal, std::size_t query_offset,
                       FusedAttentionTiles tiles) {
    return fused_attention(Q, K, V, {.pattern = {.causal = causal, .query_offset = query_offset}, .tiles = tiles});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> fused_attention<T>(const Var<T>&, const Var<T>&, const Var<T>&, bool, std::size_t); \
    TAPEGRAD_INSTANCE Var<T> fused_attention<T>(const Var<T>&, const Var<T>&, const Var<T>&, bool, std::size_t, FusedAttentionTiles); \
    TAPEGRAD_INSTANCE Var<T> fused_attention<T>(const Var<T>&, const Var<T>&, const Var<T>&, const FusedAttention::Settings&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
