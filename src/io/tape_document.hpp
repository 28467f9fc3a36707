// The saved-tape document read in two passes, in memory bounded by what the declared graph holds
// (internal to src/io/; tape_file.cpp validates and records what this reads):
//   1. read_outline: a SAX pass over the text that builds nothing: JSON syntax, no key twice in one
//      object (a parsed tree would keep the last silently), no object with more keys or nesting
//      deeper than the format has, and each node's "values" counted against its "shape" -- a node
//      declaring 2 values and holding 10 million is refused at the third, in constant memory.
//   2. read_tree: the JSON tree of everything but the leaves' values, which are read straight into
//      typed storage (T per element, reserved from the outline's count) instead of becoming tree
//      nodes (about ten times the bytes).
#pragma once

#include "autodiff/tensor.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad::tape_document {

using Json = nlohmann::ordered_json;

/// Where a fault is: the file (or text) and, once nodes are read, the node.
class Where {
public:
    explicit Where(std::string_view source) : source_(source) {}
    Where at(std::size_t node, std::string_view what) const;
    [[noreturn]] void fail(std::string_view fault) const;

private:
    std::string_view source_;
    std::string node_;
};

/// What the first pass learnt: the root's "scalar" (empty when it is not a string) and how many
/// values each node's "values" array holds (0 without one).
struct Outline {
    std::string scalar;
    std::vector<std::size_t> value_counts;
};

/// The limits of the format the first pass enforces (no document tapegrad writes comes near them).
inline constexpr std::size_t max_keys_per_object = 16;  // a node has 6 keys, the root 5
inline constexpr std::size_t max_nesting = 6;           // root, nodes, node, settings, tiles, one more
inline constexpr std::size_t max_short_array = 64;      // a node's "shape" (rank <= 4) and "inputs" (<= 4)

Outline read_outline(std::string_view text, const Where& where);

/// A node's values as read: the elements, or the first fault met (then `values` stops there).
template <class T>
struct LeafValues {
    std::vector<T> values;
    std::string fault;
};

/// The tree of the document with every node's "values" array left empty, and the values apart.
template <class T>
struct Tree {
    Json root;
    std::vector<LeafValues<T>> values;  // by node
};

/// T is float or double: each value's text is read as the scalar the tape holds.
template <class T>
Tree<T> read_tree(std::string_view text, const Outline& outline, const Where& where);

/// The text of a value (hexadecimal floating point, with its binary exponent, exact in T: never
/// rounded) as T, or a fault naming `what`.
template <class T>
bool exact_value(const Json& text, T& x, std::string& fault, std::string_view what);

}  // namespace tapegrad::tape_document
