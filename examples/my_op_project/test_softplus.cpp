// The Boost.Test suite of this project's op, with tapegrad's own drive (tapegrad_testing.hpp): its
// table row (the checker through a probe, an explicit seed on its own output at 50 digits, the JVP
// and HVP columns, the tape saved and loaded again), a seeded check of its VJP alone on inputs
// where it saturates, a recorded tape that uses it inside a graph (checked, audited, saved and
// checked again from the file), and a fault control that proves these checks can fail.
#define BOOST_TEST_MODULE softplus
#include <tapegrad_testing.hpp>

#include "my_ops/softplus.hpp"

#include <random>

using namespace tapegrad;
using tapegrad::testing::check_op;
using tapegrad::testing::check_op_seeded;
using tapegrad::testing::passed;
using tapegrad::testing::rejects;

namespace {

// The one registration: the op's siblings (at 50 digits and in the duals, which the checks re-run
// the recorded tape in) and its saved form ("user:softplus" in a tape file).
const bool softplus_registered = register_op<my_ops::Softplus>();

// A broken variant, kept in this test only: the VJP forgets that σ saturates and uses e^a.
struct SoftplusWithExpDerivative : my_ops::Softplus {
    static constexpr std::string_view name = "softplus with e^a as its derivative";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        using std::exp;
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * T(exp((*at.in[0])[k]));
    }
};
const bool broken_registered = register_siblings<SoftplusWithExpDerivative>();

const auto softplus_op = [](auto x) { return my_ops::softplus(x[0]); };
const auto broken_op = [](auto x) { return x[0].tape().template record<SoftplusWithExpDerivative>({x[0]}); };

}  // namespace

BOOST_AUTO_TEST_CASE(softplus_table_row) {
    BOOST_TEST(softplus_registered);
    std::mt19937_64 rng(1);
    BOOST_TEST(passed(check_op(softplus_op, rng, Shape{3, 4})));
    BOOST_TEST(passed(check_op(softplus_op, rng, Shape{2, 3, 5})));
}

// Far into both tails: σ(±30) is 1 − 9e-14 and 9e-14, where a careless derivative goes wrong.
BOOST_AUTO_TEST_CASE(softplus_seeded_in_its_tails) {
    std::mt19937_64 rng(2);
    const std::array<Tensor<double>, 1> tails{Tensor<double>(Shape{1, 4}, std::vector<double>{-30, -3, 3, 30})};
    BOOST_TEST(passed(check_op_seeded(softplus_op, rng, tails)));
}

// Inside a graph, recorded by ordinary code and checked as it ran; then saved (as
// "user:softplus") and loaded again: the same values, and the loaded tape passes the same check;
// the precision audit takes the op like any other.
BOOST_AUTO_TEST_CASE(softplus_in_a_recorded_graph_checked_saved_loaded_and_audited) {
    std::mt19937_64 rng(3);
    Tape<double> tape;
    const auto X = tape.leaf(testing::random_tensor(Shape{4, 3}, rng), "X");
    const auto W = tape.leaf(testing::random_tensor(Shape{3, 2}, rng), "W");
    const Var<double> J = sum(my_ops::softplus(matmul(X, W)));
    BOOST_TEST(passed(check_gradients(tape, J)));
    const std::string text = tape_file_text(tape, J);
    BOOST_TEST(text.find("\"user:softplus\"") != std::string::npos);
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(text, "softplus tape", loaded);
    BOOST_TEST(J_loaded.value()[0] == J.value()[0]);
    BOOST_TEST(passed(check_gradients(loaded, J_loaded)));
    const PrecisionAudit audit = audit_precision(loaded, J_loaded);
    BOOST_TEST(audit.events.empty());
    BOOST_TEST(audit.table().find("softplus") != std::string::npos);
}

// The fault control: on the same leaves the correct op passes and the broken one fails.
BOOST_AUTO_TEST_CASE(softplus_fault_control_is_rejected) {
    BOOST_TEST(broken_registered);
    std::mt19937_64 rng(4);
    BOOST_TEST(rejects(softplus_op, broken_op, rng, Shape{3, 4}));
}
