// Saved tapes (io/tape_file.hpp), compiled once in the library: the document written and read
// with nlohmann/json (Debian's nlohmann-json3-dev: a well-kept parser with exact error positions,
// rather than one written here), each library op's settings by field name, and its re-recording
// through the op's public function (the op's own checks, as for a program). Every op of LibraryOps
// (ops/all.hpp) has its entry, made from its FileOp below: an op listed there without a FileOp does
// not compile.
#include "io/tape_file.hpp"

#include "ops/all.hpp"
#include "src/io/tape_document.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>
#include <typeinfo>
#include <unistd.h>
#include <vector>

namespace tapegrad {

namespace {

using tape_document::Json;
using tape_document::Where;

constexpr std::string_view format_name = "tapegrad-tape";

// ---- values: hexadecimal floating-point text, exact both ways ----

template <std::floating_point F>
std::string exact_text(F x) {
    std::array<char, 64> buffer{};
    const auto [end, error] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), x, std::chars_format::hex);
    (void)error;  // 64 characters hold any float or double in this form
    return std::string(buffer.data(), end);
}

template <std::floating_point F>
F exact_value(const Json& text, const Where& where, std::string_view what) {
    F x{};
    std::string fault;
    if (!tape_document::exact_value(text, x, fault, what)) where.fail(fault);
    return x;
}

std::size_t count_of(const Json& value, const Where& where, std::string_view what) {
    if (!value.is_number_unsigned()) where.fail(fmt::format("{} is not a non-negative integer", what));
    return value.get<std::size_t>();
}

const Json& member(const Json& object, std::string_view key, const Where& where) {
    const auto found = object.find(key);
    if (found == object.end()) where.fail(fmt::format("\"{}\" is missing", key));
    return *found;
}

// Refuses keys other than `known`: a misspelt setting or field must not pass silently.
void only_keys(const Json& object, std::initializer_list<std::string_view> known, const Where& where,
               std::string_view what = "key") {
    for (const auto& [key, value] : object.items()) {
        if (std::find(known.begin(), known.end(), key) == known.end()) where.fail(fmt::format("unknown {} \"{}\"", what, key));
    }
}

Shape shape_of(const Json& dims, const Where& where, std::string_view what) {
    if (!dims.is_array()) where.fail(fmt::format("{} is not an array of dimensions", what));
    if (dims.size() > max_rank) where.fail(fmt::format("{} has rank {}, above the maximum {}", what, dims.size(), max_rank));
    std::array<std::size_t, max_rank> d{};
    for (std::size_t k = 0; k < dims.size(); ++k) d[k] = count_of(dims[k], where, fmt::format("{}[{}]", what, k));
    try {
        return Shape(std::span<const std::size_t>(d.data(), dims.size()));
    } catch (const shape_error& e) {
        where.fail(e.what());
    }
}

Json shape_json(const Shape& shape) { return Json(std::vector<std::size_t>(shape.dims().begin(), shape.dims().end())); }

// ---- settings fields, by type ----

Json field_json(std::size_t v) { return v; }
Json field_json(bool v) { return v; }
Json field_json(float v) { return exact_text(v); }
Json field_json(double v) { return exact_text(v); }
Json field_json(GeluForm v) { return v == GeluForm::tanh ? "tanh" : "erf"; }
Json field_json(const std::vector<std::size_t>& v) { return v; }
Json field_json(const Shape& v) { return shape_json(v); }
Json field_json(const FusedAttentionTiles& v) { return Json{{"query", v.query}, {"key", v.key}}; }

