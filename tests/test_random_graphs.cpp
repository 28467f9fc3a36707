// Random-graph testing: a seeded generator composes random chains and DAGs of ops (matmul,
// transpose, scale, softmax, mask+softmax, add, mul) on random compatible shapes, with shared
// inputs and repeated use of a value (x·x, a + a, one leaf feeding several ops), ends each in
// the probe J = Σ Y ∘ G, and runs the full 50-digit checker on every graph.
//
// CI runs 200 graphs (a few seconds). More, or other seeds:
//     TAPEGRAD_RANDOM_GRAPHS=5000 TAPEGRAD_RANDOM_SEED=1 ./build/tests/test_random_graphs
// A failing graph is printed as its recipe ("n3 = matmul(x0, n2) [2x4]; ...") with its seed,
// so it can be replayed alone with TAPEGRAD_RANDOM_GRAPHS=1 TAPEGRAD_RANDOM_SEED=<seed>.
#define BOOST_TEST_MODULE random_graphs
#include "support.hpp"

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

using namespace tapegrad;

namespace {

constexpr std::size_t leaf_count = 3;

enum class StepOp { matmul, transpose, scale, softmax, masked_softmax, add, mul };
constexpr std::array op_names = {"matmul", "transpose", "scale", "softmax", "masked_softmax", "add", "mul"};

// One step of a recipe: an op applied to earlier values (leaves are 0..leaf_count-1).
struct Step {
    StepOp op = StepOp::matmul;
    std::size_t a = 0, b = 0;
    double factor = 1;           // scale
    Tensor<double> pattern;      // masked_softmax: 0 hidden, 1 visible (a row may be hidden entirely)
};

struct Recipe {
    std::uint64_t seed;
    std::array<Shape, leaf_count> leaf_shapes;
    std::vector<Step> steps;
    std::vector<Shape> shapes;  // of every value: leaves, then one per step

    std::string describe() const {
        std::string text = fmt::format("seed {}:", seed);
        for (std::size_t l = 0; l < leaf_count; ++l) text += fmt::format(" x{} {};", l, shapes[l].to_string());
        auto name = [](std::size_t v) { return v < leaf_count ? fmt::format("x{}", v) : fmt::format("n{}", v); };
        for (std::size_t s = 0; s < steps.size(); ++s) {
            const Step& step = steps[s];
            const bool binary = step.op == StepOp::matmul || step.op == StepOp::add || step.op == StepOp::mul;
            text += fmt::format(" {} = {}({}{}{}) {};", name(leaf_count + s), op_names[static_cast<int>(step.op)],
                                name(step.a), binary ? ", " + name(step.b) : "",
                                step.op == StepOp::scale ? fmt::format(", {:.3}", step.factor) : "",
                                shapes[leaf_count + s].to_string());
        }
        return text + " J = probe(last)";
    }
};

// Draws a recipe: 1 to 6 steps, each on operands chosen among all earlier values (so values are
// shared and reused), leaves of 1 to 3 rows and columns so that matmul finds partners.
Recipe draw(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto uniform = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>(lo, hi)(rng); };
    Recipe r{seed, {}, {}, {}};
    for (std::size_t l = 0; l < leaf_count; ++l) {
        r.leaf_shapes[l] = Shape{uniform(1, 3), uniform(1, 3)};
        r.shapes.push_back(r.leaf_shapes[l]);
    }
    const std::size_t steps = uniform(1, 6);
    while (r.steps.size() < steps) {
        Step step;
        step.op = static_cast<StepOp>(uniform(0, op_names.size() - 1));
        // Favour recent values so graphs grow deep as well as wide.
        const std::size_t values = r.shapes.size();
        step.a = uniform(0, 2) == 0 ? uniform(0, values - 1) : values - 1 - uniform(0, std::min<std::size_t>(values - 1, 2));
        const Shape& a = r.shapes[step.a];
        std::vector<std::size_t> partners;
        for (std::size_t v = 0; v < values; ++v) {
            const Shape& b = r.shapes[v];
            if (step.op == StepOp::matmul ? b.rows() == a.cols() : b == a) partners.push_back(v);
        }
        Shape out = a;
        switch (step.op) {
            case StepOp::matmul:
            case StepOp::add:
            case StepOp::mul:
                if (partners.empty()) continue;  // draw another op
                step.b = partners[uniform(0, partners.size() - 1)];
                if (step.op == StepOp::matmul) out = Shape{a.rows(), r.shapes[step.b].cols()};
                break;
            case StepOp::transpose: out = Shape{a.cols(), a.rows()}; break;
            case StepOp::scale: step.factor = std::uniform_real_distribution<double>(-2, 2)(rng); break;
            case StepOp::softmax: break;
            case StepOp::masked_softmax:
                step.pattern = Tensor<double>(a);
                for (double& m : step.pattern.data()) m = uniform(0, 3) == 0 ? 0.0 : 1.0;  // some rows may be fully hidden
                break;
        }
        r.steps.push_back(step);
        r.shapes.push_back(out);
    }
    return r;
}

