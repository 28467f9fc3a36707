// The fmt formatter for tensors and shapes: nesting at every rank, the precision option, and
// round-trip printing for float, double, long double and the 50-digit type.
#define BOOST_TEST_MODULE format
#include "support.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

using namespace tapegrad;

BOOST_AUTO_TEST_CASE(nests_brackets_at_every_rank) {
    BOOST_TEST(fmt::format("{}", Tensor<double>::scalar(2.5)) == "2.5");
    BOOST_TEST(fmt::format("{}", Tensor<double>(Shape{3}, 1.0)) == "[1, 1, 1]");
    BOOST_TEST(fmt::format("{}", Tensor<double>::matrix({{0.75, 0.25}, {0.25, 0.75}})) == "[[0.75, 0.25], [0.25, 0.75]]");
    Tensor<double> cube(Shape{2, 1, 2});
    for (std::size_t k = 0; k < cube.size(); ++k) cube[k] = double(k);
    BOOST_TEST(fmt::format("{}", cube) == "[[[0, 1]], [[2, 3]]]");
    BOOST_TEST(fmt::format("{}", Tensor<double>(Shape{1, 1, 1, 1}, -1.0)) == "[[[[-1]]]]");
    BOOST_TEST(fmt::format("{}", Tensor<double>(Shape{0, 3})) == "[[]]");
    BOOST_TEST(fmt::format("{}", Shape{2, 3}) == "[2x3]");
    BOOST_TEST(fmt::format("{}", Shape{}) == "[]");
}

BOOST_AUTO_TEST_CASE(precision_option_sets_significant_digits) {
    const Tensor<double> third = Tensor<double>::matrix({{1.0 / 3.0, -2.0 / 3.0}});
    BOOST_TEST(fmt::format("{:.3}", third) == "[[0.333, -0.667]]");
    BOOST_TEST(fmt::format("{:.0}", third) == fmt::format("{}", third));
    BOOST_TEST(fmt::format("{:.2}", Tensor<float>::scalar(0.125f)) == "0.12");
    const Tensor<mp50> third_mp = Tensor<mp50>::scalar(mp50(1) / 3);
    BOOST_TEST(fmt::format("{:.30}", third_mp) == "0." + std::string(30, '3'));
    BOOST_TEST(fmt::format("{:.4}", Tensor<long double>::scalar(2.0L / 3.0L)) == "0.6667");
}

BOOST_AUTO_TEST_CASE(default_output_reads_back_exactly) {
    std::mt19937_64 rng(3);
    const Tensor<double> values = testing::random_tensor(Shape{4, 4}, rng, 1e6);
    for (std::size_t k = 0; k < values.size(); ++k) {
        const std::string text = fmt::format("{}", Tensor<double>::scalar(values[k]));
        BOOST_TEST(std::strtod(text.c_str(), nullptr) == values[k]);
    }
    BOOST_TEST(fmt::format("{}", Tensor<float>::scalar(0.1f)) == "0.1");
    // 50-digit values print max_digits10 digits, enough to read back the same binary value.
    const mp50 x = mp50(2) / 7 + mp50(1e-40);
    const std::string text = fmt::format("{}", Tensor<mp50>::scalar(x));
    BOOST_TEST(mp50(text) == x);
    BOOST_TEST(text.size() >= 50u);
}

BOOST_AUTO_TEST_CASE(special_values_and_bad_specs) {
    const double inf = std::numeric_limits<double>::infinity();
    BOOST_TEST(fmt::format("{}", Tensor<double>::matrix({{-inf, 0.0}})) == "[[-inf, 0]]");
    BOOST_TEST(fmt::format("{}", Tensor<mp50>::scalar(mp50(-inf))) == "-inf");
    BOOST_CHECK_THROW((void)fmt::format(fmt::runtime("{:x}"), Tensor<double>::scalar(1.0)), fmt::format_error);
    BOOST_CHECK_THROW((void)fmt::format(fmt::runtime("{:.99999999999999}"), Tensor<double>::scalar(1.0)), fmt::format_error);
}
