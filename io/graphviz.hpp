/// \file
/// Graph pictures: a tape exported as Graphviz DOT, one node per value (op name, label, output
/// shape), leaves drawn as boxes (parameters filled, constants dashed), one edge per op input,
/// from the input to the output it feeds (numbered by input slot when an op has several).
///
///     std::ofstream("attention.dot") << to_dot(tape);      // then: dot -Tsvg attention.dot
///
/// Written only from the tape's public description (Tape::size, Tape::info), so it shows what the
/// tape recorded, not what a model meant to record.
#pragma once

#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <string>
#include <string_view>

namespace tapegrad {

struct DotOptions {
    std::string graph_name = "tapegrad";
    bool show_cost = false;  ///< add each op's forward multiply-adds to its node
};

/// `text` as the inside of a DOT double-quoted string.
inline std::string dot_escape(std::string_view text) {
    std::string escaped;
    for (const char c : text) {
        if (c == '"' || c == '\\') escaped += '\\';
        if (c == '\n') {
            escaped += "\\n";
            continue;
        }
        escaped += c;
    }
    return escaped;
}

template <Scalar T>
std::string to_dot(const Tape<T>& tape, const DotOptions& options = {}) {
    std::string dot = fmt::format("digraph \"{}\" {{\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n",
                                  dot_escape(options.graph_name));
    for (std::size_t i = 0; i < tape.size(); ++i) {
        const NodeInfo node = tape.info(i);
        const bool is_leaf = node.op == "leaf";
        std::string label = is_leaf ? (node.requires_grad ? "leaf" : "constant") : std::string(node.op);
        if (!node.label.empty()) label += fmt::format(" {}", node.label);
        label += '\n';
        label += node.shape.to_string();
        if (options.show_cost && !is_leaf) label += fmt::format("\n{} madds", node.cost.forward_madds);
        const std::string_view style = !is_leaf                ? "shape=ellipse"
                                       : node.requires_grad ? "shape=box, style=filled, fillcolor=lightblue"
                                                            : "shape=box, style=dashed";
        dot += fmt::format("  n{} [label=\"{}\", {}];\n", i, dot_escape(label), style);
        for (std::size_t slot = 0; slot < node.inputs.size(); ++slot) {
            dot += fmt::format("  n{} -> n{}", node.inputs[slot], i);
            dot += node.inputs.size() > 1 ? fmt::format(" [label=\"{}\"];\n", slot) : std::string(";\n");
        }
    }
    return dot + "}\n";
}

}  // namespace tapegrad
