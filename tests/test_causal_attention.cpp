// causal_attention(Q, K, V, query_offset, dropout) and masked_attention: gradients through the
// 50-digit checker (with an offset, with dropout held fixed, with a fully hidden row, with a
// single position); causality (later inputs change nothing earlier, and their gradient is exactly
// zero); the key-value cache (blocks with query_offset equal the full pass); masks' errors.
#define BOOST_TEST_MODULE causal_attention
#include "support.hpp"

#include <cmath>

using namespace tapegrad;
using tapegrad::testing::message_of;
using tapegrad::testing::probe;
using tapegrad::testing::random_tensor;

namespace {

// Rows [begin, end) of a [T × c] matrix.
Tensor<double> rows_of(const Tensor<double>& x, std::size_t begin, std::size_t end) {
    Tensor<double> part(Shape{end - begin, x.cols()});
    std::copy(x.data().begin() + static_cast<std::ptrdiff_t>(begin * x.cols()),
              x.data().begin() + static_cast<std::ptrdiff_t>(end * x.cols()), part.data().begin());
    return part;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gradients_with_a_query_offset_pass_the_checker) {
    std::mt19937_64 rng(10);
    // Three new queries at absolute positions 2..4 over a history of five keys, batch of two.
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [Q, K, V] = in;
            const auto r = causal_attention(Q, K, V, 2);
            return add(probe(r.O), probe(r.A));  // both returned values are differentiable outputs
        },
        {{"Q", random_tensor(Shape{2, 3, 2}, rng)},
         {"K", random_tensor(Shape{2, 5, 2}, rng)},
         {"V", random_tensor(Shape{2, 5, 3}, rng)}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST_MESSAGE(report.summary());
}

BOOST_AUTO_TEST_CASE(gradients_with_dropout_pass_the_checker_with_the_mask_held_fixed) {
    std::mt19937_64 rng(11);
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [Q, K, V] = in;
            std::mt19937_64 generator(123);  // seeded per recording: double and 50-digit draw one mask
            return probe(causal_attention(Q, K, V, 0, DropoutSettings{0.4, generator}).O);
        },
        {{"Q", random_tensor(Shape{4, 3}, rng)},
         {"K", random_tensor(Shape{4, 3}, rng)},
         {"V", random_tensor(Shape{4, 2}, rng)}});
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(dropout_applies_after_the_returned_probabilities) {
    std::mt19937_64 rng(12);
    Tape<double> tape;
    const Var<double> Q = tape.leaf(random_tensor(Shape{5, 3}, rng), "Q");
    const Var<double> K = tape.leaf(random_tensor(Shape{5, 3}, rng), "K");
    const Var<double> V = tape.leaf(random_tensor(Shape{5, 2}, rng), "V");
    const auto plain = causal_attention(Q, K, V);
    std::mt19937_64 g0(1);
    const auto p_zero = causal_attention(Q, K, V, 0, DropoutSettings{0.0, g0});
    BOOST_TEST((p_zero.O.value() == plain.O.value()));  // p = 0 is no dropout, bit for bit
    std::mt19937_64 a(2), b(2);
    const auto with_a = causal_attention(Q, K, V, 0, DropoutSettings{0.5, a});
    const auto with_b = causal_attention(Q, K, V, 0, DropoutSettings{0.5, b});
    BOOST_TEST((with_a.O.value() == with_b.O.value()));  // one seed, one result
    // The returned A is before dropout (rows sum to one); the applied weights are A·mask/(1−p).
    BOOST_TEST((with_a.A.value() == plain.A.value()));
    for (std::size_t k = 0; k < with_a.A.value().size(); ++k) {
        const double applied = with_a.A_dropped.value()[k];
        BOOST_TEST((applied == 0.0 || applied == 2.0 * with_a.A.value()[k]));
    }
}

BOOST_AUTO_TEST_CASE(blocks_with_query_offset_equal_the_full_causal_pass) {
    std::mt19937_64 rng(13);
    const std::size_t T = 7, d = 3, r = 2;
    const Tensor<double> q = random_tensor(Shape{T, d}, rng), k = random_tensor(Shape{T, d}, rng),
                         v = random_tensor(Shape{T, r}, rng);
    Tape<double> tape;
    const Tensor<double> full =
        causal_attention(tape.constant(q), tape.constant(k), tape.constant(v)).O.value();
    // Feed the sequence in blocks [0,2), [2,3), [3,7): each block's queries over the keys so far.
    double worst = 0;
    for (const auto& [begin, end] : {std::pair<std::size_t, std::size_t>{0, 2}, {2, 3}, {3, 7}}) {
        const Tensor<double> block = causal_attention(tape.constant(rows_of(q, begin, end)),
                                                      tape.constant(rows_of(k, 0, end)),
                                                      tape.constant(rows_of(v, 0, end)), begin)
                                         .O.value();
        for (std::size_t i = 0; i < end - begin; ++i)
            for (std::size_t c = 0; c < r; ++c) worst = std::max(worst, std::abs(block(i, c) - full(begin + i, c)));
    }
    // Same operations on the same numbers up to the order of a few sums: agreement to 1e-12.
    BOOST_TEST(worst <= 1e-12);
}

