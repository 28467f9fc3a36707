// fused_attention: attention as one op, O = softmax(Q·Kᵀ/√d + causal mask)·V, with a hand-derived
// VJP, that never stores the T×T score or weight matrices. It computes the same function as the
// composed graph softmax(mask(scale(matmul(Q, transpose(K)), 1/√d), M))·V (models/attention.hpp)
// and is held to the same values, gradients and tests; only its memory and time differ.
//   Q [..., Tq, d], K [..., Tk, d], V [..., Tk, r] -> O [..., Tq, r]   (rank 2, 3 or 4, same
//   leading dimensions: batch × heads), c = 1/√d applied inside.
//   causal: query i sees key j only when j <= query_offset + i (query_offset = keys already
//   cached before the first query). Row i always sees key 0, so no row is ever fully hidden and
//   every output row is a proper weighted mean of V's rows (no NaN, no all-zero convention needed).
//
// Forward, per query tile Q_i (rows) and key tiles K_j, V_j in order (an online softmax):
//   S = c·Q_i·K_jᵀ (hidden positions skipped), m' = max(m, rowmax S), α = exp(m − m'),
//   P = exp(S − m'), l = α·l + rowsum P, acc = α·acc + P·V_j, m = m'.
//   O_i = acc / l, and one log-sum-exp per row, L = m + log l, is saved: A_ij = exp(S_ij − L_i).
// So the op keeps O (its output) and L ([..., Tq]) only; S and A exist one tile at a time.
//
// VJP (G = dO = dJ/dO), recomputing P = exp(S − L) tile by tile from Q, K and L:
//   dV = Pᵀ·dO                   from O_il = Σ_j P_ij V_jl: ∂J/∂V_jl = Σ_i P_ij dO_il.
//   dP = dO·Vᵀ                   likewise ∂J/∂P_ij = Σ_l dO_il V_jl.
//   D_i = rowsum(dO_i ∘ O_i)     the softmax VJP's mean Σ_k P_ik dP_ik = Σ_l dO_il Σ_k P_ik V_kl
//                                = Σ_l dO_il O_il: one number per row, from O and dO alone.
//   dS = P ∘ (dP − D)            softmax's VJP, ∂P_ij/∂S_ik = P_ij(δ_jk − P_ik) (see ops/softmax.hpp);
//                                hidden positions have P = 0, so they get no gradient (ops/mask.hpp).
//   dQ = c·dS·K, dK = c·dSᵀ·Q    from S_ij = c·Σ_a Q_ia K_ja (ops/matmul.hpp, ops/scale.hpp).
// The tape calls vjp_all, one pass over key tiles that recomputes S and P once and forms dV, dP,
// dS, dK and dQ from them: 5 tile products per tile pair (S, dP, Pᵀ·dO, dSᵀ·Q, dS·K), 7 with the
// forward's 2 (three separate passes needed 8 in the backward). Each key tile's dK, dV rows are
// its own; dQ rows are summed over key tiles in key-tile order under a per-query-tile ticket, so
// the result does not depend on the thread count. `vjp` keeps the per-input passes (dQ over
// query tiles: S, dP, dS·K; dK over key tiles: S, dP, dSᵀ·Q; dV: S, Pᵀ·dO) for callers that want
// one gradient; both give the same gradients to rounding.
//
// Tiles: 128 query rows × 128 keys by default: with d = r = 64 in double, Q_i, K_j, V_j, dO_i and
// the accumulator are 64 KiB each and S, dP 128 KiB each, about 0.6 MiB per thread, inside one
// core's 1 MiB L2 on this machine (AMD EPYC Zen 5), and large enough that Eigen's GEMM runs near
// its peak on each tile product. Work items are (batch·head, tile) pairs handed out dynamically,
// so one head uses both cores. Extra memory beyond inputs, outputs and gradients: L and D (one
// number per query row) plus the per-thread tiles.
//
// Bad input: shapes that do not fit, a non-finite Q, K or V, or scores that overflow (|S| = inf)
// raise shape_error / value_error naming fused_attention and the shapes or values at fault.
#pragma once

#include "autodiff/checks.hpp"
#include "autodiff/kernels.hpp"
#include "autodiff/tape.hpp"

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

