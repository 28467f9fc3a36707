// The shape ops: reshape, concat, slice, permute.
//   * every op and case through the 50-digit checker and by an explicit seed on its own output
//     (the op table: one line per op and case, on several random dimensions);
//   * their values against indices worked out by hand (and transpose's, both ways round);
//   * the key-value cache: keys and values grown by concat of each new block along time, attention
//     over the grown cache equals the full causal pass, and gradients reach every block through
//     the concats (to 1e-12 in double, and at 50 digits through the checker);
//   * fault controls: a slice VJP that puts G at the wrong offset and a permute VJP that applies
//     π instead of π⁻¹, both rejected;
//   * bad input: each misuse raises the right error type with words naming the op and the fault.
#define BOOST_TEST_MODULE shape_ops
#include "support.hpp"

#include "ops/concat.hpp"
#include "ops/permute.hpp"
#include "ops/reshape.hpp"
#include "ops/slice.hpp"

#include <cmath>
#include <functional>
#include <numeric>
#include <tuple>
#include <utility>

using namespace tapegrad;
using tapegrad::testing::message_of;
using tapegrad::testing::check_op;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::probe;
using tapegrad::testing::random_tensor;

namespace {

using ShapeOf = Shape (*)(const OpDims&);
using Range = std::pair<std::size_t, std::size_t>;

// Ranges a slice row keeps on an axis of dimension `dim` (each valid for any dim >= 1).
Range middle(std::size_t dim) { return {dim / 3, dim - dim / 3}; }  // [1, 2) of 3, [2, 4) of 6
Range last_one(std::size_t dim) { return {dim - 1, dim}; }          // a length-1 slice at the end
Range first_one(std::size_t) { return {0, 1}; }                     // a length-1 slice at the front
Range from_second(std::size_t dim) { return {std::min<std::size_t>(1, dim - 1), dim}; }

OpCase reshape_row(std::string name, ShapeOf from, ShapeOf to) {
    return {std::move(name), [=](const OpDims& d, std::mt19937_64& rng) {
                const Shape target = to(d);
                return check_op([target](auto in) { return reshape(in[0], target); }, rng, from(d));
            }};
}

// `shapes(d)` gives the inputs' shapes (any number): concat of all of them along `axis`.
template <class Shapes>
OpCase concat_row(std::string name, std::ptrdiff_t axis, Shapes shapes) {
    return {std::move(name), [=](const OpDims& d, std::mt19937_64& rng) {
                const auto op = [axis](auto in) { return concat(std::vector(in.begin(), in.end()), axis); };
                return std::apply([&](const auto&... shape) { return check_op(op, rng, shape...); }, shapes(d));
            }};
}

OpCase slice_row(std::string name, ShapeOf shape_of, std::ptrdiff_t axis, Range (*range)(std::size_t)) {
    return {std::move(name), [=](const OpDims& d, std::mt19937_64& rng) {
                const Shape shape = shape_of(d);
                const std::size_t a = axes::from_front("test", axis, shape);
                // Not a structured binding: Clang 14 cannot capture one in a lambda (C++20 allows it).
                const Range kept = range(shape[a]);
                return check_op([=](auto in) { return slice(in[0], axis, kept.first, kept.second); }, rng, shape);
            }};
}

template <std::size_t R>
OpCase permute_row(std::string name, ShapeOf shape_of, std::array<std::size_t, R> axes) {
    return {std::move(name), [=](const OpDims& d, std::mt19937_64& rng) {
                return check_op([axes](auto in) { return permute(in[0], std::span<const std::size_t>(axes)); }, rng,
                                shape_of(d));
            }};
}

Shape flat4(const OpDims& d) { return Shape{d.batch * d.m * d.k * d.n}; }
Shape rank2(const OpDims& d) { return Shape{d.m, d.n}; }
Shape rank3(const OpDims& d) { return Shape{d.batch, d.m, d.n}; }
Shape rank4(const OpDims& d) { return Shape{d.batch, d.m, d.k, d.n}; }

const std::vector<OpCase> op_table = {
    reshape_row("reshape 1 -> 4", flat4, rank4),
    reshape_row("reshape 4 -> 1", rank4, flat4),
    reshape_row("reshape 2 -> 3", [](const OpDims& d) { return Shape{d.batch * d.m, d.k * d.n}; }, [](const OpDims& d) { return Shape{d.batch, d.m * d.k, d.n}; }),
    reshape_row("reshape 3 -> 2", [](const OpDims& d) { return Shape{d.batch, d.m, d.k * d.n}; }, [](const OpDims& d) { return Shape{d.m * d.k, d.batch * d.n}; }),
    reshape_row("reshape 4 -> 4", rank4, [](const OpDims& d) { return Shape{d.n, d.k, d.m, d.batch}; }),
    reshape_row("reshape 2 -> 1", rank2, [](const OpDims& d) { return Shape{d.m * d.n}; }),
    reshape_row("reshape 3 -> 3 (same shape)", rank3, rank3),
    concat_row("concat 2 rank 1", 0, [](const OpDims& d) { return std::tuple{Shape{d.m}, Shape{d.n}}; }),
    concat_row("concat 2 axis 0", 0, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.k, d.m, d.n}}; }),
    concat_row("concat 2 axis 1", 1, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, d.k, d.n}}; }),
    concat_row("concat 2 axis 2", 2, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, d.m, d.k}}; }),
    concat_row("concat 3 axis -3", -3, [](const OpDims& d) { return std::tuple{Shape{d.m, d.batch, d.n}, Shape{d.k, d.batch, d.n}, Shape{1, d.batch, d.n}}; }),
    concat_row("concat 3 axis -2", -2, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, 1, d.n}, Shape{d.batch, d.k, d.n}}; }),
    concat_row("concat 3 axis -1", -1, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, d.m, d.k}, Shape{d.batch, d.m, 1}}; }),
    concat_row("concat 3 rank 4 axis 2", 2, [](const OpDims& d) { return std::tuple{Shape{d.batch, 2, d.m, d.n}, Shape{d.batch, 2, d.k, d.n}, Shape{d.batch, 2, 1, d.n}}; }),
    concat_row("concat 4 axis 1", 1, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, d.k, d.n}, Shape{d.batch, 1, d.n}, Shape{d.batch, 2, d.n}}; }),
    concat_row("concat 5 axis 0", 0, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.k, d.m, d.n}, Shape{1, d.m, d.n}, Shape{2, d.m, d.n}, Shape{d.m, d.m, d.n}}; }),
    concat_row("concat 5 axis -2", -2, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, d.k, d.n}, Shape{d.batch, 1, d.n}, Shape{d.batch, 2, d.n}, Shape{d.batch, d.n, d.n}}; }),
    concat_row("concat 6 axis 2", 2, [](const OpDims& d) { return std::tuple{Shape{d.batch, d.m, d.n}, Shape{d.batch, d.m, d.k}, Shape{d.batch, d.m, 1}, Shape{d.batch, d.m, 2}, Shape{d.batch, d.m, d.batch}, Shape{d.batch, d.m, 1}}; }),
    concat_row("concat 9 axis -1 (a tree of depth 2)", -1, [](const OpDims& d) { return std::tuple{Shape{d.m, d.n}, Shape{d.m, d.k}, Shape{d.m, 1}, Shape{d.m, 2}, Shape{d.m, d.batch}, Shape{d.m, 1}, Shape{d.m, d.n}, Shape{d.m, 3}, Shape{d.m, 1}}; }),
    {"concat with a repeated input", [](const OpDims& d, auto& rng) { return check_op([](auto in) { return concat({in[0], in[1], in[0], in[0], in[1]}, 1); }, rng, Shape{d.batch, d.m, d.n}, Shape{d.batch, d.k, d.n}); }},
    slice_row("slice rank 1 middle", [](const OpDims& d) { return Shape{d.m * d.n}; }, 0, middle),
    slice_row("slice axis 0 middle", rank3, 0, middle),
    slice_row("slice axis 1 middle", rank3, 1, middle),
    slice_row("slice axis 2 middle", rank3, 2, middle),
    slice_row("slice axis 0 last one", rank3, 0, last_one),
    slice_row("slice axis 1 first one", rank3, 1, first_one),
    slice_row("slice axis -1 last one", rank3, -1, last_one),
    slice_row("slice axis -2 from second", rank3, -2, from_second),
    slice_row("slice axis -3 from second", rank3, -3, from_second),
    slice_row("slice rank 4 axis 2 middle", rank4, 2, middle),
    slice_row("slice rank 4 axis 3 last one", rank4, 3, last_one),
    permute_row("permute (0)", [](const OpDims& d) { return Shape{d.m * d.n}; }, std::array<std::size_t, 1>{0}),
    permute_row("permute (1, 0)", rank2, std::array<std::size_t, 2>{1, 0}),
    permute_row("permute (0, 1, 2)", rank3, std::array<std::size_t, 3>{0, 1, 2}),
    permute_row("permute (0, 2, 1)", rank3, std::array<std::size_t, 3>{0, 2, 1}),
    permute_row("permute (1, 0, 2)", rank3, std::array<std::size_t, 3>{1, 0, 2}),
    permute_row("permute (1, 2, 0)", rank3, std::array<std::size_t, 3>{1, 2, 0}),
    permute_row("permute (2, 0, 1)", rank3, std::array<std::size_t, 3>{2, 0, 1}),
    permute_row("permute (2, 1, 0)", rank3, std::array<std::size_t, 3>{2, 1, 0}),
    permute_row("permute (0, 2, 1, 3)", rank4, std::array<std::size_t, 4>{0, 2, 1, 3}),
    permute_row("permute (0, 1, 3, 2)", rank4, std::array<std::size_t, 4>{0, 1, 3, 2}),
    permute_row("permute (3, 2, 1, 0)", rank4, std::array<std::size_t, 4>{3, 2, 1, 0}),
    permute_row("permute (1, 2, 3, 0)", rank4, std::array<std::size_t, 4>{1, 2, 3, 0}),
    permute_row("permute (2, 0, 3, 1)", rank4, std::array<std::size_t, 4>{2, 0, 3, 1}),
};

