// End-to-end tests of the tapegrad-attention tool: it is run on .npy files this test writes, its
// outputs are compared with the same graph computed here through the library, --check must pass
// on correct inputs, and every bad input must give a one-line error, a non-zero exit, and no
// output files at all.
#define BOOST_TEST_MODULE cli
#include "support.hpp"

#include "io/npy.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#ifndef TAPEGRAD_ATTENTION_TOOL
#error "tools/CMakeLists.txt defines TAPEGRAD_ATTENTION_TOOL (the tool's path) for this test"
#endif

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

struct Run {
    int status;
    std::string out, err;
};

std::string read_text(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// A scratch directory per test case with inputs/ and outputs/ below it.
struct Workspace {
    fs::path root, inputs, outputs;
    explicit Workspace(const std::string& name)
        : root(fs::temp_directory_path() / fmt::format("tapegrad_cli_{}_{}", name, ::getpid())),
          inputs(root / "in"),
          outputs(root / "out") {
        fs::remove_all(root);
        fs::create_directories(inputs);
    }
    ~Workspace() { fs::remove_all(root); }

    Run run(const std::string& arguments) const {
        const std::string command = fmt::format("'{}' {} >'{}' 2>'{}'", TAPEGRAD_ATTENTION_TOOL, arguments,
                                                (root / "stdout").string(), (root / "stderr").string());
        const int raw = std::system(command.c_str());
        return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_text(root / "stdout"), read_text(root / "stderr")};
    }
    std::string standard_args() const {
        return fmt::format("--inputs '{}' --outputs '{}'", inputs.string(), outputs.string());
    }
    bool outputs_empty() const { return !fs::exists(outputs) || fs::is_empty(outputs); }
};

struct Problem {
    Tensor<double> X, Wq, Wk, Wv, G;
};

Problem random_problem(std::size_t T, std::size_t D, std::size_t d, std::size_t r, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    return {testing::random_tensor(Shape{T, D}, rng), testing::random_tensor(Shape{D, d}, rng),
            testing::random_tensor(Shape{D, d}, rng), testing::random_tensor(Shape{D, r}, rng),
            testing::random_tensor(Shape{T, r}, rng)};
}

void save(const Workspace& w, const Problem& p) {
    save_npy(w.inputs / "X.npy", p.X);
    save_npy(w.inputs / "Wq.npy", p.Wq);
    save_npy(w.inputs / "Wk.npy", p.Wk);
    save_npy(w.inputs / "Wv.npy", p.Wv);
    save_npy(w.inputs / "G.npy", p.G);
}

bool one_line_error(const Run& run) {
    return run.err.rfind("tapegrad-attention: ", 0) == 0 && run.err.find('\n') == run.err.size() - 1;
}

void expect_bitwise_equal(const Tensor<double>& a, const Tensor<double>& b, const std::string& what) {
    BOOST_TEST_CONTEXT(what) {
        BOOST_TEST((a.shape() == b.shape()));
        if (!(a.shape() == b.shape())) return;
        for (std::size_t k = 0; k < a.size(); ++k) BOOST_TEST(a[k] == b[k]);
    }
}

// The reference: the same graph through the library, on a double tape.
void expect_outputs_match(const Workspace& w, const Problem& p, bool causal) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(p.X), Wq = tape.leaf(p.Wq), Wk = tape.leaf(p.Wk), Wv = tape.leaf(p.Wv);
    const AttentionResult<double> attended = causal ? causal_attention(X, Wq, Wk, Wv) : attention(X, Wq, Wk, Wv);
    const Var<double> A = attended.A, O = attended.O;
    const Var<double> J = sum(mul(O, tape.constant(p.G)));
    tape.backward(J);
    expect_bitwise_equal(load_npy(w.outputs / "O.npy"), O.value(), "O");
    expect_bitwise_equal(load_npy(w.outputs / "A.npy"), A.value(), "A");
    expect_bitwise_equal(load_npy(w.outputs / "J.npy"), J.value(), "J");
    BOOST_TEST(load_npy(w.outputs / "J.npy").rank() == 0u);  // a 0-d array
    expect_bitwise_equal(load_npy(w.outputs / "dX.npy"), X.grad(), "dX");
    expect_bitwise_equal(load_npy(w.outputs / "dWq.npy"), Wq.grad(), "dWq");
    expect_bitwise_equal(load_npy(w.outputs / "dWk.npy"), Wk.grad(), "dWk");
    expect_bitwise_equal(load_npy(w.outputs / "dWv.npy"), Wv.grad(), "dWv");
}

}  // namespace

