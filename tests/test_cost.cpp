// Cost accounting: the tape reports, per node, the multiply-adds its op performs (forward and
// VJPs) and the bytes it holds. Single-head attention must cost what the spec counts: scores
// Q·Kᵀ take T·T'·d multiply-adds, the weighted read A·V takes T·T'·r, and the T·T' weights are
// stored (T' = number of keys; T' = T for self-attention).
#define BOOST_TEST_MODULE cost
#include "support.hpp"

using namespace tapegrad;

namespace {

// The node whose label is `label` (attention names S, A, O).
template <Scalar T>
NodeInfo node_named(const Tape<T>& tape, std::string_view label) {
    for (std::size_t i = 0; i < tape.size(); ++i)
        if (tape.info(i).label == label) return tape.info(i);
    BOOST_FAIL("no node named " << label);
    return tape.info(0);
}

struct Sizes {
    std::size_t T, keys, D, d, r;
};

}  // namespace

BOOST_AUTO_TEST_CASE(attention_costs_what_the_spec_counts) {
    std::mt19937_64 rng(5);
    // Distinct sizes, so a cost that swaps two of them (T²r for T²d, T·d for T·T') is caught.
    for (const Sizes z : {Sizes{2, 2, 2, 2, 2}, Sizes{5, 5, 3, 4, 2}, Sizes{7, 3, 6, 5, 9}}) {
        BOOST_TEST_CONTEXT("T=" << z.T << " T'=" << z.keys << " D=" << z.D << " d=" << z.d << " r=" << z.r) {
            Tape<double> tape;
            const Var<double> Q = tape.leaf(testing::random_tensor({z.T, z.d}, rng), "Q");
            const Var<double> K = tape.leaf(testing::random_tensor({z.keys, z.d}, rng), "K");
            const Var<double> V = tape.leaf(testing::random_tensor({z.keys, z.r}, rng), "V");
            const AttentionResult<double> result = attention_from_qkv(Q, K, V);

            // S = scale(matmul(Q, Kᵀ)): the scores' product is the scale node's input.
            const NodeInfo S = node_named(tape, "S");
            const NodeInfo scores = tape.info(S.inputs[0]);
            BOOST_TEST(scores.op == "matmul");
            BOOST_TEST(scores.cost.forward_madds == z.T * z.keys * z.d);
            BOOST_TEST(scores.cost.backward_madds == 2 * z.T * z.keys * z.d);  // dQ = G·K, dKᵀ = Qᵀ·G

            const NodeInfo O = node_named(tape, "O");
            BOOST_TEST(O.op == "matmul");
            BOOST_TEST(O.cost.forward_madds == z.T * z.keys * z.r);
            BOOST_TEST(O.cost.backward_madds == 2 * z.T * z.keys * z.r);

            // The weights: T·T' values held (softmax saves nothing beyond its output).
            const NodeInfo A = node_named(tape, "A");
            BOOST_TEST(A.op == "softmax");
            BOOST_TEST(A.bytes == z.T * z.keys * sizeof(double));
            // After backward the node also holds its gradient dA, of the same size.
            tape.backward(testing::probe(result.O));
            BOOST_TEST(node_named(tape, "A").bytes == 2 * z.T * z.keys * sizeof(double));
        }
    }
}

BOOST_AUTO_TEST_CASE(projections_cost_T_D_d_and_bytes_follow_the_scalar_type) {
    const std::size_t T = 4, D = 6, d = 3;
    std::mt19937_64 rng(6);
    const Tensor<double> x = testing::random_tensor({T, D}, rng), w = testing::random_tensor({D, d}, rng);
    Tape<double> in_double;
    const Var<double> Q = matmul(in_double.leaf(x), in_double.leaf(w));
    BOOST_TEST(in_double.info(Q.index()).cost.forward_madds == T * D * d);
    BOOST_TEST(in_double.info(Q.index()).bytes == T * d * sizeof(double));
    Tape<mp50> in_mp;
    const Var<mp50> Q_mp = matmul(in_mp.leaf(tensor_cast<mp50>(x)), in_mp.leaf(tensor_cast<mp50>(w)));
    BOOST_TEST(in_mp.info(Q_mp.index()).bytes == T * d * sizeof(mp50));
    // A batch of B products with one shared W costs B times one product.
    const std::size_t B = 3;
    Tape<double> batched;
    const Var<double> Y = matmul(batched.leaf(testing::random_tensor({B, T, D}, rng)), batched.leaf(w));
    BOOST_TEST(batched.info(Y.index()).cost.forward_madds == B * T * D * d);
}