// 0, 1, 2, ... in row-major order: every value names its own flat position.
Tensor<double> counting(const Shape& shape) {
    Tensor<double> t(shape);
    std::iota(t.data().begin(), t.data().end(), 0.0);
    return t;
}

// Rows [begin, end) of the time axis (axis 1) of a [B, T, c] tensor, copied index by index.
Tensor<double> time_block(const Tensor<double>& x, std::size_t begin, std::size_t end) {
    const Shape& s = x.shape();
    Tensor<double> part(Shape{s[0], end - begin, s[2]});
    for (std::size_t b = 0; b < s[0]; ++b)
        for (std::size_t t = begin; t < end; ++t)
            for (std::size_t c = 0; c < s[2]; ++c) part.at({b, t - begin, c}) = x.at({b, t, c});
    return part;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_shape_op_passes_the_50_digit_checker) {
    testing::check_op_table(op_table, 2024, 5);
}

BOOST_AUTO_TEST_CASE(reshape_keeps_the_row_major_order) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(counting(Shape{2, 3, 4}));
    const Var<double> Y = reshape(X, Shape{4, 6});
    BOOST_TEST((Y.shape() == Shape{4, 6}));
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 6; ++j) BOOST_TEST(Y.value()(i, j) == double(6 * i + j));
    // X[b, t, c] = 12b + 4t + c sits at Y[(12b + 4t + c) / 6, (12b + 4t + c) % 6].
    BOOST_TEST(Y.value().at({3, 5}) == X.value().at({1, 2, 3}));
    const Var<double> one = reshape(tape.leaf(Tensor<double>(Shape{1, 1, 1}, 2.5)), Shape{});
    BOOST_TEST(one.shape().rank() == 0u);
    BOOST_TEST(one.value().item() == 2.5);
    tape.backward(Y, counting(Shape{4, 6}));
    BOOST_TEST((X.grad() == counting(Shape{2, 3, 4})));  // G reshaped back
}