BOOST_AUTO_TEST_CASE(later_inputs_change_nothing_earlier_and_get_exactly_zero_gradient) {
    std::mt19937_64 rng(14);
    const std::size_t T = 6, D = 4, t = 2;
    const Tensor<double> x = random_tensor(Shape{T, D}, rng);
    Tensor<double> x_changed = x;
    for (std::size_t i = t + 1; i < T; ++i)
        for (std::size_t c = 0; c < D; ++c) x_changed(i, c) += 10.0 * (c + 1);
    const Tensor<double> w_q = random_tensor(Shape{D, 3}, rng), w_k = random_tensor(Shape{D, 3}, rng),
                         w_v = random_tensor(Shape{D, 2}, rng);

    Tape<double> tape;
    const auto run = [&](const Tensor<double>& input) {
        const Var<double> X = tape.leaf(input, "X");
        const Var<double> W_Q = tape.leaf(w_q), W_K = tape.leaf(w_k), W_V = tape.leaf(w_v);
        return std::pair{X, causal_attention(matmul(X, W_Q), matmul(X, W_K), matmul(X, W_V)).O};
    };
    const auto [X, O] = run(x);
    const auto [X2, O2] = run(x_changed);
    for (std::size_t i = 0; i <= t; ++i)
        for (std::size_t c = 0; c < 2; ++c) BOOST_TEST(O.value()(i, c) == O2.value()(i, c));

    // dO_t/dX_j for j > t: seed only row t.
    Tensor<double> G(O.shape(), 0.0);
    G(t, 0) = 1.3;
    G(t, 1) = -0.7;
    tape.backward(O, G);
    for (std::size_t j = t + 1; j < T; ++j)
        for (std::size_t c = 0; c < D; ++c) BOOST_TEST(X.grad()(j, c) == 0.0);
    double earlier = 0;  // and the earlier rows do receive gradient (the test can see a gradient)
    for (std::size_t j = 0; j <= t; ++j)
        for (std::size_t c = 0; c < D; ++c) earlier += std::abs(X.grad()(j, c));
    BOOST_TEST(earlier > 0.0);
}

