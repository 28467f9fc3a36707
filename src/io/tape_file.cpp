// Saved tapes (io/tape_file.hpp), compiled once in the library: the document written and read
// with nlohmann/json (Debian's nlohmann-json3-dev: a well-kept parser with exact error positions,
// rather than one written here). Each op is saved and loaded through its registered saved form
// (autodiff/registry.hpp, made from the op's struct: its settings by field name, its arity, and its
// re-recording through its public function, so a loaded node passes the op's own checks as a
// program's call does): every op of LibraryOps, and each user's op registered with register_op.
#include "io/tape_file.hpp"
#include "io/read_file.hpp"

#include "autodiff/registry.hpp"
#include "src/io/tape_document.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cmath>
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

// An integer setting is a size, count, index or position within a tensor (an axis, heads, a tile, a
// class, a first position): none exceeds the most elements a tensor holds (2^40), and a larger one,
// as 18446744073709551615, would only wrap an op's arithmetic (rope's first_position + t) or be
// cut to fit a field (an axis held as an int), so the op would see another value than the file's.
std::size_t setting_count(const Json& value, const Where& where, std::string_view what) {
    const std::size_t n = count_of(value, where, what);
    if (n > max_elements) {
        where.fail(
            fmt::format("{} is {}, above {} (2^40, the most elements a tensor holds: no size, index or position "
                        "in a tape is larger)",
                        what, n, max_elements));
    }
    return n;
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

// ---- settings: the op's fields (autodiff/settings.hpp) as a JSON object, and back ----

Json settings_json(const SettingsValue& value) {
    struct ToJson {
        Json operator()(std::size_t n) const { return n; }
        Json operator()(bool b) const { return b; }
        Json operator()(float x) const { return exact_text(x); }
        Json operator()(double x) const { return exact_text(x); }
        Json operator()(const SettingsChoice& c) const { return std::string(c.names[c.index]); }
        Json operator()(const std::vector<std::size_t>& counts) const { return counts; }
        Json operator()(const std::vector<SettingsEntry>& entries) const {
            Json object = Json::object();
            for (const SettingsEntry& e : entries) object[std::string(e.name)] = std::visit(*this, e.value);
            return object;
        }
    };
    return std::visit(ToJson{}, value);
}

// The fields of `schema` (an op's default settings: the names and kinds), read from `object`:
// every field present, no other key, each of its kind. Messages call an unknown key an
// `unknown_what` and prefix a nested object's fields with `prefix` ("tiles." for tiles.query).
SettingsValue entries_from(const Json& object, const std::vector<SettingsEntry>& schema, const Where& where,
                           std::string_view unknown_what, const std::string& prefix);

// One setting read from `j` as the kind its schema entry holds.
SettingsValue setting_from(const Json& j, const SettingsValue& schema, const Where& where, const std::string& name) {
    struct FromJson {
        const Json& j;
        const Where& where;
        const std::string& name;

        SettingsValue operator()(std::size_t) const {
            return setting_count(j, where, fmt::format("setting \"{}\"", name));
        }
        SettingsValue operator()(bool) const {
            if (!j.is_boolean()) where.fail(fmt::format("setting \"{}\" is not true or false", name));
            return j.get<bool>();
        }
        SettingsValue operator()(float) const { return real(exact_value<float>(j, where, name)); }
        SettingsValue operator()(double) const { return real(exact_value<double>(j, where, name)); }
        // No op takes a NaN setting (each refuses one): named here as the file's fault, as a NaN value is.
        SettingsValue real(float x) const {
            not_nan(x);
            return x;
        }
        SettingsValue real(double x) const {
            not_nan(x);
            return x;
        }
        void not_nan(double x) const {
            if (std::isnan(x)) where.fail(fmt::format("setting \"{}\" is NaN", name));
        }
        SettingsValue operator()(const SettingsChoice& choice) const {
            for (std::size_t k = 0; k < choice.names.size(); ++k) {
                if (j == choice.names[k]) return SettingsChoice{k, choice.names};
            }
            std::string names;
            for (std::size_t k = 0; k < choice.names.size(); ++k) {
                names += fmt::format("{}\"{}\"", k == 0 ? "" : k + 1 == choice.names.size() ? " or " : ", ", choice.names[k]);
            }
            where.fail(fmt::format("setting \"{}\" is not {}", name, names));
        }
        SettingsValue operator()(const std::vector<std::size_t>&) const {
            if (!j.is_array()) where.fail(fmt::format("setting \"{}\" is not an array", name));
            std::vector<std::size_t> counts;
            for (std::size_t k = 0; k < j.size(); ++k) {
                counts.push_back(setting_count(j[k], where, fmt::format("setting \"{}\"[{}]", name, k)));
            }
            return counts;
        }
        SettingsValue operator()(const std::vector<SettingsEntry>& fields) const {
            if (!j.is_object()) where.fail(fmt::format("setting \"{}\" is not an object", name));
            return entries_from(j, fields, where, fmt::format("field of \"{}\"", name), name + ".");
        }
    };
    return std::visit(FromJson{j, where, name}, schema);
}

SettingsValue entries_from(const Json& object, const std::vector<SettingsEntry>& schema, const Where& where,
                           std::string_view unknown_what, const std::string& prefix) {
    for (const auto& item : object.items()) {  // a misspelt setting is named as such
        const auto known = std::find_if(schema.begin(), schema.end(), [&](const SettingsEntry& e) { return e.name == item.key(); });
        if (known == schema.end()) where.fail(fmt::format("unknown {} \"{}\"", unknown_what, item.key()));
    }
    std::vector<SettingsEntry> entries;
    for (const SettingsEntry& field : schema) {
        const auto found = object.find(field.name);
        if (found == object.end()) where.fail(fmt::format("setting \"{}{}\" is missing", prefix, field.name));
        entries.push_back({field.name, setting_from(*found, field.value, where, prefix + std::string(field.name))});
    }
    return entries;
}

// A node's "settings" for op `form` (none in the file when the op has no fields), decoded into
// `into`; a value the op's settings cannot hold (a rank above the maximum) is the file's fault.
template <Scalar T>
void decode_settings(const Json* settings, const SavedForm<T>& form, const Where& where, SettingsSlot& into) {
    const Json none = Json::object();
    if (settings == nullptr) settings = &none;
    if (!settings->is_object()) where.fail("\"settings\" is not an object");
    const SettingsValue schema = form.schema();
    const SettingsValue value = entries_from(*settings, std::get<std::vector<SettingsEntry>>(schema), where, "setting", "");
    try {
        form.decode(value, into);
    } catch (const error& e) {
        where.fail(e.what());
    }
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
    const SavedOp* saved = detail::find_saved_op(*node.kind->op);
    if (saved == nullptr) {
        throw usage_error(fmt::format("save_tape: op '{}' (node {}) is not registered for saving: register its struct "
                                      "with tapegrad::register_op<...>() (autodiff/registry.hpp)", node.kind->name, i));
    }
    j["node"] = "op";
    j["op"] = saved->file_name;
    j["inputs"] = std::vector<std::uint32_t>(node.inputs.begin(), node.inputs.end());
    if (!node.label.empty()) j["label"] = std::string(node.label);
    j["shape"] = shape_json(node.value.shape());
    Json settings = settings_json(saved->form<T>().encode(node.settings));
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
    const SavedOp* op = nullptr;           // ops
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
    const std::string& name = op.get_ref<const std::string&>();
    node.op = detail::find_saved_op(name);
    if (node.op == nullptr) {
        where.fail(name.starts_with(user_op_prefix)
                       ? fmt::format("op \"{}\" is a user's op this program has not registered: register its struct "
                                     "with tapegrad::register_op<...>() before loading (tapegrad-check and "
                                     "tapegrad-audit: --ops LIBRARY)", name)
                       : fmt::format("op \"{}\" is not one of the library's ops", name));
    }
    const Arity arity = node.op->template form<T>().arity;
    const Json& inputs = member(j, "inputs", where);
    if (!inputs.is_array() || !arity.admits(inputs.size())) {
        where.fail(arity.min == arity.max ? fmt::format("\"inputs\" is not an array of {} node indices", arity.min)
                                          : fmt::format("\"inputs\" is not an array of {} to {} node indices",
                                                        arity.min, arity.max));
    }
    for (std::size_t slot = 0; slot < inputs.size(); ++slot) {
        const std::size_t k = count_of(inputs[slot], where, fmt::format("\"inputs\"[{}]", slot));
        if (k >= index) where.fail(fmt::format("input {} is not an earlier node", k));
        node.inputs.push_back(std::uint32_t(k));
    }
    node.shape = shape_of(member(j, "shape", where), where, "\"shape\"");
    const auto settings = j.find("settings");
    decode_settings(settings == j.end() ? nullptr : &*settings, node.op->template form<T>(), where, node.settings);
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
    if (node.op == nullptr) return tape.leaf(std::move(node.values), node.label, node.requires_grad);
    std::vector<Var<T>> inputs;
    for (const std::uint32_t k : node.inputs) inputs.push_back(vars[k]);
    const std::size_t before = tape.size();
    const Var<T> out = node.op->template form<T>().record(node.settings, inputs);
    const auto recorded = tape.recorded(out.index());
    if (tape.size() != before + 1 || recorded.kind == nullptr || *recorded.kind->op != *node.op->op) {
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
        const Where where = file.at(i, node.op != nullptr ? fmt::format("op {}", node.op->file_name)
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
    return parse_tape_scalar(read_file_bytes(file, "load_tape"), file);
}

Var<double> parse_tape(std::string_view text, std::string_view source, Tape<double>& tape) {
    return parse_into(text, source, tape);
}
Var<float> parse_tape(std::string_view text, std::string_view source, Tape<float>& tape) {
    return parse_into(text, source, tape);
}

Var<double> load_tape(const std::string& file, Tape<double>& tape) {
    return parse_into(read_file_bytes(file, "load_tape"), file, tape);
}
Var<float> load_tape(const std::string& file, Tape<float>& tape) {
    return parse_into(read_file_bytes(file, "load_tape"), file, tape);
}

}  // namespace tapegrad
