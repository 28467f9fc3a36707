// The lean tape: clear() keeps every node's buffers for the next graph (no allocation when the
// same graph is recorded again), and so does a new tape made after one died; the backward's
// scratch buffers stay few; reused tapes give bit-identical gradients, leaves copied from a
// reference keep the source intact, and Tape::replay's incremental updates (MatMul::update,
// Softmax::update, which the checker's finite differences run on) agree with a full recompute.
#define BOOST_TEST_MODULE tape_reuse
#include "support.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <optional>
#include <vector>

using namespace tapegrad;

namespace {
// Every allocation of this executable is counted, and the bytes it holds, to see what a tape
// allocates, reuses and keeps.
std::atomic<std::size_t> allocations{0};
std::atomic<long long> live_bytes{0};
}  // namespace

// Each block carries its size in front of it, so that both forms of delete take off what new added:
// Clang 14 does not enable sized deallocation by default, and std::allocator then calls the
// unsized form. Not inlined: GCC would otherwise see a `new` met by `free` at each call and warn of
// a mismatch.
namespace {
constexpr std::size_t size_header = alignof(std::max_align_t);

void release(void* p) noexcept {
    if (p == nullptr) return;
    void* const block = static_cast<std::byte*>(p) - size_header;
    live_bytes -= static_cast<long long>(*static_cast<std::size_t*>(block));
    std::free(block);
}
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t bytes) {
    ++allocations;
    if (void* const block = std::malloc(size_header + bytes)) {
        *static_cast<std::size_t*>(block) = bytes;
        live_bytes += static_cast<long long>(bytes);
        return static_cast<std::byte*>(block) + size_header;
    }
    throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { release(p); }
[[gnu::noinline]] void operator delete(void* p) noexcept { release(p); }

namespace {

struct Leaves {
    Tensor<double> X, W_Q, W_K, W_V;
};

Leaves random_leaves(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    return {testing::random_tensor({T, D}, rng), testing::random_tensor({D, d}, rng),
            testing::random_tensor({D, d}, rng), testing::random_tensor({D, d}, rng)};
}

template <Scalar T>
std::array<Tensor<T>, 4> cast(const Leaves& in) {
    return {tensor_cast<T>(in.X), tensor_cast<T>(in.W_Q), tensor_cast<T>(in.W_K), tensor_cast<T>(in.W_V)};
}

// Records J = probe(attention(...)); leaves are copied from `in` (the reference overload).
template <Scalar T>
Var<T> record_attention(Tape<T>& tape, const std::array<Tensor<T>, 4>& in, std::array<Var<T>, 4>& leaves,
                        Var<T>* weights = nullptr) {
    leaves = {tape.leaf(in[0], "X"), tape.leaf(in[1], "W_Q"), tape.leaf(in[2], "W_K"), tape.leaf(in[3], "W_V")};
    const AttentionResult<T> result = attention(leaves[0], leaves[1], leaves[2], leaves[3]);
    if (weights != nullptr) *weights = result.A;
    return testing::probe(result.O);
}

}  // namespace

BOOST_AUTO_TEST_CASE(clear_keeps_the_buffers_and_gradients_repeat_bit_for_bit) {
    std::mt19937_64 rng(11);
    const std::array<Tensor<double>, 4> in = cast<double>(random_leaves(6, 5, 4, rng));
    Tape<double> tape;
    std::array<Var<double>, 4> leaves;
    Var<double> A;
    tape.backward(record_attention(tape, in, leaves, &A));
    // The buffers of the leaves' values, of the weights A and its gradient, and the gradients.
    std::vector<const double*> values;
    std::vector<Tensor<double>> first_grads;
    for (const Var<double>& leaf : leaves) {
        values.push_back(leaf.value().data().data());
        first_grads.push_back(leaf.grad());
    }
    const double* weights = A.value().data().data();
    const double* weights_grad = A.grad().data().data();
    const std::size_t nodes = tape.size();
    for (int round = 0; round < 3; ++round) {
        tape.clear();
        const Var<double> J = record_attention(tape, in, leaves, &A);
        tape.backward(J);
        BOOST_TEST(tape.size() == nodes);
        BOOST_TEST(A.value().data().data() == weights);  // same allocations, reused
        BOOST_TEST(A.grad().data().data() == weights_grad);
        for (std::size_t l = 0; l < leaves.size(); ++l) {
            BOOST_TEST(leaves[l].value().data().data() == values[l]);
            BOOST_TEST(leaves[l].grad() == first_grads[l]);  // identical gradients
        }
    }
    // A fresh tape agrees too: reuse changes nothing numerically.
    Tape<double> fresh;
    std::array<Var<double>, 4> fresh_leaves;
    fresh.backward(record_attention(fresh, in, fresh_leaves));
    for (std::size_t l = 0; l < leaves.size(); ++l) BOOST_TEST(fresh_leaves[l].grad() == first_grads[l]);
}

// A tape made after another died on this thread takes the dead one's nodes and buffers (a fresh
// tape per step then allocates about what a cleared one does), gives the same gradients bit for
// bit, and refuses a Var of the dead tape even when it is made at the same address.
BOOST_AUTO_TEST_CASE(a_fresh_tape_takes_the_buffers_a_dead_one_left) {
    std::mt19937_64 rng(12);
    const std::array<Tensor<double>, 4> in = cast<double>(random_leaves(6, 5, 4, rng));
    std::array<Var<double>, 4> leaves;
    std::optional<Tape<double>> tape;
    tape.emplace();
    tape->backward(record_attention(*tape, in, leaves));
    const Tensor<double> first_grad = leaves[1].grad();
    const Var<double> stale = leaves[0];
    tape.reset();

    const std::size_t before_fresh = allocations;
    tape.emplace();  // the same storage, so the same address
    tape->backward(record_attention(*tape, in, leaves));
    const std::size_t fresh = allocations - before_fresh;
    BOOST_TEST(leaves[1].grad() == first_grad);
    BOOST_CHECK_THROW(stale.value(), usage_error);

    const std::size_t before_cleared = allocations;
    tape->clear();
    tape->backward(record_attention(*tape, in, leaves));
    const std::size_t cleared = allocations - before_cleared;
    // The fresh tape's only extra allocations are its scratch pool for X's second and third
    // branches (X feeds Q, K and V through slot 0 of a matmul): the pool's array and one buffer.
    // Without the pooled nodes it would allocate its nodes' values and gradients again: about
    // 30 more.
    BOOST_TEST_MESSAGE("allocations: fresh tape " << fresh << ", cleared tape " << cleared);
    BOOST_TEST(fresh <= cleared + 2);
}

// The backward keeps a scratch buffer per size for contributions that cannot go straight into a
// gradient (x·x: the second slot's), but not one for every size a long-lived tape ever sees:
// sequences of 40 lengths leave at most 8 sizes' buffers.
BOOST_AUTO_TEST_CASE(scratch_buffers_are_kept_for_a_few_sizes_only) {
    constexpr std::size_t width = 64, lengths = 40, kept = 8;
    Tape<double> tape;
    const long long before = live_bytes;
    for (std::size_t length = 1; length <= lengths; ++length) {
        tape.clear();
        const Var<double> x = tape.leaf(Tensor<double>(Shape{length, width}, 0.5));
        tape.backward(sum(mul(x, x)));
        BOOST_TEST(x.grad()[0] == 1.0);  // d(Σ x²)/dx = 2x
    }
    // Held now: the graph's own buffers at the last length (x and x·x, values and gradients: 4
    // tensors of 40×64; Σ's are one number each) and the scratch buffers. One buffer per length would hold
    // 64·(1 + 2 + … + 40) = 52,480 doubles; 8 sizes at most 8·40·64 = 20,480.
    const long long held = live_bytes - before;
    const long long bound = static_cast<long long>((4 + kept) * lengths * width * sizeof(double));
    BOOST_TEST_MESSAGE("bytes held after " << lengths << " lengths: " << held << " (bound " << bound << ")");
    BOOST_TEST(held <= bound);
}

BOOST_AUTO_TEST_CASE(a_leaf_from_a_reference_copies_and_a_temporary_moves) {
    Tape<double> tape;
    const Tensor<double> source = Tensor<double>::matrix({{1, 2}, {3, 4}});
    const Var<double> copied = tape.leaf(source, "copied");
    BOOST_TEST(copied.value() == source);
    BOOST_TEST(copied.value().data().data() != source.data().data());
    Tensor<double> temporary = Tensor<double>::matrix({{5, 6}});
    const double* storage = temporary.data().data();
    const Var<double> moved = tape.leaf(std::move(temporary), "moved");
    BOOST_TEST(moved.value().data().data() == storage);
    const Var<double> constant = tape.constant(source, "c");
    tape.backward(sum(mul(copied, constant)));
    BOOST_TEST(copied.grad() == source);
}

// The replay's incremental path against a full recompute on a fresh tape, in 50 digits: for a
// perturbation of the checker's size (softmax by Taylor series) and a large one (softmax in
// full, matmul still incremental), for every leaf. A 50-digit result carries ~1e-49 relative
// rounding; the two orders of summation may differ by a few units of that, so 1e-45 is the
// bound (a wrong update, e.g. one missing ΔA·B' or the softmax denominator, misses by > 1e-20).
BOOST_AUTO_TEST_CASE(replay_updates_agree_with_a_full_recompute) {
    std::mt19937_64 rng(12);
    const Leaves in = random_leaves(5, 4, 3, rng);
    Tape<mp50> tape;
    std::array<Var<mp50>, 4> leaves;
    const Var<mp50> J = record_attention(tape, cast<mp50>(in), leaves);
    ReplayWorkspace<mp50> work;
    using Replacement = Tape<mp50>::Replacement;
    for (const double h : {1e-14, -1e-16, 0.25}) {
        for (std::size_t l = 0; l < 4; ++l) {
            for (const std::size_t c : {std::size_t{0}, std::size_t{7}}) {
                Tensor<mp50> moved = leaves[l].value();
                moved[c] += mp50(h);
                const Replacement replacement{leaves[l], &moved, std::nullopt};
                const mp50 replayed = tape.replay(J, std::span(&replacement, 1), work).item();

                Tape<mp50> fresh;
                std::array<Var<mp50>, 4> fresh_leaves;
                fresh_leaves = {fresh.leaf(l == 0 ? moved : tensor_cast<mp50>(in.X)),
                                fresh.leaf(l == 1 ? moved : tensor_cast<mp50>(in.W_Q)),
                                fresh.leaf(l == 2 ? moved : tensor_cast<mp50>(in.W_K)),
                                fresh.leaf(l == 3 ? moved : tensor_cast<mp50>(in.W_V))};
                const mp50 recomputed =
                    testing::probe(attention(fresh_leaves[0], fresh_leaves[1], fresh_leaves[2], fresh_leaves[3]).O)
                        .value()
                        .item();
                const double error = to_double(mp50(abs(replayed - recomputed) / std::max(mp50(1), mp50(abs(recomputed)))));
                BOOST_TEST(error <= 1e-45, "leaf " << l << " coordinate " << c << " h " << h << " error " << error);
                // The perturbation is visible (the replay did recompute).
                BOOST_TEST(replayed != J.value().item());
            }
        }
    }
}

// The batched and shared-B forms of MatMul::update, one edge at a time.
BOOST_AUTO_TEST_CASE(batched_matmul_replay_agrees_with_a_full_recompute) {
    std::mt19937_64 rng(13);
    for (const bool shared : {false, true}) {
        const Tensor<double> a = testing::random_tensor({3, 4, 5}, rng);
        const Tensor<double> b = shared ? testing::random_tensor({5, 2}, rng) : testing::random_tensor({3, 5, 2}, rng);
        Tape<mp50> tape;
        const Var<mp50> A = tape.leaf(tensor_cast<mp50>(a)), B = tape.leaf(tensor_cast<mp50>(b));
        const Var<mp50> J = testing::probe(matmul(A, B));
        ReplayWorkspace<mp50> work;
        for (std::size_t which = 0; which < 2; ++which) {
            const Var<mp50>& leaf = which == 0 ? A : B;
            for (std::size_t c = 0; c < leaf.value().size(); c += 3) {
                Tensor<mp50> moved = leaf.value();
                moved[c] += mp50(1e-3);
                const Tape<mp50>::Replacement replacement{leaf, &moved, std::nullopt};
                const mp50 replayed = tape.replay(J, std::span(&replacement, 1), work).item();
                Tape<mp50> fresh;
                const Var<mp50> A2 = fresh.leaf(which == 0 ? moved : tensor_cast<mp50>(a));
                const Var<mp50> B2 = fresh.leaf(which == 1 ? moved : tensor_cast<mp50>(b));
                const mp50 recomputed = testing::probe(matmul(A2, B2)).value().item();
                const double error = to_double(mp50(abs(replayed - recomputed)));
                BOOST_TEST(error <= 1e-45, "shared " << shared << " input " << which << " coordinate " << c);
            }
        }
    }
}