namespace tapegrad {

// Threads the fused op spreads its tiles over; 0 means one per hardware thread. Set it to 1 for
// single-threaded timing. Read at every forward and VJP call.
inline std::atomic<unsigned>& fused_attention_threads() {
    static std::atomic<unsigned> threads{0};
    return threads;
}

// Tile sizes (query rows × keys). Part of the node's settings, so tests can use tiny tiles to
// drive the online softmax through many tiles at small sizes under the 50-digit checker.
struct FusedAttentionTiles {
    std::size_t query = 128;
    std::size_t key = 128;
};

namespace fused_detail {

// The correct backward. The policy hooks exist so that tests can build deliberately broken
// variants of the op (fault controls) and show that the checker rejects them.
struct ExactBackward {
    static constexpr bool subtract_row_mean = true;  // the D term of dS = P ∘ (dP − D)
    // The saved log-sum-exp of a row from its running max m and sum l.
    template <Scalar T>
    static T log_sum_exp(const T& m, const T& l) {
        using std::log;
        return T(m + T(log(l)));
    }
};

// Runs work(item) for item in [0, count) on up to `threads` threads; rethrows the first error.
template <class Work>
void parallel_for(std::size_t count, unsigned threads, const Work& work) {
    threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::min<std::size_t>(count, 1024))));
    std::atomic<std::size_t> next{0};
    std::exception_ptr failure;
    std::mutex failure_mutex;
    const auto run = [&] {
        try {
            for (std::size_t item; (item = next++) < count;) work(item);
        } catch (...) {
            const std::lock_guard lock(failure_mutex);
            if (!failure) failure = std::current_exception();
            next = count;
        }
    };
    {
        std::vector<std::jthread> pool;
        for (unsigned t = 1; t < threads; ++t) pool.emplace_back(run);
        run();
    }
    if (failure) std::rethrow_exception(failure);
}

// Row kernels on one tile row. float and double go through Eigen's vectorised arrays (the
// elementwise work, exp above all, would otherwise rival the tile products); other scalars (the
// 50-digit reference type) take plain loops with the ADL functions of their own precision. Each
// computes the same expression, in the same order per element, as the composed graph's ops.
template <Scalar T>
inline constexpr bool vectorised = std::is_same_v<T, double> || std::is_same_v<T, float>;
template <Scalar T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <Scalar T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// x[k] = exp(x[k] − shift) for k < n.
template <Scalar T>
void exp_shifted(T* x, std::size_t n, const T& shift) {
    if constexpr (vectorised<T>) {
        ArrayMap<T> a(x, Eigen::Index(n));
        a = (a - shift).exp();
    } else {
        using std::exp;
        for (std::size_t k = 0; k < n; ++k) x[k] = exp(T(x[k] - shift));
    }
}

// x[k] = c·x[k] for k < n; returns the first k with a non-finite result, or n.
template <Scalar T>
std::size_t scale_checked(T* x, std::size_t n, const T& c) {
    if constexpr (vectorised<T>) {
        ArrayMap<T> a(x, Eigen::Index(n));
        a *= c;
        if (a.isFinite().all()) return n;
    } else {
        for (std::size_t k = 0; k < n; ++k) x[k] = T(c * x[k]);
    }
    for (std::size_t k = 0; k < n; ++k)
        if (!is_finite(x[k])) return k;
    return n;
}

// max(start, x[0..n)) and Σ x[0..n).
template <Scalar T>
T max_of(const T* x, std::size_t n, const T& start) {
    if constexpr (vectorised<T>) {
        return n == 0 ? start : std::max(start, ConstArrayMap<T>(x, Eigen::Index(n)).maxCoeff());
    } else {
        T best = start;
        for (std::size_t k = 0; k < n; ++k) best = std::max(best, x[k]);
        return best;
    }
}
template <Scalar T>
T sum_of(const T* x, std::size_t n) {
    if constexpr (vectorised<T>) {
        return ConstArrayMap<T>(x, Eigen::Index(n)).sum();
    } else {
        T total(0);
        for (std::size_t k = 0; k < n; ++k) total += x[k];
        return total;
    }
}

// p[k] = c·(p[k]·(dp[k] − mean)) for k < n: softmax's VJP, then the scale's.
template <Scalar T>
void score_gradient_row(T* p, const T* dp, std::size_t n, const T& mean, const T& c) {
    if constexpr (vectorised<T>) {
        ArrayMap<T> a(p, Eigen::Index(n));
        a = c * (a * (ConstArrayMap<T>(dp, Eigen::Index(n)) - mean));
    } else {
        for (std::size_t k = 0; k < n; ++k) p[k] = T(c * T(p[k] * T(dp[k] - mean)));
    }
}