void field_from(const Json& j, std::size_t& v, const Where& w, std::string_view name) { v = count_of(j, w, name); }
void field_from(const Json& j, bool& v, const Where& w, std::string_view name) {
    if (!j.is_boolean()) w.fail(fmt::format("setting \"{}\" is not true or false", name));
    v = j.get<bool>();
}
void field_from(const Json& j, float& v, const Where& w, std::string_view name) { v = exact_value<float>(j, w, name); }
void field_from(const Json& j, double& v, const Where& w, std::string_view name) { v = exact_value<double>(j, w, name); }
void field_from(const Json& j, GeluForm& v, const Where& w, std::string_view name) {
    if (j == "tanh") v = GeluForm::tanh;
    else if (j == "erf") v = GeluForm::erf;
    else w.fail(fmt::format("setting \"{}\" is not \"tanh\" or \"erf\"", name));
}
void field_from(const Json& j, std::vector<std::size_t>& v, const Where& w, std::string_view name) {
    if (!j.is_array()) w.fail(fmt::format("setting \"{}\" is not an array", name));
    v.clear();
    for (std::size_t k = 0; k < j.size(); ++k) v.push_back(count_of(j[k], w, fmt::format("{}[{}]", name, k)));
}
void field_from(const Json& j, Shape& v, const Where& w, std::string_view name) { v = shape_of(j, w, name); }
void field_from(const Json& j, FusedAttentionTiles& v, const Where& w, std::string_view name) {
    if (!j.is_object()) w.fail(fmt::format("setting \"{}\" is not an object", name));
    only_keys(j, {"query", "key"}, w, "tile size");
    v.query = count_of(member(j, "query", w), w, "tiles.query");
    v.key = count_of(member(j, "key", w), w, "tiles.key");
}

// ---- each op: its inputs, its settings' fields, and its public function ----