BOOST_AUTO_TEST_CASE(concat_places_each_input_at_its_offset) {
    Tape<double> tape;
    // Along axis 1 of [2 x n]: A [2x3] holds 0..5, B [2x1] holds 100, 101, C [2x2] 200..203.
    Tensor<double> b = counting(Shape{2, 1}), c = counting(Shape{2, 2});
    for (double& x : b.data()) x += 100;
    for (double& x : c.data()) x += 200;
    const Var<double> A = tape.leaf(counting(Shape{2, 3})), B = tape.leaf(b), C = tape.leaf(c);
    const Var<double> Y = concat({A, B, C}, -1);
    BOOST_TEST((Y.shape() == Shape{2, 6}));
    for (std::size_t i = 0; i < 2; ++i) {
        for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(Y.value()(i, j) == double(3 * i + j));
        BOOST_TEST(Y.value()(i, 3) == 100.0 + double(i));
        for (std::size_t j = 4; j < 6; ++j) BOOST_TEST(Y.value()(i, j) == 200.0 + double(2 * i + j - 4));
    }
    // The VJP hands each input its columns of G: G(i, j) = 6i + j.
    tape.backward(Y, counting(Shape{2, 6}));
    BOOST_TEST((A.grad() == Tensor<double>::matrix({{0, 1, 2}, {6, 7, 8}})));
    BOOST_TEST((B.grad() == Tensor<double>::matrix({{3}, {9}})));
    BOOST_TEST((C.grad() == Tensor<double>::matrix({{4, 5}, {10, 11}})));

    // Along axis 0 of rank 3: Y[p, t, c] is A3[p, t, c] for p < 2, else B3[p − 2, t, c].
    const Var<double> A3 = tape.leaf(counting(Shape{2, 2, 3})), B3 = tape.leaf(counting(Shape{1, 2, 3}));
    const Var<double> Y3 = concat({A3, B3}, 0);
    BOOST_TEST((Y3.shape() == Shape{3, 2, 3}));
    for (std::size_t t = 0; t < 2; ++t)
        for (std::size_t c2 = 0; c2 < 3; ++c2) {
            BOOST_TEST(Y3.value().at({1, t, c2}) == A3.value().at({1, t, c2}));
            BOOST_TEST(Y3.value().at({2, t, c2}) == B3.value().at({0, t, c2}));
        }
}