BOOST_AUTO_TEST_CASE(help_and_usage_errors) {
    const Workspace w("usage");
    const Run help = w.run("--help");
    BOOST_TEST(help.status == 0);
    for (const char* word : {"--inputs", "--outputs", "--causal", "--check", "--fast", "X.npy", "Wq.npy", "Wk.npy",
                             "Wv.npy", "G.npy", "dWv.npy", "J.npy (0-d)", "Exit status"}) {
        BOOST_TEST(help.out.find(word) != std::string::npos, "--help should mention " << word);
    }
    for (const std::string& args : std::vector<std::string>{"", "--bogus", "--inputs", fmt::format("--inputs '{}'", w.inputs.string()),
                                   fmt::format("--inputs '{}' --outputs o --fast", w.inputs.string())}) {
        BOOST_TEST_CONTEXT("arguments: " << args) {
            const Run run = w.run(args);
            BOOST_TEST(run.status == 2);
            BOOST_TEST(one_line_error(run), run.err);
        }
    }
}

BOOST_AUTO_TEST_CASE(outputs_match_the_library_and_check_passes) {
    for (const bool causal : {false, true}) {
        BOOST_TEST_CONTEXT("causal " << causal) {
            const Workspace w(causal ? "causal" : "plain");
            const Problem p = random_problem(4, 3, 2, 5, causal ? 2 : 1);
            save(w, p);
            const Run run = w.run(w.standard_args() + (causal ? " --causal" : "") + " --check");
            BOOST_TEST(run.status == 0, run.err);
            BOOST_TEST(run.out.find("gradcheck passed") != std::string::npos, run.out);
            BOOST_TEST(run.err.empty());
            expect_outputs_match(w, p, causal);
            if (causal) {  // query 0 sees only key 0
                const Tensor<double> A = load_npy(w.outputs / "A.npy");
                BOOST_TEST(A(0, 0) == 1.0);
                BOOST_TEST(A(0, 3) == 0.0);
            }
            // No temporary files are left behind.
            std::size_t files = 0;
            for (const auto& entry : fs::directory_iterator(w.outputs)) {
                ++files;
                BOOST_TEST(entry.path().extension() == ".npy");
            }
            BOOST_TEST(files == 7u);
        }
    }
    // --check alone writes nothing; --fast runs the fast mode; float32 inputs are accepted.
    const Workspace w("check_only");
    Problem p = random_problem(3, 2, 2, 2, 9);
    save(w, p);
    save_npy(w.inputs / "X.npy", p.X, NpyDtype::float32);
    const Run run = w.run(fmt::format("--inputs '{}' --check --fast", w.inputs.string()));
    BOOST_TEST(run.status == 0, run.err);
    BOOST_TEST(run.out.find("fast mode") != std::string::npos, run.out);
    BOOST_TEST(w.outputs_empty());
}