template <std::size_t N>
struct Fixed {
    static constexpr std::size_t min_inputs = N, max_inputs = N;
    static void fields(const auto&, auto&&) {}  // no settings unless the op says otherwise
};
struct OneAxis : Fixed<1> {  // the axis reductions (ops/axis.hpp)
    static void fields(auto& s, auto&& field) {
        field("axis", s.axis);
        field("keepdims", s.keepdims);
    }
};
int axis_argument(std::size_t axis) {  // the reductions take an int axis; larger is out of range anyway
    return axis > std::size_t(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max() : int(axis);
}

template <class Op>
struct FileOp;
template <> struct FileOp<Abs> : Fixed<1> { static auto record(const auto&, const auto& in) { return abs(in[0]); } };
template <> struct FileOp<Exp> : Fixed<1> { static auto record(const auto&, const auto& in) { return exp(in[0]); } };
template <> struct FileOp<Log> : Fixed<1> { static auto record(const auto&, const auto& in) { return log(in[0]); } };
template <> struct FileOp<Neg> : Fixed<1> { static auto record(const auto&, const auto& in) { return neg(in[0]); } };
template <> struct FileOp<Sqrt> : Fixed<1> { static auto record(const auto&, const auto& in) { return sqrt(in[0]); } };
template <> struct FileOp<Tanh> : Fixed<1> { static auto record(const auto&, const auto& in) { return tanh(in[0]); } };
template <> struct FileOp<Relu> : Fixed<1> { static auto record(const auto&, const auto& in) { return relu(in[0]); } };
template <> struct FileOp<Sigmoid> : Fixed<1> { static auto record(const auto&, const auto& in) { return sigmoid(in[0]); } };
template <> struct FileOp<Reciprocal> : Fixed<1> { static auto record(const auto&, const auto& in) { return reciprocal(in[0]); } };
template <> struct FileOp<Softmax> : Fixed<1> { static auto record(const auto&, const auto& in) { return softmax(in[0]); } };
template <> struct FileOp<LogSoftmax> : Fixed<1> { static auto record(const auto&, const auto& in) { return log_softmax(in[0]); } };
template <> struct FileOp<Sum> : Fixed<1> { static auto record(const auto&, const auto& in) { return sum(in[0]); } };
template <> struct FileOp<Transpose> : Fixed<1> { static auto record(const auto&, const auto& in) { return transpose(in[0]); } };
template <> struct FileOp<MergeHeads> : Fixed<1> { static auto record(const auto&, const auto& in) { return merge_heads(in[0]); } };
template <> struct FileOp<Add> : Fixed<2> { static auto record(const auto&, const auto& in) { return add(in[0], in[1]); } };
template <> struct FileOp<Sub> : Fixed<2> { static auto record(const auto&, const auto& in) { return sub(in[0], in[1]); } };
template <> struct FileOp<Mul> : Fixed<2> { static auto record(const auto&, const auto& in) { return mul(in[0], in[1]); } };
template <> struct FileOp<Div> : Fixed<2> { static auto record(const auto&, const auto& in) { return div(in[0], in[1]); } };
template <> struct FileOp<MatMul> : Fixed<2> { static auto record(const auto&, const auto& in) { return matmul(in[0], in[1]); } };
template <> struct FileOp<Mask> : Fixed<2> { static auto record(const auto&, const auto& in) { return mask(in[0], in[1]); } };

template <> struct FileOp<Max> : OneAxis {
    static auto record(const auto& s, const auto& in) { return max(in[0], axis_argument(s.axis), s.keepdims); }
};
template <> struct FileOp<Mean> : OneAxis {
    static auto record(const auto& s, const auto& in) { return mean(in[0], axis_argument(s.axis), s.keepdims); }
};
template <> struct FileOp<SumAxis> : OneAxis {
    static auto record(const auto& s, const auto& in) { return sum(in[0], axis_argument(s.axis), s.keepdims); }
};
template <> struct FileOp<LogSumExp> : OneAxis {
    static auto record(const auto& s, const auto& in) { return logsumexp(in[0], axis_argument(s.axis), s.keepdims); }
};
template <> struct FileOp<Scale> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("c", s.c); }
    static auto record(const auto& s, const auto& in) { return scale(in[0], s.c); }
};
template <> struct FileOp<Shift> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("c", s.c); }
    static auto record(const auto& s, const auto& in) { return shift(in[0], s.c); }
};
template <> struct FileOp<Pow> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("p", s.p); }
    static auto record(const auto& s, const auto& in) { return pow(in[0], s.p); }
};
template <> struct FileOp<Clamp> : Fixed<1> {
    static void fields(auto& s, auto&& field) {
        field("lo", s.lo);
        field("hi", s.hi);
    }
    static auto record(const auto& s, const auto& in) { return clamp(in[0], s.lo, s.hi); }
};
template <> struct FileOp<Gelu> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("form", s.form); }
    static auto record(const auto& s, const auto& in) { return gelu(in[0], s.form); }
};
template <> struct FileOp<LayerNorm> : Fixed<3> {
    static void fields(auto& s, auto&& field) { field("epsilon", s.epsilon); }
    static auto record(const auto& s, const auto& in) {  // a float epsilon is exact as the double
        return layer_norm(in[0], in[1], in[2], LayerNormSettings{double(s.epsilon)});
    }
};
template <> struct FileOp<Dropout> : Fixed<2> {
    static void fields(auto& s, auto&& field) { field("factor", s.factor); }
    static auto record(const auto& s, const auto& in) { return record_dropout(in[0], in[1], s.factor); }
};
template <> struct FileOp<Reshape> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("shape", s.shape); }
    static auto record(const auto& s, const auto& in) { return reshape(in[0], s.shape); }
};
template <> struct FileOp<Slice> : Fixed<1> {
    static void fields(auto& s, auto&& field) {
        field("axis", s.axis);
        field("begin", s.begin);
        field("end", s.end);
    }
    static auto record(const auto& s, const auto& in) {
        const std::size_t axis = std::min<std::size_t>(s.axis, max_rank);  // beyond any rank: refused as such
        return slice(in[0], std::ptrdiff_t(axis), s.begin, s.end);
    }
};
template <> struct FileOp<SplitHeads> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("heads", s.heads); }
    static auto record(const auto& s, const auto& in) { return split_heads(in[0], s.heads); }
};
template <> struct FileOp<CrossEntropy> : Fixed<1> {
    static void fields(auto& s, auto&& field) { field("targets", s.targets); }
    static auto record(const auto& s, const auto& in) { return cross_entropy(in[0], std::span(s.targets)); }
};
template <> struct FileOp<Embedding> : Fixed<1> {
    static void fields(auto& s, auto&& field) {
        field("indices", s.indices);
        field("sequences", s.sequences);
    }
    static auto record(const auto& s, const auto& in) {
        return s.sequences == 0 ? embedding(in[0], std::span(s.indices)) : embedding(in[0], std::span(s.indices), s.sequences);
    }
};
template <> struct FileOp<FusedAttention> : Fixed<3> {
    static void fields(auto& s, auto&& field) {
        field("causal", s.causal);
        field("query_offset", s.query_offset);
        field("tiles", s.tiles);
    }
    static auto record(const auto& s, const auto& in) {
        return fused_attention(in[0], in[1], in[2], s.causal, s.query_offset, s.tiles);
    }
};
template <> struct FileOp<Concat> {
    static constexpr std::size_t min_inputs = 1, max_inputs = max_arity;
    static void fields(auto& s, auto&& field) { field("axis", s.axis); }
    static auto record(const auto& s, const auto& in) {
        const std::size_t axis = std::min<std::size_t>(s.axis, max_rank);
        return concat(in, std::ptrdiff_t(axis));
    }
};
// permute's settings hold the axes in a fixed array with their count: written as one array.
template <> struct FileOp<Permute> : Fixed<1> {
    static Json encode(const Permute::Settings& s) {
        return Json{{"axes", std::vector<std::size_t>(s.axes.begin(), s.axes.begin() + std::ptrdiff_t(s.rank))}};
    }
    static Permute::Settings decode(const Json& settings, const Where& where) {
        only_keys(settings, {"axes"}, where, "setting");
        std::vector<std::size_t> axes;
        field_from(member(settings, "axes", where), axes, where, "axes");
        if (axes.size() > max_rank) where.fail(fmt::format("setting \"axes\" names {} axes, above the maximum rank {}", axes.size(), max_rank));
        Permute::Settings s{{}, axes.size()};
        std::copy(axes.begin(), axes.end(), s.axes.begin());
        return s;
    }
    static auto record(const auto& s, const auto& in) {
        return permute(in[0], std::span<const std::size_t>(s.axes.data(), s.rank));
    }
};

