// Draws the attention graph: records single-head attention with its probe J = Σ O ∘ G on a tape,
// writes the tape as Graphviz DOT (attention.dot) and, when Graphviz's `dot` is installed,
// renders it to attention.svg; otherwise prints the command to render it elsewhere.
//
//     ./build/examples/attention_graph [output-directory]
#include "io/graphviz.hpp"
#include "tapegrad.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>

int main(int argc, char** argv) {
    using namespace tapegrad;
    try {
        const std::filesystem::path dir = argc > 1 ? argv[1] : ".";
        Tape<double> tape;
        // The specification's sizes: T = 3 tokens of width D = 4, d = 2, r = 2.
        const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 0, 1, 0}, {0, 2, 0, 2}, {1, 1, 1, 1}}), "X");
        const Var<double> W_Q = tape.leaf(Tensor<double>::matrix({{1, 0}, {0, 1}, {1, 0}, {0, 1}}), "W_Q");
        const Var<double> W_K = tape.leaf(Tensor<double>::matrix({{0, 1}, {1, 0}, {0, 1}, {1, 0}}), "W_K");
        const Var<double> W_V = tape.leaf(Tensor<double>::matrix({{1, 1}, {0, 1}, {1, 0}, {0, 0}}), "W_V");
        const AttentionResult<double> att = attention(X, W_Q, W_K, W_V);
        const Var<double> G = tape.constant(Tensor<double>::matrix({{1, 0}, {0, 1}, {1, 1}}), "G");
        const Var<double> J = sum(att.O * G).named("J");
        tape.backward(J);
        fmt::print("J = {:.10}\nA = {:.6}\ndX = {:.6}\n", J.value(), att.A.value(), X.grad());

        const std::filesystem::path dot_file = dir / "attention.dot", svg_file = dir / "attention.svg";
        std::ofstream(dot_file) << to_dot(tape, DotOptions{"attention", true});
        fmt::print("wrote {} ({} nodes)\n", dot_file.string(), tape.size());
        if (std::system("command -v dot >/dev/null 2>&1") == 0) {
            const std::string command = fmt::format("dot -Tsvg '{}' -o '{}'", dot_file.string(), svg_file.string());
            if (std::system(command.c_str()) != 0) {
                fmt::print(stderr, "attention_graph: `{}` failed\n", command);
                return EXIT_FAILURE;
            }
            fmt::print("wrote {}\n", svg_file.string());
        } else {
            fmt::print("Graphviz is not installed, so no SVG was drawn. Install it (apt-get install graphviz)\n"
                       "and run `dot -Tsvg {} -o {}`, or paste the .dot file into an online Graphviz viewer.\n",
                       dot_file.string(), svg_file.string());
        }
        return EXIT_SUCCESS;
    } catch (const std::exception& e) {
        fmt::print(stderr, "attention_graph: {}\n", e.what());
        return EXIT_FAILURE;
    }
}
