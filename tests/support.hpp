// Helpers shared by the project's own tests, beyond the public drive they use (tapegrad_testing.hpp: the
// op tables' one-line checks, random tensors, the probe, the Boost.Test predicates): printing
// tensors in failed comparisons, exception messages and the misuse tables' runner, the first fault
// control, and the comparison of two reports of one graph.
#pragma once

#include "tapegrad_testing.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

namespace tapegrad {

// Boost.Test prints values of failed comparisons through operator<<.
template <Scalar T>
std::ostream& operator<<(std::ostream& out, const Tensor<T>& tensor) {
    return out << fmt::format("{}", tensor);
}

}  // namespace tapegrad

namespace tapegrad::testing {

// A fresh directory under the system temp dir (named by the test and the process), removed at the
// end of the test.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& name)
        : path(std::filesystem::temp_directory_path() / fmt::format("tapegrad_{}_{}", name, ::getpid())) {
        std::filesystem::remove_all(path);
        std::filesystem::create_directories(path);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

/// Every work split is tested at 1 to this many threads, odd counts too: a 16-core machine's default
/// is 16, where a split can have fewer blocks than workers (the tests' shapes make sure it does).
inline constexpr unsigned most_threads_tested = 16;

// The message of the `Exception` that f() throws, or a text saying none was thrown (which no
// test's expected words match).
template <class Exception, class F>
std::string message_of(F f) {
    try {
        f();
    } catch (const Exception& e) {
        return e.what();
    }
    return "(no exception of the expected type)";
}

// The misuse tables (tests/test_errors.cpp and the op families' files): one row per misuse, with
// the exception type it must raise and words its message must hold; Act is the row's action,
// which the table's test case calls on fresh inputs through expect_named_error.
enum class ErrorKind { shape, value, usage };

template <class Act>
struct Misuse {
    std::string what;
    ErrorKind kind;
    Act act;
    std::vector<std::string> words;  // each must appear in the message
};

// Calls `perform` (the row's action on fresh inputs): it must raise a tapegrad::error of the row's
// kind whose message holds each of the row's words.
template <class Act, class Perform>
void expect_named_error(const Misuse<Act>& row, Perform perform) {
    BOOST_TEST_CONTEXT(row.what) {
        bool caught = false;
        try {
            perform();
        } catch (const tapegrad::error& e) {
            caught = true;
            const std::string message = e.what();
            BOOST_TEST_MESSAGE(row.what << ": " << message);
            const bool right_kind = row.kind == ErrorKind::shape   ? dynamic_cast<const shape_error*>(&e) != nullptr
                                    : row.kind == ErrorKind::value ? dynamic_cast<const value_error*>(&e) != nullptr
                                                                   : dynamic_cast<const usage_error*>(&e) != nullptr;
            BOOST_TEST(right_kind, "wrong exception type for: " << message);
            for (const std::string& word : row.words) {
                BOOST_TEST(message.find(word) != std::string::npos, "'" << word << "' missing from: " << message);
            }
        }
        BOOST_TEST(caught, "no tapegrad::error raised");
    }
}

template <class V>
using scalar_of = typename std::decay_t<V>::scalar_type;

// The first fault control (tests/test_fault_controls.cpp; also checked over MPI and as a recorded
// tape): softmax whose VJP keeps only the numerator path, dS = A ∘ G, without − A ∘ rowsum(A ∘ G).
struct SoftmaxWithoutDenominator : Softmax {
    static constexpr std::string_view name = "softmax without denominator path";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dS) {
        for (std::size_t k = 0; k < at.out.size(); ++k) dS[k] = at.out[k] * at.G[k];
    }
};

// Max whose gradient goes to the LAST maximal element of each lane, where the library's goes to the
// first (NumPy's argmax); without ties it is Max. The tie convention's fault control
// (tests/test_reductions.cpp, in isolation; tests/test_kink_conventions.cpp, through a model).
struct MaxGradientToLastMaximal : Max {
    static constexpr std::string_view name = "max with the gradient to the last maximal element";
    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& X = *at.in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        dX.fill(T(0));
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            std::size_t j = lanes.dim - 1;
            while (j > 0 && X[first + j * lanes.stride()] != at.out[lane]) --j;
            dX[first + j * lanes.stride()] = at.G[lane];
        }
    }
};

// Restores the CPU level chosen at start-up when a test case that switches levels ends.
struct RestoreCpuLevel {
    CpuLevel saved = cpu_level();
    ~RestoreCpuLevel() { set_cpu_level(saved); }
};

// Sets the bfloat16 product's arithmetic for a test case, and restores the one before when it ends.
struct UseBf16Arithmetic {
    Bf16Arithmetic saved = bf16_arithmetic();
    explicit UseBf16Arithmetic(Bf16Arithmetic arithmetic) { set_bf16_arithmetic(arithmetic); }
    ~UseBf16Arithmetic() { set_bf16_arithmetic(saved); }
    UseBf16Arithmetic(const UseBf16Arithmetic&) = delete;
    UseBf16Arithmetic& operator=(const UseBf16Arithmetic&) = delete;
};