// Settings as a JSON object of their fields, and back (every field present, no other key).
template <class Op, class S>
Json encode(const S& s) {
    if constexpr (requires { FileOp<Op>::encode(s); }) {
        return FileOp<Op>::encode(s);
    } else {
        Json object = Json::object();
        FileOp<Op>::fields(s, [&](std::string_view name, const auto& value) { object[std::string(name)] = field_json(value); });
        return object;
    }
}

template <class Op, class S>
S decode(const Json& settings, const Where& where) {
    if (!settings.is_object()) where.fail("\"settings\" is not an object");
    if constexpr (requires { FileOp<Op>::decode(settings, where); }) {
        return FileOp<Op>::decode(settings, where);
    } else {
        S s{};
        for (const auto& item : settings.items()) {  // a misspelt setting is named as such
            const std::string& key = item.key();
            bool known = false;
            FileOp<Op>::fields(s, [&](std::string_view name, auto&) { known = known || key == name; });
            if (!known) where.fail(fmt::format("unknown setting \"{}\"", key));
        }
        FileOp<Op>::fields(s, [&](std::string_view name, auto& value) {
            const auto found = settings.find(name);
            if (found == settings.end()) where.fail(fmt::format("setting \"{}\" is missing", name));
            field_from(*found, value, where, name);
        });
        return s;
    }
}

// One op as the file sees it, at scalar type T.
template <Scalar T>
struct FileEntry {
    std::string_view name;
    const std::type_info* op;
    std::size_t min_inputs, max_inputs;
    Json (*encode)(const SettingsSlot& settings);
    void (*decode)(const Json& settings, const Where& where, SettingsSlot& into);
    Var<T> (*record)(const SettingsSlot& settings, std::span<const Var<T>> inputs);
};