// A node holds at most 4 inputs: more are joined in a tree of concat nodes, with the same result.
BOOST_AUTO_TEST_CASE(concat_of_more_than_four_inputs_records_a_tree_with_the_same_result) {
    for (const auto& [inputs, nodes] : {std::pair<std::size_t, std::size_t>{4, 1}, {5, 2}, {9, 3}, {17, 6}}) {
        BOOST_TEST_CONTEXT(inputs << " inputs") {
            Tape<double> tape;
            std::vector<Var<double>> parts;
            for (std::size_t p = 0; p < inputs; ++p) {  // input p is the column [10p, 10p + 1]
                parts.push_back(tape.leaf(Tensor<double>::matrix({{10.0 * double(p)}, {10.0 * double(p) + 1}})));
            }
            const std::size_t before = tape.size();
            const Var<double> Y = concat(parts, 1);
            BOOST_TEST(tape.size() - before == nodes);
            BOOST_TEST((Y.shape() == Shape{2, inputs}));
            for (std::size_t i = 0; i < 2; ++i)
                for (std::size_t j = 0; j < inputs; ++j) BOOST_TEST(Y.value()(i, j) == 10.0 * double(j) + double(i));
            tape.backward(Y, counting(Shape{2, inputs}));
            for (std::size_t p = 0; p < inputs; ++p) {
                BOOST_TEST(parts[p].grad()(0, 0) == double(p));
                BOOST_TEST(parts[p].grad()(1, 0) == double(inputs + p));
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(slice_reads_its_range_and_its_vjp_fills_the_rest_with_zeros) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(counting(Shape{3, 4, 5}));  // X[i, j, k] = 20i + 5j + k
    const Var<double> Y = slice(X, 1, 1, 3);
    BOOST_TEST((Y.shape() == Shape{3, 2, 5}));
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 2; ++j)
            for (std::size_t k = 0; k < 5; ++k) BOOST_TEST(Y.value().at({i, j, k}) == double(20 * i + 5 * (j + 1) + k));
    const Var<double> last = slice(X, -1, 4, 5);  // a length-1 slice of the last axis
    BOOST_TEST((last.shape() == Shape{3, 4, 1}));
    BOOST_TEST(last.value().at({2, 3, 0}) == 59.0);
    const Var<double> whole = slice(X, 0, 0, 3);
    BOOST_TEST((whole.value() == X.value()));

    tape.backward(Y, Tensor<double>(Y.shape(), 1.5));
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 4; ++j)
            for (std::size_t k = 0; k < 5; ++k) {
                BOOST_TEST(X.grad().at({i, j, k}) == (j == 1 || j == 2 ? 1.5 : 0.0));
            }
}

BOOST_AUTO_TEST_CASE(permute_moves_each_axis_where_it_is_told) {
    Tape<double> tape;
    // Rank 3, π = (1, 2, 0): Y [4x5x3], Y[a, b, c] = X[c, a, b].
    const Var<double> X = tape.leaf(counting(Shape{3, 4, 5}));
    const Var<double> Y = permute(X, {1, 2, 0});
    BOOST_TEST((Y.shape() == Shape{4, 5, 3}));
    for (std::size_t a = 0; a < 4; ++a)
        for (std::size_t b = 0; b < 5; ++b)
            for (std::size_t c = 0; c < 3; ++c) BOOST_TEST(Y.value().at({a, b, c}) == X.value().at({c, a, b}));
    // Rank 4, π = (2, 0, 3, 1): Y [4x2x5x3], Y[a, b, c, e] = X4[b, e, a, c].
    const Var<double> X4 = tape.leaf(counting(Shape{2, 3, 4, 5}));
    const Var<double> Y4 = permute(X4, {2, 0, 3, 1});
    BOOST_TEST((Y4.shape() == Shape{4, 2, 5, 3}));
    for (std::size_t a = 0; a < 4; ++a)
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t c = 0; c < 5; ++c)
                for (std::size_t e = 0; e < 3; ++e) {
                    BOOST_TEST(Y4.value().at({a, b, c, e}) == X4.value().at({b, e, a, c}));
                }
    // The VJP is the inverse permutation: G = Y's own values lead back to X's.
    tape.backward(Y4, Y4.value());
    BOOST_TEST((X4.grad() == X4.value()));
}