// Each bad input: one line on stderr naming the fault, exit status 1, no outputs.
BOOST_AUTO_TEST_CASE(bad_inputs_fail_cleanly_without_outputs) {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    struct Case {
        std::string name;
        std::function<void(const Workspace&, Problem&)> spoil;  // runs after the good inputs are saved
        std::string message;
    };
    const std::vector<Case> cases = {
        {"missing X", [](const Workspace& w, Problem&) { fs::remove(w.inputs / "X.npy"); }, "cannot open"},
        {"not npy", [](const Workspace& w, Problem&) { std::ofstream(w.inputs / "Wq.npy") << "x,y\n1,2\n"; }, "bad magic"},
        {"truncated data", [](const Workspace& w, Problem&) { fs::resize_file(w.inputs / "Wk.npy", fs::file_size(w.inputs / "Wk.npy") - 3); }, "truncated data"},
        {"Wk rows differ", [](const Workspace& w, Problem& p) { save_npy(w.inputs / "Wk.npy", Tensor<double>(Shape{p.X.cols() + 1, 2}, 0.5)); }, "Wk.npy has shape [4x2] but X.npy is [4x3]"},
        {"Wq Wk widths differ", [](const Workspace& w, Problem& p) { save_npy(w.inputs / "Wq.npy", Tensor<double>(Shape{p.X.cols(), 3}, 0.5)); }, "queries and keys need one width d"},
        {"G wrong shape", [](const Workspace& w, Problem&) { save_npy(w.inputs / "G.npy", Tensor<double>(Shape{4, 4}, 1.0)); }, "G.npy has shape [4x4] but O is [4x5]"},
        {"X rank 3", [](const Workspace& w, Problem&) { save_npy(w.inputs / "X.npy", Tensor<double>(Shape{1, 4, 3}, 1.0)); }, "X.npy: expected a 2-d array, got shape [1x4x3]"},
        {"X empty", [](const Workspace& w, Problem&) { save_npy(w.inputs / "X.npy", Tensor<double>(Shape{0, 3})); }, "X.npy: empty array"},
        {"NaN in X", [nan](const Workspace& w, Problem& p) { p.X(1, 2) = nan; save_npy(w.inputs / "X.npy", p.X); }, "X.npy: non-finite value nan at (1, 2)"},
        {"inf in Wv", [inf](const Workspace& w, Problem& p) { p.Wv(0, 0) = -inf; save_npy(w.inputs / "Wv.npy", p.Wv); }, "Wv.npy: non-finite value -inf at (0, 0)"},
        {"int dtype", [](const Workspace& w, Problem&) {
             std::string bytes = npy_bytes(Tensor<double>(Shape{4, 5}));
             bytes.replace(bytes.find("<f8"), 3, "<i8");
             std::ofstream(w.inputs / "G.npy", std::ios::binary) << bytes;
         }, "dtype '<i8' is not supported"},
        {"Fortran order", [](const Workspace& w, Problem&) {
             std::string bytes = npy_bytes(Tensor<double>(Shape{4, 5}));
             bytes.replace(bytes.find("False"), 5, "True ");
             std::ofstream(w.inputs / "G.npy", std::ios::binary) << bytes;
         }, "Fortran-order"},
        {"absurd shape", [](const Workspace& w, Problem&) {
             std::string bytes = npy_bytes(Tensor<double>(Shape{4, 5}));
             bytes.replace(bytes.find("(4, 5)"), 6, "(4000000000, 5000000000)");
             std::ofstream(w.inputs / "G.npy", std::ios::binary) << bytes;
         }, "absurd shape"},
        {"huge scores", [](const Workspace& w, Problem& p) { p.X.fill(1e200); p.Wq.fill(1.0); p.Wk.fill(1.0); save(w, p); }, "softmax: score inf"},
    };
    for (const Case& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            const Workspace w("bad");
            Problem p = random_problem(4, 3, 2, 5, 3);
            save(w, p);
            c.spoil(w, p);
            const Run run = w.run(w.standard_args());
            BOOST_TEST_MESSAGE(c.name << " -> exit " << run.status << ": " << run.err);
            BOOST_TEST(run.status == 1);
            BOOST_TEST(one_line_error(run), run.err);
            BOOST_TEST(run.err.find(c.message) != std::string::npos, run.err);
            BOOST_TEST(w.outputs_empty());
        }
    }
}

BOOST_AUTO_TEST_CASE(unusable_output_directory_leaves_nothing) {
    const Workspace w("outdir");
    save(w, random_problem(2, 2, 2, 2, 4));
    std::ofstream(w.root / "a_file") << "not a directory";
    const Run run = w.run(fmt::format("--inputs '{}' --outputs '{}'", w.inputs.string(), (w.root / "a_file").string()));
    BOOST_TEST(run.status == 1);
    BOOST_TEST(one_line_error(run), run.err);
    BOOST_TEST(run.err.find("is not a directory") != std::string::npos, run.err);
    // Existing outputs are not touched by a failing run.
    fs::create_directories(w.outputs);
    std::ofstream(w.outputs / "O.npy") << "previous";
    fs::remove(w.inputs / "G.npy");
    BOOST_TEST(w.run(w.standard_args()).status == 1);
    BOOST_TEST(read_text(w.outputs / "O.npy") == "previous");
    BOOST_TEST(std::distance(fs::directory_iterator(w.outputs), fs::directory_iterator{}) == 1);
}