template <class Op, Scalar T>
FileEntry<T> entry_of() {
    static_assert(requires { FileOp<Op>::min_inputs; },
                  "an op of LibraryOps (ops/all.hpp) has no FileOp above: its inputs, settings' fields and public "
                  "function");
    using S = SettingsOf<Op, T>;
    return {Op::name, &typeid(Op), FileOp<Op>::min_inputs, FileOp<Op>::max_inputs,
            [](const SettingsSlot& slot) { return encode<Op>(slot.get<S>()); },
            [](const Json& settings, const Where& where, SettingsSlot& into) { into.store(decode<Op, S>(settings, where)); },
            [](const SettingsSlot& slot, std::span<const Var<T>> in) -> Var<T> { return FileOp<Op>::record(slot.get<S>(), in); }};
}

template <Scalar T, class... Ops>
std::vector<FileEntry<T>> entries_of(OpList<Ops...>) {
    return {entry_of<Ops, T>()...};
}

template <Scalar T>
const std::vector<FileEntry<T>>& entries() {
    static const std::vector<FileEntry<T>> all = entries_of<T>(LibraryOps{});
    return all;
}

template <Scalar T>
const FileEntry<T>* entry_named(std::string_view name) {
    for (const FileEntry<T>& e : entries<T>()) if (e.name == name) return &e;
    return nullptr;
}

template <Scalar T>
const FileEntry<T>* entry_for(const std::type_info& op) {
    for (const FileEntry<T>& e : entries<T>()) if (*e.op == op) return &e;
    return nullptr;
}

template <Scalar T>
constexpr std::string_view scalar_text = std::is_same_v<T, float> ? "float32" : "float64";

// ---- saving ----

template <Scalar T>
Json node_json(const Tape<T>& tape, std::uint32_t i) {
    const auto node = tape.recorded(i);
    Json j;
    if (node.kind == nullptr) {
        j["node"] = node.requires_grad ? "leaf" : "constant";
        if (!node.label.empty()) j["label"] = std::string(node.label);
        j["shape"] = shape_json(node.value.shape());
        Json values = Json::array();
        for (const T& x : node.value.data()) values.push_back(exact_text(x));
        j["values"] = std::move(values);
        return j;
    }
    const FileEntry<T>* entry = entry_for<T>(*node.kind->op);
    if (entry == nullptr) {
        throw usage_error(fmt::format("save_tape: op '{}' (node {}) is not a library op; a saved tape holds the "
                                      "library's ops only", node.kind->name, i));
    }
    j["node"] = "op";
    j["op"] = std::string(entry->name);
    j["inputs"] = std::vector<std::uint32_t>(node.inputs.begin(), node.inputs.end());
    if (!node.label.empty()) j["label"] = std::string(node.label);
    j["shape"] = shape_json(node.value.shape());
    Json settings = entry->encode(node.settings);
    if (!settings.empty()) j["settings"] = std::move(settings);
    return j;
}

template <Scalar T>
std::string text_of(const Tape<T>& tape, const Var<T>& output) {
    if (!tape.holds(output)) throw usage_error("save_tape: the output is not a value of this tape");
    std::string text = fmt::format("{{\"format\": \"{}\", \"version\": {}, \"scalar\": \"{}\", \"output\": {}, \"nodes\": [\n",
                                   format_name, tape_file_version, scalar_text<T>, output.index());
    for (std::uint32_t i = 0; i <= output.index(); ++i) {
        text += node_json(tape, i).dump(-1, ' ', false, Json::error_handler_t::replace);
        text += i == output.index() ? "\n" : ",\n";
    }
    text += "]}\n";
    return text;
}

}  // namespace

void write_file_atomically(const std::string& file, const std::string& bytes, std::string_view who) {
    const std::string partial = fmt::format("{}.partial-{}", file, ::getpid());
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        if (!out) throw io_error(fmt::format("{}: cannot create '{}': {}", who, partial, std::strerror(errno)));
        out.write(bytes.data(), std::streamsize(bytes.size()));
        out.close();
        if (!out) {
            std::error_code ignored;
            std::filesystem::remove(partial, ignored);
            throw io_error(fmt::format("{}: error writing '{}'", who, partial));
        }
    }
    std::error_code error;
    std::filesystem::rename(partial, file, error);
    if (error) {
        std::error_code ignored;
        std::filesystem::remove(partial, ignored);
        throw io_error(fmt::format("{}: cannot rename '{}' to '{}': {}", who, partial, file, error.message()));
    }
}