BOOST_AUTO_TEST_CASE(permute_agrees_with_transpose_and_split_heads) {
    std::mt19937_64 rng(3);
    Tape<double> tape;
    const Var<double> X = tape.leaf(random_tensor(Shape{2, 3, 8}, rng));
    // (Vars first: a value() reference lasts only until the tape records its next node.)
    const Var<double> swapped = permute(X, {0, 2, 1}), transposed = transpose(X);
    BOOST_TEST((swapped.value() == transposed.value()));
    // split_heads with 2 heads: [B, T, H·dh] -> [B, H, T, dh] is reshape to [B, T, H, dh], then (0, 2, 1, 3).
    const Var<double> heads = permute(reshape(X, Shape{2, 3, 2, 4}), {0, 2, 1, 3}), split = split_heads(X, 2);
    BOOST_TEST((heads.value() == split.value()));
}

// transpose copies tile by tile, walking the longer rows contiguously: both ways round (m > n,
// the writes contiguous; m <= n, the reads), with partial tiles, and a batch, every element where
// Y_ji = X_ij puts it, and the VJP (the other way round) back where it came from.
BOOST_AUTO_TEST_CASE(transpose_moves_every_element_both_ways_round) {
    std::mt19937_64 rng(5);
    for (const Shape shape : {Shape{40, 17}, Shape{17, 40}, Shape{16, 16}, Shape{3, 1024, 64}, Shape{64, 1024}}) {
        Tape<double> tape;
        const Var<double> X = tape.leaf(random_tensor(shape, rng));
        const Var<double> Y = transpose(X);
        const std::size_t m = shape.rows(), n = shape.cols(), batch = shape.size() / (m * n);
        bool moved = true;
        for (std::size_t b = 0; b < batch; ++b)
            for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j)
                    moved = moved && Y.value()[b * m * n + j * m + i] == X.value()[b * m * n + i * n + j];
        BOOST_TEST(moved, shape.to_string());
        tape.backward(Y, Y.value());
        BOOST_TEST((X.grad() == X.value()), shape.to_string());
    }
}