// The sizes of one call, read from the inputs and the node's settings.
template <Scalar T>
struct Dims {
    std::size_t batch, Tq, Tk, d, r;
    bool causal;
    std::size_t offset;
    std::size_t tile_q, tile_k;
    T c;  // 1/√d, in T's own precision

    Dims(Inputs<T> in, const OpAttrs<T>& attrs)
        : batch(in[0]->shape().batch()),
          Tq(in[0]->rows()),
          Tk(in[1]->rows()),
          d(in[0]->cols()),
          r(in[2]->cols()),
          causal(attrs.ints.at(0) != 0),
          offset(static_cast<std::size_t>(attrs.ints.at(1))),
          tile_q(static_cast<std::size_t>(attrs.ints.at(2))),
          tile_k(static_cast<std::size_t>(attrs.ints.at(3))),
          c(inv_sqrt<T>(in[0]->cols())) {}

    std::size_t query_tiles() const { return (Tq + tile_q - 1) / tile_q; }
    std::size_t key_tiles() const { return (Tk + tile_k - 1) / tile_k; }
    // Keys query row i sees: [0, visible(i)).
    std::size_t visible(std::size_t i) const { return causal ? std::min(Tk, offset + i + 1) : Tk; }
    // Work large enough to be worth starting threads for (thread start costs ~20 µs).
    unsigned threads() const {
        const unsigned setting = fused_attention_threads().load();
        const unsigned available = setting ? setting : std::max(1u, std::thread::hardware_concurrency());
        const double madds = double(batch) * double(Tq) * double(Tk) * double(d + r);
        return madds < 1e6 ? 1u : available;
    }
};

// S = c·Q_i·K_jᵀ for query rows [i0, i0+bq) and keys [j0, j0+bk) of one head, checked finite on
// the visible part; returns, per row, how many of the tile's keys the row sees.
template <Scalar T>
void scores(const Dims<T>& dims, const T* Q, const T* K, std::size_t i0, std::size_t bq, std::size_t j0,
            std::size_t bk, std::vector<T>& S, std::vector<std::size_t>& seen) {
    S.resize(bq * bk);
    seen.resize(bq);
    kernels::gemm(kernels::Form::abT, bq, bk, dims.d, Q + i0 * dims.d, K + j0 * dims.d, S.data(), false);
    for (std::size_t i = 0; i < bq; ++i) {
        const std::size_t visible = dims.visible(i0 + i);
        seen[i] = visible <= j0 ? 0 : std::min(bk, visible - j0);
        T* row = S.data() + i * bk;
        const std::size_t j = scale_checked(row, seen[i], dims.c);
        if (j != seen[i]) {
            throw value_error(fmt::format(
                "fused_attention: score S = Q·Kᵀ/√d is {} at query {}, key {}; the scores must be finite "
                "(Q or K too large)",
                to_double(row[j]), i0 + i, j0 + j));
        }
    }
}

// Recomputes P = exp(S − L) on a tile (zero where hidden), from the saved log-sum-exp rows.
template <Scalar T>
void probabilities(const Dims<T>& dims, const T* Q, const T* K, const T* L, std::size_t i0, std::size_t bq,
                   std::size_t j0, std::size_t bk, std::vector<T>& P, std::vector<std::size_t>& seen) {
    scores(dims, Q, K, i0, bq, j0, bk, P, seen);
    for (std::size_t i = 0; i < bq; ++i) {
        T* row = P.data() + i * bk;
        exp_shifted(row, seen[i], L[i0 + i]);
        std::fill(row + seen[i], row + bk, T(0));
    }
}

// dS = P ∘ (dP − D) on a tile, times c (so dS·K and dSᵀ·Q are already dQ's and dK's terms);
// dP = dO_i·V_jᵀ. P is overwritten with c·dS.
template <class Policy, Scalar T>
void score_gradient(const Dims<T>& dims, const T* G, const T* V, const T* D, std::size_t i0, std::size_t bq,
                    std::size_t j0, std::size_t bk, std::vector<T>& P, std::vector<T>& dP) {
    dP.resize(bq * bk);
    kernels::gemm(kernels::Form::abT, bq, bk, dims.r, G + i0 * dims.r, V + j0 * dims.r, dP.data(), false);
    for (std::size_t i = 0; i < bq; ++i) {
        const T mean = Policy::subtract_row_mean ? D[i0 + i] : T(0);
        score_gradient_row(P.data() + i * bk, dP.data() + i * bk, bk, mean, dims.c);
    }
}