namespace {

// ---- loading: the whole document validated, then recorded ----

// One node, validated: a leaf's or constant's values, or an op's entry and decoded settings.
template <Scalar T>
struct ValidNode {
    std::string label;
    bool requires_grad = false;
    Shape shape;
    Tensor<T> values;                      // leaves and constants
    const FileEntry<T>* entry = nullptr;   // ops
    std::vector<std::uint32_t> inputs;
    SettingsSlot settings;
};

template <Scalar T>
struct Document {
    tape_document::Tree<T> tree;  // the JSON tree, the leaves' values apart
    TapeFileScalar scalar;
    std::size_t output;
};

// The document's text read in both passes (src/io/tape_document.hpp: syntax, duplicate keys and
// values counted against shapes first, in constant memory), and its top level validated.
template <Scalar T>
Document<T> read_document(std::string_view text, const tape_document::Outline& outline, const Where& where) {
    Document<T> d{tape_document::read_tree<T>(text, outline, where), {}, {}};
    const Json& root = d.tree.root;
    if (!root.is_object()) where.fail("the document is not a JSON object");
    only_keys(root, {"format", "version", "scalar", "output", "nodes"}, where);
    if (member(root, "format", where) != format_name) where.fail(fmt::format("\"format\" is not \"{}\"", format_name));
    const Json& version = member(root, "version", where);
    if (!version.is_number_unsigned() || version != tape_file_version) {  // 1.0 is not version 1
        where.fail(fmt::format("format version {} is not supported (this library reads version {})", version.dump(),
                               tape_file_version));
    }
    const Json& scalar = member(root, "scalar", where);
    if (scalar == "float64") d.scalar = TapeFileScalar::float64;
    else if (scalar == "float32") d.scalar = TapeFileScalar::float32;
    else where.fail(fmt::format("\"scalar\" {} is not \"float32\" or \"float64\"", scalar.dump()));
    const Json& nodes = member(root, "nodes", where);
    if (!nodes.is_array() || nodes.empty()) where.fail("\"nodes\" is not a non-empty array");
    d.output = count_of(member(root, "output", where), where, "\"output\"");
    if (d.output + 1 != nodes.size()) {
        where.fail(fmt::format("\"output\" is {}, but the output is the last of the {} nodes", d.output, nodes.size()));
    }
    return d;
}

// A leaf or constant: its shape, and the values the second pass read apart from the tree (the
// tree's "values" is an empty array where the file has an array).
template <Scalar T>
ValidNode<T> valid_leaf(const Json& j, tape_document::LeafValues<T>& read, bool requires_grad, const Where& where) {
    only_keys(j, {"node", "label", "shape", "values"}, where);
    ValidNode<T> node;
    node.requires_grad = requires_grad;
    node.shape = shape_of(member(j, "shape", where), where, "\"shape\"");
    const Json& values = member(j, "values", where);
    if (!values.is_array()) where.fail("\"values\" is not an array");
    if (!read.fault.empty()) where.fail(read.fault);
    if (read.values.size() != node.shape.size()) {
        where.fail(fmt::format("shape {} holds {} values, \"values\" has {}", node.shape.to_string(), node.shape.size(),
                               read.values.size()));
    }
    for (std::size_t k = 0; k < read.values.size(); ++k) {
        if (is_nan(read.values[k])) where.fail(fmt::format("value {} (at {}) is NaN", k, index_string(node.shape, k)));
    }
    node.values = Tensor<T>(node.shape, std::move(read.values));
    return node;
}

template <Scalar T>
ValidNode<T> valid_op(const Json& j, std::size_t index, const Where& where) {
    only_keys(j, {"node", "op", "inputs", "label", "shape", "settings"}, where);
    ValidNode<T> node;
    const Json& op = member(j, "op", where);
    if (!op.is_string()) where.fail("\"op\" is not a string");
    node.entry = entry_named<T>(op.get_ref<const std::string&>());
    if (node.entry == nullptr) where.fail(fmt::format("op \"{}\" is not one of the library's ops", op.get_ref<const std::string&>()));
    const Json& inputs = member(j, "inputs", where);
    if (!inputs.is_array() || inputs.size() < node.entry->min_inputs || inputs.size() > node.entry->max_inputs) {
        where.fail(node.entry->min_inputs == node.entry->max_inputs
                       ? fmt::format("\"inputs\" is not an array of {} node indices", node.entry->min_inputs)
                       : fmt::format("\"inputs\" is not an array of {} to {} node indices", node.entry->min_inputs,
                                     node.entry->max_inputs));
    }
    for (const Json& input : inputs) {
        const std::size_t k = count_of(input, where, "an input");
        if (k >= index) where.fail(fmt::format("input {} is not an earlier node", k));
        node.inputs.push_back(std::uint32_t(k));
    }
    node.shape = shape_of(member(j, "shape", where), where, "\"shape\"");
    const auto settings = j.find("settings");
    node.entry->decode(settings == j.end() ? Json::object() : *settings, where, node.settings);
    return node;
}

template <Scalar T>
std::vector<ValidNode<T>> valid_nodes(Document<T>& d, const Where& file) {
    const Json& nodes = d.tree.root["nodes"];
    std::vector<ValidNode<T>> valid;
    valid.reserve(nodes.size());
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Json& j = nodes[i];
        if (!j.is_object()) file.at(i, "?").fail("not a JSON object");
        const Json& kind = member(j, "node", file.at(i, "?"));
        const std::string op = kind == "op" && j.contains("op") && j["op"].is_string() ? j["op"].get<std::string>() : "";
        const Where where = file.at(i, kind == "op" ? fmt::format("op {}", op) : kind.is_string() ? kind.get<std::string>() : "?");
        if (kind == "leaf" || kind == "constant") valid.push_back(valid_leaf<T>(j, d.tree.values.at(i), kind == "leaf", where));
        else if (kind == "op") valid.push_back(valid_op<T>(j, i, where));
        else where.fail(fmt::format("\"node\" {} is not \"leaf\", \"constant\" or \"op\"", kind.dump()));
        const auto label = j.find("label");
        if (label != j.end()) {
            if (!label->is_string()) where.fail("\"label\" is not a string");
            valid.back().label = label->get<std::string>();
        }
    }
    return valid;
}

