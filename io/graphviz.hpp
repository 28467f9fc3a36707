/// \file
/// Graph pictures: a tape exported as Graphviz DOT, one node per value (op name, label, the op's
/// settings, output shape), leaves drawn as boxes (parameters filled, constants dashed), one edge per op input,
/// from the input to the output it feeds (numbered by input slot when an op has several).
///
///     std::ofstream("attention.dot") << to_dot(tape);      // then: dot -Tsvg attention.dot
///
/// Written only from the tape's public description (Tape::size, Tape::info), so it shows what the
/// tape recorded, not what a model meant to record; `dot_graph` is the writer, shared with the
/// precision audit's picture.
/// dot_graph and dot_escape are compiled in the library (src/io/graphviz.cpp).
#pragma once

#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

struct DotOptions {
    std::string graph_name = "tapegrad";
    bool show_cost = false;  ///< add each op's forward multiply-adds to its node
};

/// `text` as the inside of a DOT double-quoted string.
std::string dot_escape(std::string_view text);

/// One node of a picture: its index (`n<index>` in the DOT text), its label, its DOT attributes
/// (shape, fill) and the indices of the nodes it reads, by input slot.
struct DotNode {
    std::size_t index;
    std::string label;
    std::string style;
    std::vector<std::uint32_t> inputs;
};

/// The one DOT writer: `nodes` in order, each with its edges from its inputs (numbered by slot
/// when it has several). `graph_attributes` go after the header, one per line (as `label="..."`);
/// `node_defaults` are the attributes every node starts from. The audit's picture
/// (check/audit.hpp) styles each node by its error through it.
std::string dot_graph(std::string_view graph_name, const std::vector<DotNode>& nodes,
                      std::string_view node_defaults = "fontname=\"Helvetica\"",
                      const std::vector<std::string>& graph_attributes = {});

template <Scalar T>
std::string to_dot(const Tape<T>& tape, const DotOptions& options = {}) {
    std::vector<DotNode> nodes;
    for (std::size_t i = 0; i < tape.size(); ++i) {
        const NodeInfo node = tape.info(i);
        const bool is_leaf = node.op == "leaf";
        std::string label = is_leaf ? (node.requires_grad ? "leaf" : "constant") : std::string(node.op);
        if (!node.label.empty()) label += fmt::format(" {}", node.label);
        if (!node.settings.empty()) label += fmt::format("\n{}", node.settings);
        label += '\n';
        label += node.shape.to_string();
        if (options.show_cost && !is_leaf) label += fmt::format("\n{} madds", node.cost.forward_madds);
        const std::string_view style = !is_leaf                ? "shape=ellipse"
                                       : node.requires_grad ? "shape=box, style=filled, fillcolor=lightblue"
                                                            : "shape=box, style=dashed";
        nodes.push_back({i, std::move(label), std::string(style), {node.inputs.begin(), node.inputs.end()}});
    }
    return dot_graph(options.graph_name, nodes);
}

}  // namespace tapegrad