// First key tile a query tile sees none of (causal attention skips the tiles after it).
template <Scalar T>
std::size_t key_tile_end(const Dims<T>& dims, std::size_t i0, std::size_t bq) {
    const std::size_t keys = dims.visible(i0 + bq - 1);
    return (keys + dims.tile_k - 1) / dims.tile_k;
}

}  // namespace fused_detail

template <class Policy>
struct FusedAttentionOp {
    static constexpr std::string_view name = "fused_attention";

    // saved = L, the log-sum-exp of each query row's scores, shape [batch·Tq].
    template <Scalar T>
    static void forward(Inputs<T> in, const OpAttrs<T>& attrs, Tensor<T>& O, Tensor<T>& saved) {
        const fused_detail::Dims<T> dims(in, attrs);
        O.resize(in[0]->shape().with_matrix(dims.Tq, dims.r));
        saved.resize(Shape{dims.batch * dims.Tq});
        const std::size_t tiles = dims.query_tiles();
        fused_detail::parallel_for(dims.batch * tiles, dims.threads(), [&](std::size_t item) {
            using std::exp;
            const std::size_t b = item / tiles, i0 = (item % tiles) * dims.tile_q;
            const std::size_t bq = std::min(dims.tile_q, dims.Tq - i0);
            const T* Q = in[0]->data().data() + b * dims.Tq * dims.d;
            const T* K = in[1]->data().data() + b * dims.Tk * dims.d;
            const T* V = in[2]->data().data() + b * dims.Tk * dims.r;
            T* acc = O.data().data() + b * dims.Tq * dims.r + i0 * dims.r;  // accumulates in place
            T* L = saved.data().data() + b * dims.Tq;
            std::fill(acc, acc + bq * dims.r, T(0));
            std::vector<T> m(bq, -std::numeric_limits<T>::infinity()), l(bq, T(0)), S;
            std::vector<std::size_t> seen;
            const std::size_t end = fused_detail::key_tile_end(dims, i0, bq);
            for (std::size_t jt = 0; jt < end; ++jt) {
                const std::size_t j0 = jt * dims.tile_k, bk = std::min(dims.tile_k, dims.Tk - j0);
                fused_detail::scores(dims, Q, K, i0, bq, j0, bk, S, seen);
                for (std::size_t i = 0; i < bq; ++i) {
                    T* row = S.data() + i * bk;
                    if (seen[i] == 0) {  // this row sees none of these keys: P row = 0, nothing changes
                        std::fill(row, row + bk, T(0));
                        continue;
                    }
                    const T row_max = fused_detail::max_of(row, seen[i], m[i]);
                    fused_detail::exp_shifted(row, seen[i], row_max);
                    std::fill(row + seen[i], row + bk, T(0));
                    const T total = fused_detail::sum_of(row, seen[i]);
                    if (m[i] != row_max) {  // a larger maximum: rescale what was summed so far
                        if (l[i] != T(0)) {  // (nothing summed yet on the row's first visible tile)
                            const T alpha = exp(T(m[i] - row_max));
                            l[i] *= alpha;
                            for (std::size_t k = 0; k < dims.r; ++k) acc[i * dims.r + k] *= alpha;
                        }
                        m[i] = row_max;
                    }
                    l[i] += total;
                }
                kernels::gemm(kernels::Form::ab, bq, dims.r, bk, S.data(), V + j0 * dims.r, acc, true);
            }
            for (std::size_t i = 0; i < bq; ++i) {  // every row saw key 0, so l >= 1
                for (std::size_t k = 0; k < dims.r; ++k) acc[i * dims.r + k] /= l[i];
                L[i0 + i] = Policy::log_sum_exp(m[i], l[i]);
            }
        });
    }