// Records node i of the validated nodes on `tape`: a leaf as it was, an op through its public
// function, which checks its inputs and settings as for a program.
template <Scalar T>
Var<T> record_node(ValidNode<T>& node, std::span<const Var<T>> vars, const Where& where, Tape<T>& tape) {
    if (node.entry == nullptr) return tape.leaf(std::move(node.values), node.label, node.requires_grad);
    std::vector<Var<T>> inputs;
    for (const std::uint32_t k : node.inputs) inputs.push_back(vars[k]);
    const std::size_t before = tape.size();
    const Var<T> out = node.entry->record(node.settings, inputs);
    const auto recorded = tape.recorded(out.index());
    if (tape.size() != before + 1 || recorded.kind == nullptr || *recorded.kind->op != *node.entry->op) {
        where.fail("its public function recorded something else than one node of this op");
    }
    if (!(out.shape() == node.shape)) {
        where.fail(fmt::format("its output has shape {}, the file says {}", out.shape().to_string(), node.shape.to_string()));
    }
    return node.label.empty() ? out : out.named(node.label);
}

// Records the validated nodes; a node the op (or the tape) refuses is the file's fault.
template <Scalar T>
Var<T> record_nodes(std::vector<ValidNode<T>>& nodes, const Where& file, Tape<T>& tape) {
    std::vector<Var<T>> vars;
    vars.reserve(nodes.size());
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const ValidNode<T>& node = nodes[i];
        const Where where = file.at(i, node.entry != nullptr ? fmt::format("op {}", node.entry->name)
                                                              : std::string(node.requires_grad ? "leaf" : "constant"));
        try {
            vars.push_back(record_node(nodes[i], std::span<const Var<T>>(vars), where, tape));
        } catch (const io_error&) {
            throw;
        } catch (const error& e) {
            where.fail(e.what());
        }
    }
    return vars.back();
}

