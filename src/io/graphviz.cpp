/// \file
/// The compiled part of io/graphviz.hpp: DOT text from nodes (dot_graph, dot_escape), kept out of the
/// header so that a program including it does not compile the formatting again.
#include "io/graphviz.hpp"

#include <fmt/core.h>

namespace tapegrad {

std::string dot_escape(std::string_view text) {
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

std::string dot_graph(std::string_view graph_name, const std::vector<DotNode>& nodes, std::string_view node_defaults,
                      const std::vector<std::string>& graph_attributes) {
    std::string dot =
        fmt::format("digraph \"{}\" {{\n  rankdir=TB;\n  node [{}];\n", dot_escape(graph_name), node_defaults);
    for (const std::string& attribute : graph_attributes) dot += fmt::format("  {};\n", attribute);
    for (const DotNode& node : nodes) {
        dot += fmt::format("  n{} [label=\"{}\", {}];\n", node.index, dot_escape(node.label), node.style);
        for (std::size_t slot = 0; slot < node.inputs.size(); ++slot) {
            dot += fmt::format("  n{} -> n{}", node.inputs[slot], node.index);
            dot += node.inputs.size() > 1 ? fmt::format(" [label=\"{}\"];\n", slot) : std::string(";\n");
        }
    }
    return dot + "}\n";
}

}  // namespace tapegrad