    template <Scalar T>
    static void vjp(Inputs<T> in, const OpAttrs<T>& attrs, const Tensor<T>& O, const Tensor<T>& saved,
                    const Tensor<T>& G, std::size_t which, Tensor<T>& din) {
        const fused_detail::Dims<T> dims(in, attrs);
        // D_i = rowsum(dO_i ∘ O_i), one number per query row.
        std::vector<T> D(dims.batch * dims.Tq);
        for (std::size_t row = 0; row < D.size(); ++row) {
            T dot(0);
            for (std::size_t k = 0; k < dims.r; ++k) dot += G[row * dims.r + k] * O[row * dims.r + k];
            D[row] = dot;
        }
        const auto head = [&](std::size_t input, std::size_t b) {
            const Tensor<T>& x = *in[input];
            return x.data().data() + b * x.rows() * x.cols();
        };
        if (which == 0) {  // dQ_i = Σ_j c·dS_ij·K_j, one query tile per item
            const std::size_t tiles = dims.query_tiles();
            fused_detail::parallel_for(dims.batch * tiles, dims.threads(), [&](std::size_t item) {
                const std::size_t b = item / tiles, i0 = (item % tiles) * dims.tile_q;
                const std::size_t bq = std::min(dims.tile_q, dims.Tq - i0);
                T* dQ = din.data().data() + b * dims.Tq * dims.d + i0 * dims.d;
                std::fill(dQ, dQ + bq * dims.d, T(0));
                std::vector<T> P, dP;
                std::vector<std::size_t> seen;
                const std::size_t end = fused_detail::key_tile_end(dims, i0, bq);
                for (std::size_t jt = 0; jt < end; ++jt) {
                    const std::size_t j0 = jt * dims.tile_k, bk = std::min(dims.tile_k, dims.Tk - j0);
                    fused_detail::probabilities(dims, head(0, b), head(1, b), saved.data().data() + b * dims.Tq, i0,
                                                bq, j0, bk, P, seen);
                    fused_detail::score_gradient<Policy>(dims, G.data().data() + b * dims.Tq * dims.r, head(2, b),
                                                         D.data() + b * dims.Tq, i0, bq, j0, bk, P, dP);
                    kernels::gemm(kernels::Form::ab, bq, dims.d, bk, P.data(), head(1, b) + j0 * dims.d, dQ, true);
                }
            });
            return;
        }
        // dK_j = Σ_i c·dS_ijᵀ·Q_i and dV_j = Σ_i P_ijᵀ·dO_i, one key tile per item.
        const std::size_t tiles = dims.key_tiles();
        const std::size_t width = which == 1 ? dims.d : dims.r;
        fused_detail::parallel_for(dims.batch * tiles, dims.threads(), [&](std::size_t item) {
            const std::size_t b = item / tiles, j0 = (item % tiles) * dims.tile_k;
            const std::size_t bk = std::min(dims.tile_k, dims.Tk - j0);
            T* grad = din.data().data() + b * dims.Tk * width + j0 * width;
            std::fill(grad, grad + bk * width, T(0));
            std::vector<T> P, dP;
            std::vector<std::size_t> seen;
            // Causal: query row i sees key j0 once offset + i >= j0.
            const std::size_t first_row = dims.causal ? (j0 > dims.offset ? j0 - dims.offset : 0) : 0;
            for (std::size_t i0 = first_row / dims.tile_q * dims.tile_q; i0 < dims.Tq; i0 += dims.tile_q) {
                const std::size_t bq = std::min(dims.tile_q, dims.Tq - i0);
                fused_detail::probabilities(dims, head(0, b), head(1, b), saved.data().data() + b * dims.Tq, i0, bq,
                                            j0, bk, P, seen);
                const T* dO = G.data().data() + b * dims.Tq * dims.r + i0 * dims.r;
                if (which == 2) {
                    kernels::gemm(kernels::Form::aTb, bk, dims.r, bq, P.data(), dO, grad, true);
                } else {
                    fused_detail::score_gradient<Policy>(dims, G.data().data() + b * dims.Tq * dims.r, head(2, b),
                                                         D.data() + b * dims.Tq, i0, bq, j0, bk, P, dP);
                    kernels::gemm(kernels::Form::aTb, bk, dims.d, bq, P.data(), head(0, b) + i0 * dims.d, grad, true);
                }
            }
        });
    }