BOOST_AUTO_TEST_CASE(a_fully_hidden_row_reads_nothing_and_passes_no_gradient) {
    std::mt19937_64 rng(15);
    // Row 1 hides every key (e.g. a padded query); rows 0 and 2 see some; no row sees key 1.
    const Tensor<double> M = Tensor<double>::matrix({{1, 0, 1}, {0, 0, 0}, {1, 0, 0}});
    Tape<double> tape;
    const Var<double> Q = tape.leaf(random_tensor(Shape{3, 2}, rng), "Q");
    const Var<double> K = tape.leaf(random_tensor(Shape{3, 2}, rng), "K");
    const Var<double> V = tape.leaf(random_tensor(Shape{3, 2}, rng), "V");
    const auto r = masked_attention(Q, K, V, M);
    for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(r.A.value()(1, j) == 0.0);
    for (std::size_t c = 0; c < 2; ++c) BOOST_TEST(r.O.value()(1, c) == 0.0);
    tape.backward(sum(r.O));
    for (std::size_t c = 0; c < 2; ++c) BOOST_TEST(Q.grad()(1, c) == 0.0);  // no NaN, no gradient
    for (std::size_t c = 0; c < 2; ++c) {  // a key nobody sees gets no gradient either
        BOOST_TEST(K.grad()(1, c) == 0.0);
        BOOST_TEST(V.grad()(1, c) == 0.0);
    }
    const CheckReport report = check_gradients(
        [&M](auto in) {
            const auto [Qm, Km, Vm] = in;
            return probe(masked_attention(Qm, Km, Vm, M).O);
        },
        {{"Q", Q.value()}, {"K", K.value()}, {"V", V.value()}});
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(a_single_position_attends_to_itself) {
    std::mt19937_64 rng(16);
    Tape<double> tape;
    const Var<double> Q = tape.leaf(random_tensor(Shape{1, 3}, rng), "Q");
    const Var<double> K = tape.leaf(random_tensor(Shape{1, 3}, rng), "K");
    const Var<double> V = tape.leaf(random_tensor(Shape{1, 2}, rng), "V");
    const auto r = causal_attention(Q, K, V);
    BOOST_TEST(r.A.value()(0, 0) == 1.0);
    BOOST_TEST((r.O.value() == V.value()));
    const CheckReport report = check_gradients(
        [](auto in) {
            const auto [Qs, Ks, Vs] = in;
            return probe(causal_attention(Qs, Ks, Vs).O);
        },
        {{"Q", Q.value()}, {"K", K.value()}, {"V", V.value()}});
    BOOST_TEST(report.passed, report.summary());
}

BOOST_AUTO_TEST_CASE(masks_reject_impossible_blocks_and_empty_sequences) {
    // Each refusal's message whole, with every number it names (a count swapped for another would
    // still throw), from each builder that checks the block.
    BOOST_TEST(message_of<shape_error>([] { causal_mask(3, 4, 2); }) ==
               "causal_mask: queries at absolute positions 2..4 (query_offset 2) need keys up to position 4, but "
               "there are only 4 keys");
    BOOST_TEST(message_of<shape_error>([] { causal_mask(0, 4); }) ==
               "causal_mask: 0 queries and 4 keys; both must be at least one");
    BOOST_TEST(message_of<shape_error>([] { causal_mask(2, 0); }) ==
               "causal_mask: 2 queries and 0 keys; both must be at least one");
    const std::vector<std::size_t> one = {2};
    BOOST_TEST(message_of<shape_error>([&] { padding_mask(one, 3, 5, 3); }) ==
               "padding_mask: queries at absolute positions 3..5 (query_offset 3) need keys up to position 5, but "
               "there are only 5 keys");
    BOOST_TEST(message_of<shape_error>([] { padding_mask({}, 2, 2); }) == "padding_mask: no sequence lengths given");
    BOOST_TEST(message_of<shape_error>([] { alibi_bias(0, 2, 2); }) == "alibi_bias: heads must be at least 1");
    // One head is a head: its bias is −m·|i − j| with m = 2^−8 (ALiBi's slope for one head).
    const Tensor<double> one_head = alibi_bias(1, 2, 3);
    BOOST_TEST((one_head.shape() == Shape{1, 2, 3}));
    BOOST_TEST(one_head[0] == 0.0);                   // query 0, key 0
    BOOST_TEST(one_head[2] == -2.0 / 256.0);          // query 0, key 2
    BOOST_TEST(one_head[3] == -1.0 / 256.0);          // query 1, key 0
    const std::vector<std::size_t> with_empty = {3, 0};
    const std::string message = message_of<value_error>([&] { padding_mask(with_empty, 3, 3); });
    BOOST_TEST(message.find("sequence 1 has length 0") != std::string::npos, message);
    const std::vector<std::size_t> too_long = {4};
    BOOST_CHECK_THROW(padding_mask(too_long, 3, 3), value_error);

    Tape<double> tape;
    const Var<double> Q = tape.leaf(Tensor<double>(Shape{3, 2}, 0.5));
    const Var<double> K = tape.leaf(Tensor<double>(Shape{4, 2}, 0.5));
    const Var<double> V = tape.leaf(Tensor<double>(Shape{4, 2}, 0.5));
    BOOST_CHECK_THROW(causal_attention(Q, K, V, 2), shape_error);
    BOOST_CHECK_THROW(causal_attention(Q, tape.leaf(Tensor<double>(Shape{4, 3}, 0.5)), V), shape_error);
    std::mt19937_64 generator(1);
    BOOST_CHECK_THROW(causal_attention(Q, K, V, 1, DropoutSettings{1.0, generator}), value_error);
}

BOOST_AUTO_TEST_CASE(padding_and_causality_combine_per_sequence) {
    const std::vector<std::size_t> lengths = {3, 1};
    const Tensor<double> M = padding_mask(lengths, 2, 3, 1, true);  // queries at positions 1 and 2
    // Sequence 0 (length 3): query 1 sees keys 0..1, query 2 sees 0..2.
    BOOST_TEST((M.at({0, 0, 0}) == 1 && M.at({0, 0, 1}) == 1 && M.at({0, 0, 2}) == 0));
    BOOST_TEST((M.at({0, 1, 2}) == 1));
    // Sequence 1 (length 1): both queries are padding: hidden rows.
    for (std::size_t i = 0; i < 2; ++i)
        for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(M.at({1, i, j}) == 0);
}
