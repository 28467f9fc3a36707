// DOT export of a tape: one node per recorded value with its op and shape, leaves and constants
// marked, one edge per op input; the attention graph's structure read back from the text; and,
// when Graphviz's `dot` is installed, the text must render to SVG.
#define BOOST_TEST_MODULE graphviz
#include "support.hpp"

#include "io/graphviz.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <unistd.h>

using namespace tapegrad;

namespace {

struct ParsedDot {
    std::map<std::string, std::string> labels;          // node id -> label text (with \n escapes)
    std::vector<std::pair<std::string, std::string>> edges;  // (from, to)
};

ParsedDot parse(const std::string& dot) {
    ParsedDot parsed;
    const std::regex node(R"re(^\s+(n\d+) \[label="((?:[^"\\]|\\.)*)")re");
    const std::regex edge(R"re(^\s+(n\d+) -> (n\d+))re");
    std::istringstream lines(dot);
    for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (std::regex_search(line, m, edge)) parsed.edges.emplace_back(m[1], m[2]);
        else if (std::regex_search(line, m, node)) parsed.labels[m[1]] = m[2];
    }
    return parsed;
}

std::string id_of(const ParsedDot& parsed, const std::string& label_start) {
    for (const auto& [id, label] : parsed.labels)
        if (label.rfind(label_start, 0) == 0) return id;
    return "";
}

}  // namespace

BOOST_AUTO_TEST_CASE(attention_graph_structure) {
    Tape<double> tape;
    std::mt19937_64 rng(5);
    const Var<double> X = tape.leaf(testing::random_tensor(Shape{3, 4}, rng), "X");
    const Var<double> W_Q = tape.leaf(testing::random_tensor(Shape{4, 2}, rng), "W_Q");
    const Var<double> W_K = tape.leaf(testing::random_tensor(Shape{4, 2}, rng), "W_K");
    const Var<double> W_V = tape.leaf(testing::random_tensor(Shape{4, 5}, rng), "W_V");
    const AttentionResult<double> att = attention(X, W_Q, W_K, W_V);
    (void)testing::probe(att.O);
    const std::string dot = to_dot(tape);
    BOOST_TEST_MESSAGE(dot);
    const ParsedDot parsed = parse(dot);

    BOOST_TEST(dot.rfind("digraph \"tapegrad\" {", 0) == 0);
    BOOST_TEST(parsed.labels.size() == tape.size());
    std::size_t inputs = 0;
    for (std::size_t i = 0; i < tape.size(); ++i) inputs += tape.info(i).inputs.size();
    BOOST_TEST(parsed.edges.size() == inputs);

    // Leaves are boxes; X is a parameter-style leaf, the probe's G a constant.
    BOOST_TEST(parsed.labels.at(id_of(parsed, "leaf X")) == "leaf X\\n[3x4]");
    BOOST_TEST(dot.find("label=\"leaf X\\n[3x4]\", shape=box, style=filled") != std::string::npos);
    BOOST_TEST(dot.find("label=\"constant G\\n[3x5]\", shape=box, style=dashed") != std::string::npos);
    BOOST_TEST(parsed.labels.at(id_of(parsed, "softmax A")) == "softmax A\\n[3x3]");
    BOOST_TEST(parsed.labels.at(id_of(parsed, "matmul O")) == "matmul O\\n[3x5]");

    // X feeds the three projections; S feeds softmax; A and V feed O.
    const std::string x = id_of(parsed, "leaf X"), q = id_of(parsed, "matmul Q"), k = id_of(parsed, "matmul K"),
                      v = id_of(parsed, "matmul V"), s = id_of(parsed, "scale S"), a = id_of(parsed, "softmax A"),
                      o = id_of(parsed, "matmul O");
    auto has_edge = [&](const std::string& from, const std::string& to) {
        return std::find(parsed.edges.begin(), parsed.edges.end(), std::pair{from, to}) != parsed.edges.end();
    };
    BOOST_TEST((has_edge(x, q) && has_edge(x, k) && has_edge(x, v)));
    BOOST_TEST(has_edge(s, a));
    BOOST_TEST((has_edge(a, o) && has_edge(v, o)));
    BOOST_TEST(!has_edge(q, v));
    BOOST_TEST(dot.find(fmt::format("{} -> {} [label=\"1\"]", v, o)) != std::string::npos);  // V is matmul's input 1
}

BOOST_AUTO_TEST_CASE(labels_are_escaped_and_costs_optional) {
    Tape<double> tape;
    const Var<double> a = tape.leaf(Tensor<double>::matrix({{1, 2}}), "say \"hi\"\\");
    (void)sum(a);
    const std::string dot = to_dot(tape, DotOptions{"g \"1\"", true});
    BOOST_TEST(dot.find("label=\"leaf say \\\"hi\\\"\\\\\\n[1x2]\"") != std::string::npos, dot);
    BOOST_TEST(dot.find("digraph \"g \\\"1\\\"\"") != std::string::npos);
    BOOST_TEST(dot.find("madds") != std::string::npos);
    Tape<double> empty;
    BOOST_TEST(to_dot(empty) == "digraph \"tapegrad\" {\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n}\n");
}

BOOST_AUTO_TEST_CASE(renders_with_dot_when_installed) {
    if (std::system("command -v dot >/dev/null 2>&1") != 0) {
        BOOST_TEST_MESSAGE("Graphviz dot not installed: rendering not tested");
        return;
    }
    Tape<double> tape;
    std::mt19937_64 rng(5);
    const Var<double> X = tape.leaf(testing::random_tensor(Shape{2, 3}, rng), "X \"quoted\"");
    (void)sum(softmax(matmul(X, transpose(X))));
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("tapegrad_dot_{}", ::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "g.dot") << to_dot(tape);
    const int status = std::system(fmt::format("dot -Tsvg '{}' -o '{}'", (dir / "g.dot").string(), (dir / "g.svg").string()).c_str());
    BOOST_TEST(status == 0);
    std::ifstream svg(dir / "g.svg");
    const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
    BOOST_TEST(text.find("<svg") != std::string::npos);
    BOOST_TEST(text.find("softmax") != std::string::npos);
    std::filesystem::remove_all(dir);
}
