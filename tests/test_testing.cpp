// The public test drive (tapegrad_testing.hpp) itself: passed() carries the checker's report as
// its failure message, rejected() and rejects() say when a fault control slipped through, and
// each predicate can fail (a correct op offered as its own fault control is not rejected).
#define BOOST_TEST_MODULE testing_header
#include "support.hpp"

#include <random>
#include <string>

using namespace tapegrad;
using namespace tapegrad::testing;

namespace {

const auto softmax_op = [](auto x) { return softmax(x[0]); };
const auto broken_softmax_op = [](auto x) { return x[0].tape().template record<SoftmaxWithoutDenominator>({x[0]}); };
const bool broken_registered = register_siblings<SoftmaxWithoutDenominator>();

std::string message_text(const boost::test_tools::predicate_result& result) {
    const auto text = result.message();  // empty when no message was written
    return std::string(text.begin(), text.end());
}

}  // namespace

BOOST_AUTO_TEST_CASE(passed_carries_the_report_as_its_message) {
    BOOST_TEST(broken_registered);
    std::mt19937_64 rng(1);
    const CheckReport good = check_op(softmax_op, rng, Shape{2, 3});
    const boost::test_tools::predicate_result ok = passed(good);
    BOOST_TEST(static_cast<bool>(ok));
    BOOST_TEST(message_text(ok).empty());
    const CheckReport bad = check_op(broken_softmax_op, rng, Shape{2, 3});
    const boost::test_tools::predicate_result failed = passed(bad);
    BOOST_TEST(!static_cast<bool>(failed));
    const std::string message = message_text(failed);
    BOOST_TEST(message.find("gradcheck FAILED") != std::string::npos, message);
    BOOST_TEST(message.find("seed") != std::string::npos, message);
    BOOST_TEST(message.find("leaf x0 index") != std::string::npos, message);  // the worst coordinates
}

BOOST_AUTO_TEST_CASE(rejected_and_rejects_say_when_a_fault_control_slips_through) {
    std::mt19937_64 rng(2);
    const CheckReport good = check_op(softmax_op, rng, Shape{2, 3});
    BOOST_TEST(!static_cast<bool>(rejected(good)));
    BOOST_TEST(message_text(rejected(good)).find("deliberately broken variant passed") != std::string::npos);
    BOOST_TEST(static_cast<bool>(rejects(softmax_op, broken_softmax_op, rng, Shape{2, 3})));
    // The correct op offered as its own fault control: not rejected, and the message says so.
    const boost::test_tools::predicate_result same = rejects(softmax_op, softmax_op, rng, Shape{2, 3});
    BOOST_TEST(!static_cast<bool>(same));
    BOOST_TEST(message_text(same).find("broken variant passed its check") != std::string::npos, message_text(same));
    // The broken op offered as the correct one: its failure is named too.
    const boost::test_tools::predicate_result swapped = rejects(broken_softmax_op, broken_softmax_op, rng, Shape{2, 3});
    BOOST_TEST(message_text(swapped).find("the correct op failed its check") != std::string::npos,
               message_text(swapped));
}