template <Scalar T>
Var<T> parse_into(std::string_view text, std::string_view source, Tape<T>& tape) {
    const Where where(source);
    if (tape.size() != 0) throw usage_error(fmt::format("load_tape: {}: the tape to load into must be empty (it holds {} nodes)", source, tape.size()));
    Document<T> d = read_document<T>(text, tape_document::read_outline(text, where), where);
    constexpr TapeFileScalar wanted = std::is_same_v<T, float> ? TapeFileScalar::float32 : TapeFileScalar::float64;
    if (d.scalar != wanted) {
        where.fail(fmt::format("it holds a {} tape; load it into a Tape<{}>",
                               d.scalar == TapeFileScalar::float32 ? "float32" : "float64",
                               d.scalar == TapeFileScalar::float32 ? "float" : "double"));
    }
    std::vector<ValidNode<T>> nodes;
    try {
        nodes = valid_nodes<T>(d, where);
    } catch (const Json::exception& e) {  // a JSON value of an unexpected type the checks above missed
        where.fail(fmt::format("malformed ({})", e.what()));
    }
    try {
        return record_nodes(nodes, where, tape);
    } catch (...) {
        tape.clear();  // no half-loaded graph
        throw;
    }
}

// The file's bytes, read into a string of its size (no stream buffer growing beside it).
std::string read_file(const std::string& file) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    if (!in) throw io_error(fmt::format("load_tape: cannot open '{}': {}", file, std::strerror(errno)));
    const std::streamoff size = in.tellg();
    if (size < 0) throw io_error(fmt::format("load_tape: cannot tell the size of '{}'", file));
    std::string text(std::size_t(size), '\0');
    in.seekg(0);
    in.read(text.data(), size);
    if (in.gcount() != size) throw io_error(fmt::format("load_tape: error reading '{}'", file));
    return text;
}

template <Scalar T>
TapeFileScalar validated_scalar(std::string_view text, const tape_document::Outline& outline, const Where& where) {
    Document<T> d = read_document<T>(text, outline, where);
    try {
        (void)valid_nodes<T>(d, where);
    } catch (const Json::exception& e) {
        where.fail(fmt::format("malformed ({})", e.what()));
    }
    return d.scalar;
}

}  // namespace

std::string tape_file_text(const Tape<double>& tape, const Var<double>& output) { return text_of(tape, output); }
std::string tape_file_text(const Tape<float>& tape, const Var<float>& output) { return text_of(tape, output); }

void save_tape(const std::string& file, const Tape<double>& tape, const Var<double>& output) {
    write_file_atomically(file, text_of(tape, output), "save_tape");
}
void save_tape(const std::string& file, const Tape<float>& tape, const Var<float>& output) {
    write_file_atomically(file, text_of(tape, output), "save_tape");
}

TapeFileScalar parse_tape_scalar(std::string_view text, std::string_view source) {
    const Where where(source);
    const tape_document::Outline outline = tape_document::read_outline(text, where);
    return outline.scalar == "float32" ? validated_scalar<float>(text, outline, where)
                                       : validated_scalar<double>(text, outline, where);
}

TapeFileScalar tape_file_scalar(const std::string& file) {
    return parse_tape_scalar(read_file(file), file);
}

Var<double> parse_tape(std::string_view text, std::string_view source, Tape<double>& tape) {
    return parse_into(text, source, tape);
}
Var<float> parse_tape(std::string_view text, std::string_view source, Tape<float>& tape) {
    return parse_into(text, source, tape);
}

Var<double> load_tape(const std::string& file, Tape<double>& tape) {
    return parse_into(read_file(file), file, tape);
}
Var<float> load_tape(const std::string& file, Tape<float>& tape) {
    return parse_into(read_file(file), file, tape);
}

}  // namespace tapegrad