// The key-value cache: each step brings a block of new time steps; its keys and values are
// appended to the cache by concat along time (axis −2 of [B, T, c]), and the block's queries
// attend over the whole cache with query_offset = the block's first position.
namespace {

// Each block's output [B, block, r] through a cache grown by concat; `q`, `k`, `v` hold the
// blocks' queries, keys and values in order, and `starts` each block's first position.
template <class V>
std::vector<V> attend_through_cache(const std::vector<V>& q, const std::vector<V>& k, const std::vector<V>& v,
                                    const std::vector<std::size_t>& starts) {
    std::vector<V> outputs;
    V keys = k[0], values = v[0];
    for (std::size_t b = 0; b < q.size(); ++b) {
        if (b > 0) {
            keys = concat({keys, k[b]}, -2);
            values = concat({values, v[b]}, -2);
        }
        outputs.push_back(causal_attention(q[b], keys, values, starts[b]).O);
    }
    return outputs;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_cache_grown_by_concat_gives_the_full_pass_and_its_gradients) {
    std::mt19937_64 rng(21);
    const std::size_t B = 2, T = 7, d = 3, r = 2;
    const std::vector<std::size_t> starts = {0, 2, 3}, ends = {2, 3, 7};
    const Tensor<double> q = random_tensor(Shape{B, T, d}, rng), k = random_tensor(Shape{B, T, d}, rng),
                         v = random_tensor(Shape{B, T, r}, rng), G = random_tensor(Shape{B, T, r}, rng);

    Tape<double> full_tape;
    const Var<double> Q = full_tape.leaf(q), K = full_tape.leaf(k), V = full_tape.leaf(v);
    const Var<double> O = causal_attention(Q, K, V).O;
    full_tape.backward(sum(mul(O, full_tape.constant(G))));

    Tape<double> tape;
    std::vector<Var<double>> qs, ks, vs;
    for (std::size_t b = 0; b < starts.size(); ++b) {
        qs.push_back(tape.leaf(time_block(q, starts[b], ends[b])));
        ks.push_back(tape.leaf(time_block(k, starts[b], ends[b])));
        vs.push_back(tape.leaf(time_block(v, starts[b], ends[b])));
    }
    const std::vector<Var<double>> outputs = attend_through_cache(qs, ks, vs, starts);
    Var<double> J = sum(mul(outputs[0], tape.constant(time_block(G, starts[0], ends[0]))));
    for (std::size_t b = 1; b < outputs.size(); ++b) {
        J = add(J, sum(mul(outputs[b], tape.constant(time_block(G, starts[b], ends[b])))));
    }
    tape.backward(J);

    // Same operations on the same numbers up to the order of a few sums: agreement to 1e-12.
    double worst_output = 0, worst_gradient = 0;
    const auto worst_difference = [](const Tensor<double>& a, const Tensor<double>& b) {
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
        return worst;
    };
    for (std::size_t b = 0; b < starts.size(); ++b) {
        const auto rows_of = [&](const Tensor<double>& whole) { return time_block(whole, starts[b], ends[b]); };
        worst_output = std::max(worst_output, worst_difference(outputs[b].value(), rows_of(O.value())));
        for (const auto& [block, whole] : {std::pair{qs[b], Q}, std::pair{ks[b], K}, std::pair{vs[b], V}}) {
            worst_gradient = std::max(worst_gradient, worst_difference(block.grad(), rows_of(whole.grad())));
        }
    }
    BOOST_TEST(worst_output <= 1e-12);
    BOOST_TEST(worst_gradient <= 1e-12);
    BOOST_TEST_MESSAGE("cache vs full pass: output " << worst_output << ", gradients " << worst_gradient);
}

BOOST_AUTO_TEST_CASE(gradients_reach_every_block_through_the_cache_at_50_digits) {
    std::mt19937_64 rng(22);
    const std::size_t B = 2, d = 2, r = 2;
    const std::vector<std::size_t> starts = {0, 2, 3}, lengths = {2, 1, 2};
    const auto block = [&](std::size_t b, std::size_t width) {
        return random_tensor(Shape{B, lengths[b], width}, rng);
    };
    const CheckReport report = check_gradients(
        [&starts](auto in) {
            using V = std::decay_t<decltype(in[0])>;
            const std::vector<V> q = {in[0], in[1], in[2]}, k = {in[3], in[4], in[5]}, v = {in[6], in[7], in[8]};
            const std::vector<V> outputs = attend_through_cache(q, k, v, starts);
            return add(add(probe(outputs[0]), probe(outputs[1])), probe(outputs[2]));
        },
        {{"Q0", block(0, d)}, {"Q1", block(1, d)}, {"Q2", block(2, d)},
         {"K0", block(0, d)}, {"K1", block(1, d)}, {"K2", block(2, d)},
         {"V0", block(0, r)}, {"V1", block(1, r)}, {"V2", block(2, r)}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.max_error_mp <= 1e-25);
    BOOST_TEST_MESSAGE(report.summary());
}

// Fault controls: broken VJPs kept only here, each rejected by the checker; the correct op passes
// the same check on the same shape, so the rejection is the fault's doing.
namespace {

// Slice whose VJP puts G at the front of the axis instead of at `begin`.
struct SliceAtWrongOffset : Slice {
    static constexpr std::string_view name = "slice with G at offset 0";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        dX.fill(T(0));
        axes::copy_along(at.G.data().data(), axes::around(at.G.shape(), s.axis), 0, dX.data().data(),
                         axes::around(dX.shape(), s.axis), 0, s.end - s.begin);
    }
};
const bool slice_at_wrong_offset_registered = register_siblings<SliceAtWrongOffset>();  // driven through its recorded tape

// Permute whose VJP applies π to G instead of π⁻¹. Used on a cube (every dimension 3), where G
// permuted by π still has X's shape, so the fault shows in the values, not as a shape mismatch.
struct PermuteForwardInVjp : Permute {
    static constexpr std::string_view name = "permute with π in its VJP";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        move_axes(at.G, s, dX);
    }
};
const bool permute_forward_in_vjp_registered = register_siblings<PermuteForwardInVjp>();  // driven through its recorded tape

// Op (a shape op or its broken twin, whose settings do not depend on the scalar type) on one
// leaf of `shape`, through check_op.
template <class Op>
CheckReport check_recorded(const SettingsOf<Op, double>& settings, const Shape& shape, std::mt19937_64& rng) {
    return check_op([&settings](auto in) { return in[0].tape().template record<Op>({in[0]}, settings); }, rng, shape);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_slice_vjp_at_the_wrong_offset_is_rejected) {
    std::mt19937_64 rng(31);
    const Shape shape{2, 5, 3};
    const Slice::Settings middle_of_time{1, 2, 4};  // positions [2, 4) of axis 1
    const CheckReport broken = check_recorded<SliceAtWrongOffset>(middle_of_time, shape, rng);
    BOOST_TEST(!broken.passed);
    BOOST_TEST(broken.failures > 0u);
    const CheckReport correct = check_recorded<Slice>(middle_of_time, shape, rng);
    BOOST_TEST(correct.passed, correct.summary());
}

BOOST_AUTO_TEST_CASE(a_permute_vjp_applying_the_forward_permutation_is_rejected) {
    std::mt19937_64 rng(32);
    const Shape cube{3, 3, 3};
    const Permute::Settings cycle{{1, 2, 0, 0}, 3};  // π = (1, 2, 0), π⁻¹ = (2, 0, 1) ≠ π
    const CheckReport broken = check_recorded<PermuteForwardInVjp>(cycle, cube, rng);
    BOOST_TEST(!broken.passed);
    BOOST_TEST(broken.failures > 0u);
    const CheckReport correct = check_recorded<Permute>(cycle, cube, rng);
    BOOST_TEST(correct.passed, correct.summary());
    // On a swap (its own inverse) the same fault is invisible: why the control uses a cycle.
    const Permute::Settings swap{{0, 2, 1, 0}, 3};
    const CheckReport on_swap = check_recorded<PermuteForwardInVjp>(swap, cube, rng);
    BOOST_TEST(on_swap.passed, on_swap.summary());
}

// Bad input: one row per misuse, with the exception type and words the message must hold.
namespace {

using testing::ErrorKind;
using Misuse = testing::Misuse<std::function<void(Tape<double>&, Var<double>)>>;  // a is a [2x3] leaf

Tensor<double> filled(const Shape& shape) { return Tensor<double>(shape, 0.5); }

const std::vector<Misuse> misuses = {
    {"reshape size", ErrorKind::shape, [](auto&, auto a) { reshape(a, Shape{4}); }, {"reshape", "[2x3]", "6 elements", "[4]", "4 elements"}},
    {"reshape empty", ErrorKind::shape, [](auto& t, auto) { reshape(t.leaf(filled({0, 3})), Shape{0}); }, {"reshape", "empty", "[0x3]"}},
    {"concat no inputs", ErrorKind::usage, [](auto&, auto) { concat(std::vector<Var<double>>{}, 0); }, {"concat", "empty"}},
    {"concat rank", ErrorKind::shape, [](auto& t, auto a) { concat({a, t.leaf(filled({2, 3, 1}))}, 0); }, {"concat", "input 1", "[2x3x1]", "[2x3]", "axis 0"}},
    {"concat other dimension", ErrorKind::shape, [](auto& t, auto a) { concat({a, a, t.leaf(filled({3, 4}))}, 0); }, {"concat", "input 2", "[3x4]", "[2x3]", "axis 0"}},
    {"concat axis too large", ErrorKind::shape, [](auto&, auto a) { concat({a, a}, 2); }, {"concat", "axis 2", "[2x3]", "[-2, 2)"}},
    {"concat axis too negative", ErrorKind::shape, [](auto&, auto a) { concat({a, a}, -3); }, {"concat", "axis -3", "[2x3]"}},
    {"concat scalars", ErrorKind::shape, [](auto& t, auto) { const auto s = t.leaf(Tensor<double>::scalar(1.0)); concat({s, s}, 0); }, {"concat", "axis 0", "[]", "rank 0"}},
    {"concat empty input", ErrorKind::shape, [](auto& t, auto a) { concat({a, t.leaf(filled({2, 0}))}, 1); }, {"concat", "input 1", "empty", "[2x0]"}},
    {"concat other tape", ErrorKind::usage, [](auto&, auto a) { Tape<double> other; concat({a, other.leaf(filled({2, 3}))}, 0); }, {"concat", "input 1", "another tape"}},
    {"concat bad sixth input", ErrorKind::shape, [](auto& t, auto a) { concat({a, a, a, a, a, t.leaf(filled({2, 3, 3}))}, 1); }, {"concat", "input 5", "[2x3x3]"}},
    {"slice axis", ErrorKind::shape, [](auto&, auto a) { slice(a, 2, 0, 1); }, {"slice", "axis 2", "[2x3]"}},
    {"slice beyond dimension", ErrorKind::shape, [](auto&, auto a) { slice(a, 1, 1, 4); }, {"slice", "[1, 4)", "axis 1", "dimension 3", "[2x3]"}},
    {"slice empty range", ErrorKind::value, [](auto&, auto a) { slice(a, -1, 2, 2); }, {"slice", "[2, 2)", "axis -1", "empty", "[2x3]"}},
    {"slice reversed range", ErrorKind::value, [](auto&, auto a) { slice(a, 0, 2, 1); }, {"slice", "[2, 1)", "axis 0", "[2x3]"}},
    {"permute too few axes", ErrorKind::shape, [](auto& t, auto) { permute(t.leaf(filled({2, 3, 4})), {1, 0}); }, {"permute", "(1, 0)", "[2x3x4]", "rank 3"}},
    {"permute repeated axis", ErrorKind::value, [](auto&, auto a) { permute(a, {1, 1}); }, {"permute", "(1, 1)", "not a permutation", "[2x3]"}},
    {"permute axis out of range", ErrorKind::value, [](auto&, auto a) { permute(a, {0, 2}); }, {"permute", "(0, 2)", "not a permutation", "[2x3]"}},
    {"permute empty", ErrorKind::shape, [](auto& t, auto) { permute(t.leaf(filled({2, 0})), {1, 0}); }, {"permute", "empty", "[2x0]"}},
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_misuse_raises_a_named_error) {
    for (const Misuse& m : misuses) {
        Tape<double> tape;
        const Var<double> a = tape.leaf(filled({2, 3}), "a");
        testing::expect_named_error(m, [&] { m.act(tape, a); });
    }
}

BOOST_AUTO_TEST_CASE(a_refused_concat_of_many_inputs_records_no_partial_tree) {
    Tape<double> tape;
    const Var<double> a = tape.leaf(filled({2, 3}));
    const Var<double> wrong = tape.leaf(filled({3, 3}));
    const std::size_t before = tape.size();
    const std::string message = message_of<shape_error>([&] { concat({a, a, a, a, a, a, a, a, wrong}, 1); });
    BOOST_TEST(message.find("input 8") != std::string::npos, message);
    BOOST_TEST(tape.size() == before);  // the inputs are checked before any node of the tree is recorded
}
