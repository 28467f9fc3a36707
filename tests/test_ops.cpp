// Every op through the one generic checker, on random shapes (non-square, T = 1, batched).
// Adding an op = adding one line to `op_table`.
#define BOOST_TEST_MODULE ops
#include "support.hpp"

#include <functional>

using namespace tapegrad;
using tapegrad::testing::check_op;

namespace {

struct Dims {
    std::size_t batch, m, k, n;
};

// A mask with a hidden position in every row that has more than one column, first column visible.
Tensor<double> visible_pattern(std::size_t m, std::size_t n) {
    Tensor<double> M(Shape{m, n}, 1.0);
    for (std::size_t i = 0; i < m; ++i)
        if (n > 1) M(i, (i + 1) % n == 0 ? 1 : (i + 1) % n) = 0.0;
    return M;
}

template <class V>
using scalar_of = typename std::decay_t<V>::scalar_type;

struct OpCase {
    std::string name;
    std::function<CheckReport(const Dims&, std::mt19937_64&)> check;
};

const std::vector<OpCase> op_table = {
    {"matmul", [](const Dims& d, auto& rng) { return check_op([](auto in) { return matmul(in[0], in[1]); }, rng, Shape{d.m, d.k}, Shape{d.k, d.n}); }},
    {"matmul batched", [](const Dims& d, auto& rng) { return check_op([](auto in) { return matmul(in[0], in[1]); }, rng, Shape{d.batch, d.m, d.k}, Shape{d.batch, d.k, d.n}); }},
    {"matmul shared B", [](const Dims& d, auto& rng) { return check_op([](auto in) { return matmul(in[0], in[1]); }, rng, Shape{d.batch, d.m, d.k}, Shape{d.k, d.n}); }},
    {"transpose", [](const Dims& d, auto& rng) { return check_op([](auto in) { return transpose(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"scale", [](const Dims& d, auto& rng) { return check_op([](auto in) { return scale(in[0], scalar_of<decltype(in[0])>(-0.37)); }, rng, Shape{d.m, d.n}); }},
    {"softmax", [](const Dims& d, auto& rng) { return check_op([](auto in) { return softmax(in[0]); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"add", [](const Dims& d, auto& rng) { return check_op([](auto in) { return add(in[0], in[1]); }, rng, Shape{d.m, d.n}, Shape{d.m, d.n}); }},
    {"mul", [](const Dims& d, auto& rng) { return check_op([](auto in) { return mul(in[0], in[1]); }, rng, Shape{d.m, d.n}, Shape{d.m, d.n}); }},
    {"mask then softmax", [](const Dims& d, auto& rng) { return check_op([&d](auto in) { return softmax(mask(in[0], in[0].tape().constant(tensor_cast<scalar_of<decltype(in[0])>>(visible_pattern(d.m, d.n))))); }, rng, Shape{d.batch, d.m, d.n}); }},
    {"sum", [](const Dims& d, auto& rng) { return check_op([](auto in) { return sum(in[0]); }, rng, Shape{d.m, d.n}); }},
};

// Shapes: T = 1, non-square, and a couple of random ones (seeded).
std::vector<Dims> shapes_to_try() {
    std::vector<Dims> dims = {{1, 1, 1, 1}, {2, 1, 3, 2}, {3, 4, 2, 5}};
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<std::size_t> size(1, 6);
    for (int round = 0; round < 2; ++round) dims.push_back({size(rng), size(rng), size(rng), size(rng)});
    return dims;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_op_passes_the_50_digit_checker) {
    std::mt19937_64 rng(7);
    for (const OpCase& op : op_table) {
        for (const Dims& d : shapes_to_try()) {
            BOOST_TEST_CONTEXT(op.name << " batch=" << d.batch << " m=" << d.m << " k=" << d.k << " n=" << d.n) {
                const CheckReport report = op.check(d, rng);
                BOOST_TEST(report.passed, report.summary());
                BOOST_TEST(report.max_error_mp <= 1e-25);
            }
        }
    }
}