    // All requested gradients in one pass (the tape's path): per key tile K_j, V_j (one item), over
    // the query tiles that see it: P = exp(S − L), dV_j += Pᵀ·dO_i, dP = dO_i·V_jᵀ,
    // dS = c·P ∘ (dP − D), dK_j += dSᵀ·Q_i, dQ_i += dS·K_j. dK_j and dV_j belong to the item; dQ_i
    // receives every key tile's term, added strictly in key-tile order (a ticket per query tile),
    // so the sums are those of a single thread whatever the thread count, and no two threads add
    // into one dQ tile at once. Key tiles are handed out in order and every query tile is reached
    // by a prefix of the key tiles, so the lowest unfinished item never waits: no deadlock.
    template <Scalar T>
    static void vjp_all(Inputs<T> in, const OpAttrs<T>& attrs, const Tensor<T>& O, const Tensor<T>& saved,
                        const Tensor<T>& G, std::span<Tensor<T>* const> grads) {
        const fused_detail::Dims<T> dims(in, attrs);
        Tensor<T>* const dQ = grads[0];
        Tensor<T>* const dK = grads[1];
        Tensor<T>* const dV = grads[2];
        if (dQ == nullptr && dK == nullptr && dV == nullptr) return;
        const bool need_dS = dQ != nullptr || dK != nullptr;
        std::vector<T> D(need_dS ? dims.batch * dims.Tq : 0);
        for (std::size_t row = 0; row < D.size(); ++row) {  // D_i = rowsum(dO_i ∘ O_i), as in vjp
            T dot(0);
            for (std::size_t k = 0; k < dims.r; ++k) dot += G[row * dims.r + k] * O[row * dims.r + k];
            D[row] = dot;
        }
        if (dQ != nullptr) dQ->fill(T(0));
        const auto head = [&](std::size_t input, std::size_t b) {
            const Tensor<T>& x = *in[input];
            return x.data().data() + b * x.rows() * x.cols();
        };
        const std::size_t tiles = dims.key_tiles(), query_tiles = dims.query_tiles();
        // ticket[b·query_tiles + it]: the key tile whose dQ term query tile it takes next.
        std::vector<std::atomic<std::size_t>> ticket(dQ != nullptr ? dims.batch * query_tiles : 0);
        std::atomic<bool> failed{false};
        fused_detail::parallel_for(dims.batch * tiles, dims.threads(), [&](std::size_t item) {
            try {
                const std::size_t b = item / tiles, jt = item % tiles, j0 = jt * dims.tile_k;
                const std::size_t bk = std::min(dims.tile_k, dims.Tk - j0);
                T* const dK_j = dK ? dK->data().data() + b * dims.Tk * dims.d + j0 * dims.d : nullptr;
                T* const dV_j = dV ? dV->data().data() + b * dims.Tk * dims.r + j0 * dims.r : nullptr;
                if (dK_j) std::fill(dK_j, dK_j + bk * dims.d, T(0));
                if (dV_j) std::fill(dV_j, dV_j + bk * dims.r, T(0));
                std::vector<T> P, dP;
                std::vector<std::size_t> seen;
                const T* const Gb = G.data().data() + b * dims.Tq * dims.r;
                const std::size_t first_row = dims.causal ? (j0 > dims.offset ? j0 - dims.offset : 0) : 0;
                for (std::size_t i0 = first_row / dims.tile_q * dims.tile_q; i0 < dims.Tq; i0 += dims.tile_q) {
                    const std::size_t bq = std::min(dims.tile_q, dims.Tq - i0);
                    fused_detail::probabilities(dims, head(0, b), head(1, b), saved.data().data() + b * dims.Tq, i0,
                                                bq, j0, bk, P, seen);
                    if (dV_j) kernels::gemm(kernels::Form::aTb, bk, dims.r, bq, P.data(), Gb + i0 * dims.r, dV_j, true);
                    if (!need_dS) continue;
                    fused_detail::score_gradient<Policy>(dims, Gb, head(2, b), D.data() + b * dims.Tq, i0, bq, j0, bk,
                                                         P, dP);
                    if (dK_j) {
                        kernels::gemm(kernels::Form::aTb, bk, dims.d, bq, P.data(), head(0, b) + i0 * dims.d, dK_j,
                                      true);
                    }
                    if (dQ) {
                        std::atomic<std::size_t>& turn = ticket[b * query_tiles + i0 / dims.tile_q];
                        while (turn.load(std::memory_order_acquire) != jt) {
                            if (failed.load()) return;  // another item threw; its error is rethrown
                            std::this_thread::yield();
                        }
                        kernels::gemm(kernels::Form::ab, bq, dims.d, bk, P.data(), head(1, b) + j0 * dims.d,
                                      dQ->data().data() + b * dims.Tq * dims.d + i0 * dims.d, true);
                        turn.store(jt + 1, std::memory_order_release);
                    }
                }
            } catch (...) {
                failed = true;
                throw;
            }
        });
    }