// The recipe as a graph over any scalar type, for the checker.
struct Graph {
    const Recipe* recipe;
    template <class Leaves>
    auto operator()(Leaves leaves) const {
        using V = typename Leaves::value_type;
        using T = typename V::scalar_type;
        std::vector<V> values(leaves.begin(), leaves.end());
        Tape<T>& tape = leaves[0].tape();
        for (const Step& step : recipe->steps) {
            const V& a = values[step.a];
            switch (step.op) {
                case StepOp::matmul: values.push_back(matmul(a, values[step.b])); break;
                case StepOp::add: values.push_back(add(a, values[step.b])); break;
                case StepOp::mul: values.push_back(mul(a, values[step.b])); break;
                case StepOp::transpose: values.push_back(transpose(a)); break;
                case StepOp::scale: values.push_back(scale(a, T(step.factor))); break;
                case StepOp::softmax: values.push_back(softmax(a)); break;
                case StepOp::masked_softmax:
                    values.push_back(softmax(mask(a, tape.constant(tensor_cast<T>(step.pattern)))));
                    break;
            }
        }
        return testing::probe(values.back());
    }
};

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_graphs_pass_the_50_digit_checker) {
    const std::uint64_t count = env_or("TAPEGRAD_RANDOM_GRAPHS", 200);
    const std::uint64_t first_seed = env_or("TAPEGRAD_RANDOM_SEED", 1000);
    tapegrad::set_threads(1);  // the graphs are tiny; threads would cost more than they save
    std::map<std::string, std::size_t> op_uses;
    std::size_t shared = 0, failed = 0, coordinates = 0;
    double worst_mp = 0, worst_double = 0;
    for (std::uint64_t g = 0; g < count; ++g) {
        const Recipe recipe = draw(first_seed + g);
        for (const Step& step : recipe.steps) ++op_uses[op_names[static_cast<int>(step.op)]];
        std::vector<std::size_t> uses(recipe.shapes.size());
        for (const Step& step : recipe.steps) {
            ++uses[step.a];
            const bool binary = step.op == StepOp::matmul || step.op == StepOp::add || step.op == StepOp::mul;
            if (binary) ++uses[step.b];
        }
        if (std::any_of(uses.begin(), uses.end(), [](std::size_t u) { return u > 1; })) ++shared;

        std::mt19937_64 rng(recipe.seed);
        const NamedTensor leaves[] = {{"x0", testing::random_tensor(recipe.leaf_shapes[0], rng)},
                                      {"x1", testing::random_tensor(recipe.leaf_shapes[1], rng)},
                                      {"x2", testing::random_tensor(recipe.leaf_shapes[2], rng)}};
        const CheckReport report = check_gradients(Graph{&recipe}, leaves);
        coordinates += report.coordinates;
        worst_mp = std::max(worst_mp, report.max_error_mp);
        worst_double = std::max(worst_double, report.max_error_double);
        if (!report.passed) {
            ++failed;
            BOOST_ERROR(recipe.describe() << "\n" << report.summary());
        }
    }
    std::string ops;
    for (const auto& [name, n] : op_uses) ops += fmt::format(" {} {},", name, n);
    BOOST_TEST_MESSAGE(fmt::format("{} random graphs (seeds {}..{}), {} with a value used more than once; {} failed; "
                                   "{} derivatives; worst error 50-digit {:.3g}, double {:.3g}; ops:{}",
                                   count, first_seed, first_seed + count - 1, shared, failed, coordinates, worst_mp,
                                   worst_double, ops));
    BOOST_TEST(failed == 0u);
    // The generator must actually produce shared values and every op, or the test proves little.
    if (count >= 200) {
        BOOST_TEST(shared >= count / 4);
        BOOST_TEST(op_uses.size() == op_names.size());
    }
}

// A sample of the random graphs recorded on a Tape<double> by running the recipe once, checked as
// recorded (check/recorded.hpp): the verdicts and coordinates of the generic-lambda check above.
BOOST_AUTO_TEST_CASE(recorded_random_graphs_check_like_the_generic_lambda) {
    const std::uint64_t count = env_or("TAPEGRAD_RANDOM_RECORDED_GRAPHS", 40);
    tapegrad::set_threads(1);
    for (std::uint64_t g = 0; g < count; ++g) {
        const Recipe recipe = draw(7000 + g);
        std::mt19937_64 rng(recipe.seed);
        const NamedTensor leaves[] = {{"x0", testing::random_tensor(recipe.leaf_shapes[0], rng)},
                                      {"x1", testing::random_tensor(recipe.leaf_shapes[1], rng)},
                                      {"x2", testing::random_tensor(recipe.leaf_shapes[2], rng)}};
        Tape<double> tape;
        std::array<Var<double>, leaf_count> vars;
        for (std::size_t l = 0; l < leaf_count; ++l) vars[l] = tape.leaf(leaves[l].value, leaves[l].name);
        const Var<double> J = Graph{&recipe}(vars);
        BOOST_TEST_CONTEXT(recipe.describe()) {
            testing::expect_same_report(check_gradients(tape, J), check_gradients(Graph{&recipe}, leaves));
        }
    }
}