// The places a report names: its failing coordinates and branches, and the branch verdicts.
using Place = std::tuple<std::string, std::string, std::string>;
inline std::set<Place> failing_places(const CheckReport& r) {
    std::set<Place> places;
    for (const Mismatch& m : r.worst) places.insert({m.leaf, m.index, m.branch});
    return places;
}
inline std::set<Place> branch_verdicts(const CheckReport& r) {
    std::set<Place> verdicts;
    for (const BranchReport& b : r.branches) verdicts.insert({b.leaf, b.consumer, std::to_string(b.failures)});
    return verdicts;
}

// The recorded check and the generic-lambda check of one graph agree: verdict, mode, how many
// derivatives and failures, the coordinates named, the branches and their verdicts. Their double
// tapes are the same computation; their 50-digit functions differ by the double rounding of the
// recorded constants (1/√d: a relative 1.1e-16), which moves the 50-digit differences the double
// errors are measured against by as much (the errors are mixed, relative to max(1, |n|)): the
// double errors agree to 1e-15, ten such roundings.
inline void expect_same_report(const CheckReport& recorded, const CheckReport& generic) {
    BOOST_TEST_MESSAGE("recorded: " << recorded.summary() << "\ngeneric:  " << generic.summary());
    BOOST_TEST(recorded.passed == generic.passed);
    BOOST_TEST(recorded.mode == generic.mode);
    BOOST_TEST(recorded.coordinates == generic.coordinates);
    BOOST_TEST(recorded.failures == generic.failures);
    BOOST_TEST(recorded.kinks == generic.kinks);
    BOOST_TEST((failing_places(recorded) == failing_places(generic)));
    BOOST_TEST((branch_verdicts(recorded) == branch_verdicts(generic)));
    BOOST_TEST(std::abs(recorded.max_error_double - generic.max_error_double) <= 1e-15);
}

// Dimensions an op-table row builds its leaves from (batch, and a matrix chain m×k·k×n).
struct OpDims {
    std::size_t batch, m, k, n;
};

// One row of an op table: the op's name and its check on leaves of the given dimensions.
struct OpCase {
    std::string name;
    std::function<CheckReport(const OpDims&, std::mt19937_64&)> check;
};

// Runs every row of `table` on T = 1, non-square and a few seeded random dimensions (each at most
// `largest`), asserting that the checker passes at its fixed thresholds; prints each row's worst
// errors (--log_level=message).
inline void check_op_table(const std::vector<OpCase>& table, std::uint64_t seed, std::size_t largest) {
    std::vector<OpDims> dims = {{1, 1, 1, 1}, {2, 1, 3, 2}, {3, 4, 2, 5}};
    std::mt19937_64 shapes(seed);
    std::uniform_int_distribution<std::size_t> size(1, largest);
    for (int round = 0; round < 2; ++round) dims.push_back({size(shapes), size(shapes), size(shapes), size(shapes)});
    std::mt19937_64 values(seed + 1);
    std::string worst = "worst errors per row over its shapes: 50-digit tape (double tape), each against 50-digit "
                        "central differences\n";
    for (const OpCase& op : table) {
        double mp = 0, dbl = 0;
        for (const OpDims& d : dims) {
            BOOST_TEST_CONTEXT(op.name << " batch=" << d.batch << " m=" << d.m << " k=" << d.k << " n=" << d.n) {
                const CheckReport report = op.check(d, values);
                BOOST_TEST(report.passed, report.summary());
                BOOST_TEST(report.max_error_mp <= 1e-25);
                mp = std::max(mp, report.max_error_mp);
                dbl = std::max(dbl, report.max_error_double);
            }
        }
        worst += fmt::format("  {}: {:.2g} ({:.2g})\n", op.name, mp, dbl);
    }
    BOOST_TEST_MESSAGE(worst);
}

// A one-block transformer (width 8, 2 heads, context 4, 6 symbols) with seeded parameters and one
// sequence: what the re-run and saved-tape tests record by ordinary code.
struct SmallTransformer {
    TransformerConfig config = [] {
        TransformerConfig c;
        c.layers = 1, c.width = 8, c.heads = 2, c.context = 4, c.vocabulary = 6;
        return c;
    }();
    std::vector<Tensor<double>> values = [this] {
        std::mt19937_64 rng(7);
        std::vector<Tensor<double>> v;
        for (const Shape& shape : parameter_shapes(config)) v.push_back(random_tensor(shape, rng, 0.5));
        return v;
    }();
    std::vector<std::size_t> tokens{1, 4, 0, 5}, targets{4, 0, 5, 2};
};

// The names of the library's op structs (LibraryOps, ops/all.hpp) and "leaf": what a graph of every
// op records.
inline std::set<std::string> library_op_names() {
    std::set<std::string> names{"leaf"};
    for (const std::string_view name : LibraryOps::names) names.emplace(name);
    return names;
}

// "abs, exp" for the names of `expected` missing from `found`: what a coverage check names.
inline std::string missing_names(const std::set<std::string>& expected, const std::set<std::string>& found) {
    std::string missing;
    for (const std::string& name : expected)
        if (!found.contains(name)) missing += (missing.empty() ? "" : ", ") + name;
    return missing;
}

}  // namespace tapegrad::testing