    // Tile products of the tape's path (forward, and vjp_all's single backward pass: S, dP,
    // Pᵀ·dO, dSᵀ·Q, dS·K). A causal call does about half of this work.
    template <Scalar T>
    static OpCost cost(Inputs<T> in, const OpAttrs<T>& attrs) {
        const fused_detail::Dims<T> dims(in, attrs);
        const std::uint64_t pairs = std::uint64_t(dims.batch) * dims.Tq * dims.Tk;
        return {pairs * (dims.d + dims.r), pairs * (3 * dims.d + 2 * dims.r)};
    }
};

using FusedAttention = FusedAttentionOp<fused_detail::ExactBackward>;

// Checks shapes and values and records `Op` (FusedAttention, or a test's faulty variant).
template <class Op, Scalar T>
Var<T> record_fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, bool causal,
                              std::size_t query_offset, FusedAttentionTiles tiles = {}) {
    constexpr std::string_view op = "fused_attention";
    for (const auto& [argument, x] : {std::pair{"Q", Q}, std::pair{"K", K}, std::pair{"V", V}}) {
        checks::matrix(op, argument, x);
        if (x.shape().rank() > 4) {
            throw shape_error(fmt::format("fused_attention: {} must have rank 2, 3 or 4, got shape {}", argument,
                                          x.shape().to_string()));
        }
    }
    const Shape& q = Q.shape();
    const Shape& k = K.shape();
    const Shape& v = V.shape();
    if (!q.same_batch(k) || !k.same_batch(v)) {
        throw shape_error(fmt::format("fused_attention: Q, K and V need the same leading dimensions: Q is {}, K is {}, "
                                      "V is {}",
                                      q.to_string(), k.to_string(), v.to_string()));
    }
    if (q.cols() != k.cols()) {
        throw shape_error(fmt::format("fused_attention: queries and keys need one width d: Q is {}, K is {}",
                                      q.to_string(), k.to_string()));
    }
    if (k.rows() != v.rows()) {
        throw shape_error(
            fmt::format("fused_attention: one value per key: K is {}, V is {}", k.to_string(), v.to_string()));
    }
    if (tiles.query == 0 || tiles.key == 0) {
        throw value_error(fmt::format("fused_attention: tile sizes must be positive, got {}×{}", tiles.query,
                                      tiles.key));
    }
    if (query_offset > std::size_t(std::numeric_limits<std::int64_t>::max() / 2)) {
        throw value_error(fmt::format("fused_attention: query_offset {} is out of range", query_offset));
    }
    for (const auto& [argument, x] : {std::pair{"Q", Q}, std::pair{"K", K}, std::pair{"V", V}}) {
        const Tensor<T>& value = x.value();
        for (std::size_t i = 0; i < value.size(); ++i) {
            if (!is_finite(value[i])) {
                throw value_error(fmt::format("fused_attention: {} has the non-finite value {} at {} (shape {})",
                                              argument, to_double(value[i]), index_string(value.shape(), i),
                                              value.shape().to_string()));
            }
        }
    }
    return Q.tape().template record<Op>(
        {Q, K, V}, OpAttrs<T>{T(0),
                              {causal ? 1 : 0, static_cast<std::int64_t>(query_offset),
                               static_cast<std::int64_t>(tiles.query), static_cast<std::int64_t>(tiles.key)}});
}

// O = softmax(Q·Kᵀ/√d, causally masked when `causal`)·V as one op (see the top of this file).
template <Scalar T>
Var<T> fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, bool causal, std::size_t query_offset) {
    return record_fused_attention<FusedAttention>(Q, K, V, causal, query_offset);
}

// The same, with chosen tile sizes (tests use tiny tiles to cross many tile boundaries).
template <Scalar T>
Var<T> fused_attention(const Var<T>& Q, const Var<T>& K, const Var<T>& V, bool causal, std::size_t query_offset,
                       FusedAttentionTiles tiles) {
    return record_fused_attention<FusedAttention>(Q, K, V, causal, query_offset, tiles);
}

}  // namespace tapegrad
