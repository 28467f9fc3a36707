// Saved tapes' structure (io/tape_file.hpp, docs/tape-file.md), by generation instead of a corpus
// of hand-made files: valid documents saved by the library, covering every op of LibraryOps, every
// node kind (leaf, constant, op) and both scalars (float64, float32), are damaged in each way below
// at every position the damage can take. Each damaged document must be refused with an io_error
// whose message names load_tape, the source, the node (where the fault is inside one) and the fault,
// and the tape must be left empty; or, where the damage leaves an equivalent document, it must load
// to the same graph as the undamaged one (the same text saved again: nodes, values, settings).
//
// | kind           | generated, at every position                                  | the message holds           |
// |----------------|---------------------------------------------------------------|-----------------------------|
// | duplicate_key  | each key of the root, of each node, of its settings and of    | duplicate key "K" (in       |
// |                | fused_attention's tiles written twice, the twin at each place | "settings", in "tiles")     |
// |                | of its object (beside it, keys between, before and after)     |                             |
// | misplaced_key  | each key of each object kind (root, leaf/constant, op node,   | unknown key "K", unknown    |
// |                | every op's settings, tiles) put in every object of every kind | setting "K", unknown field  |
// |                | lacking it, first or last (settings made for an op without)   | of "tiles" "K"              |
// | missing_key    | each required key removed: the root's five; node, shape,      | "K" is missing, setting "K" |
// |                | values; node, op, inputs, shape, settings; each setting and   | is missing                  |
// |                | each field of tiles                                           |                             |
// | bad_number     | each integer (every dim, input, version, output, integer      | the field, by name and      |
// |                | setting and element of a settings array) replaced by -1, 2.5, | position                    |
// |                | 2.0, 1e30, 2^64, 2^64-1, "2", null, true, [2], {}             |                             |
// | empty_size     | each dim made 0 (values kept, values emptied), empty inputs,  | the count, the empty shape  |
// |                | values, nodes, settings, tiles and settings arrays            | (named by the op it feeds), |
// |                |                                                               | the missing setting         |
// | bad_value_text | each value and real setting's text replaced by "1.5", "nan",  | the value or setting, and   |
// |                | "0x1p+0", "", "1p+99999" and a text the tape's scalar cannot  | why                         |
// |                | hold exactly ("1.0000000000001p+0" for float32)               |                             |
// | wrong_kind     | each node's shape replaced by 4, "2x3", {} and null; each     | is not an array of          |
// |                | true/false setting by "true", 1 and null; each choice setting | dimensions, is not true or  |
// |                | (gelu's form, rope's pairing) by an unknown name and by 1     | false, is not "a" or "b"    |
//
// The only equivalent damage is an empty "settings" object on an op that has no settings. The base
// documents are small (one op node and its inputs), so that each of the tens of thousands of
// damaged copies loads in microseconds. A second test holds the rule behind bad_value_text's "1.5"
// and inexact texts at the edges of each scalar (subnormals, the largest value, other spellings).
#define BOOST_TEST_MODULE tape_file_structure
#include "op_rules.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <bit>
#include <charconv>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

using namespace tapegrad;

namespace {

using Json = nlohmann::ordered_json;

// ---- the base documents ----

struct Base {
    std::string name;  // "float64 matmul": the source its messages name
    bool float32 = false;
    std::string text;  // as the library wrote it
    Json doc;          // the text parsed
};

template <Scalar T>
std::string hex_text(T x) {
    std::array<char, 64> buffer{};
    const auto end = std::to_chars(buffer.data(), buffer.data() + buffer.size(), x, std::chars_format::hex).ptr;
    return std::string(buffer.data(), end);
}

// The graph of every op (tests/op_rules.hpp) recorded on a tape of T.
template <Scalar T>
Var<T> every_op_graph_at(Tape<T>& tape) {
    const testing::rules::Recipe recipe = testing::rules::draw_every_rule(17);
    const auto leaves = testing::rules::leaves_of(recipe);
    std::array<Var<T>, testing::rules::leaf_count> vars;
    for (std::size_t l = 0; l < vars.size(); ++l) vars[l] = tape.leaf(tensor_cast<T>(leaves[l].value), leaves[l].name);
    return testing::rules::Graph<>{&recipe}(vars);
}

// One document per op of the every-op graph (its first node of that op): the op's inputs as a leaf
// (the first) and constants (the others) holding the values the op read, the op labelled and last,
// loaded and saved again by the library.
template <Scalar T>
std::vector<Base> bases_at(std::string_view scalar) {
    Tape<T> tape;
    const Var<T> J = every_op_graph_at(tape);
    const Json whole = Json::parse(tape_file_text(tape, J));
    std::vector<Base> bases;
    std::set<std::string> seen;
    for (const Json& node : whole["nodes"]) {
        if (node["node"] != "op" || !seen.insert(node["op"].get<std::string>()).second) continue;
        Json nodes = Json::array(), inputs = Json::array();
        std::map<std::size_t, std::size_t> renumbered;
        for (const Json& input : node["inputs"]) {
            const std::size_t k = input.get<std::size_t>();
            if (!renumbered.contains(k)) {
                const auto recorded = tape.recorded(k);
                const bool constant = recorded.kind == nullptr ? !recorded.requires_grad : !nodes.empty();
                Json leaf = Json::object();
                leaf["node"] = constant ? "constant" : "leaf";
                if (!constant) leaf["label"] = fmt::format("x{}", nodes.size());
                leaf["shape"] = testing::rules::dims_of(recorded.value.shape());
                leaf["values"] = Json::array();
                for (const T& x : recorded.value.data()) leaf["values"].push_back(hex_text(x));
                renumbered[k] = nodes.size();
                nodes.push_back(std::move(leaf));
            }
            inputs.push_back(renumbered[k]);
        }
        Json op = node;
        op["inputs"] = inputs;
        op["label"] = "y";
        nodes.push_back(std::move(op));
        Json doc = Json::object();
        doc["format"] = "tapegrad-tape";
        doc["version"] = 1;
        doc["scalar"] = scalar;
        doc["output"] = nodes.size() - 1;
        doc["nodes"] = std::move(nodes);
        const std::string name = fmt::format("{} {}", scalar, node["op"].get<std::string>());
        Tape<T> loaded;
        const Var<T> out = parse_tape(doc.dump(), name, loaded);
        Base base{name, std::is_same_v<T, float>, tape_file_text(loaded, out), {}};
        base.doc = Json::parse(base.text);
        bases.push_back(std::move(base));
    }
    return bases;
}

// ---- writing a document with one value replaced by raw text ----

// The document's text with the value at `at` (a pointer into `j`) written as `raw`: what nlohmann
// cannot hold (an object with a key twice, 2.0, 18446744073709551616) is written as text.
void write(std::string& out, const Json& j, const Json* at, std::string_view raw) {
    if (&j == at) {
        out += raw;
        return;
    }
    if (j.is_object()) {
        out += '{';
        bool first = true;
        for (const auto& [key, value] : j.items()) {
            if (!first) out += ',';
            first = false;
            out += Json(key).dump();
            out += ':';
            write(out, value, at, raw);
        }
        out += '}';
    } else if (j.is_array()) {
        out += '[';
        for (std::size_t k = 0; k < j.size(); ++k) {
            if (k > 0) out += ',';
            write(out, j[k], at, raw);
        }
        out += ']';
    } else {
        out += j.dump();
    }
}

// An object as an ordered list of (key, value's text), which may hold a key twice.
using Members = std::vector<std::pair<std::string, std::string>>;

Members members_of(const Json& object) {
    Members members;
    for (const auto& [key, value] : object.items()) members.emplace_back(key, value.dump());
    return members;
}

std::string object_text(const Members& members) {
    std::string text = "{";
    for (std::size_t k = 0; k < members.size(); ++k) {
        text += fmt::format("{}{}:{}", k == 0 ? "" : ",", Json(members[k].first).dump(), members[k].second);
    }
    return text + "}";
}

Members without(Members members, std::string_view key) {
    std::erase_if(members, [&](const auto& m) { return m.first == key; });
    return members;
}

Members inserted(Members members, std::size_t place, std::string key, std::string value) {
    members.insert(members.begin() + std::ptrdiff_t(place), {std::move(key), std::move(value)});
    return members;
}

// ---- the damage ----

enum class Kind { duplicate_key, misplaced_key, missing_key, bad_number, empty_size, bad_value_text, wrong_kind };
constexpr std::array<std::string_view, 7> kind_names{"duplicate_key", "misplaced_key",  "missing_key", "bad_number",
                                                     "empty_size",    "bad_value_text", "wrong_kind"};

// One damaged document: the base with the value at `at` written as `raw`.
struct Case {
    Kind kind;
    std::string what;  // the damage, for a failure's message
    const Json* at = nullptr;
    std::string raw;
    std::optional<std::size_t> node;  // the node the message must name
    std::vector<std::string> words;   // the message must hold each
    bool equivalent = false;          // the same graph as the base: it must load as the base does
};

using Sink = std::function<void(Case)>;

// The objects of a document, by kind: what keys each kind has, and where each object is.
enum class ObjectKind { root, leaf, op_node, settings, tiles };

struct Object {
    ObjectKind kind;
    const Json* json;                 // nullptr: the settings an op without settings would have
    std::optional<std::size_t> node;  // the node it is or is in
    const Json* node_json = nullptr;  // that node
};

std::vector<Object> objects_of(const Json& doc) {
    std::vector<Object> objects{{ObjectKind::root, &doc, std::nullopt}};
    const Json& nodes = doc["nodes"];
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Json& node = nodes[i];
        const bool op = node["node"] == "op";
        objects.push_back({op ? ObjectKind::op_node : ObjectKind::leaf, &node, i, &node});
        if (!op) continue;
        const auto settings = node.find("settings");
        objects.push_back({ObjectKind::settings, settings == node.end() ? nullptr : &*settings, i, &node});
        if (settings != node.end() && settings->contains("tiles")) {
            objects.push_back({ObjectKind::tiles, &(*settings)["tiles"], i, &node});
        }
    }
    return objects;
}

// The keys an object of a kind may hold; for settings, its op's fields.
std::set<std::string> keys_of(const Object& o) {
    switch (o.kind) {
        case ObjectKind::root:
            return {"format", "version", "scalar", "output", "nodes"};
        case ObjectKind::leaf:
            return {"node", "label", "shape", "values"};
        case ObjectKind::op_node:
            return {"node", "op", "inputs", "label", "shape", "settings"};
        case ObjectKind::tiles:
            return {"query", "key"};
        case ObjectKind::settings:
            break;
    }
    std::set<std::string> fields;
    const SavedOp* saved = detail::find_saved_op((*o.node_json)["op"].get<std::string>());
    const SettingsValue schema = saved->form<double>().schema();  // held: the loop reads into it
    for (const SettingsEntry& field : std::get<std::vector<SettingsEntry>>(schema)) fields.emplace(field.name);
    return fields;
}

// The names of an op's real-valued settings (hexadecimal text, like values).
std::set<std::string> real_fields(const std::string& op) {
    std::set<std::string> reals;
    const SettingsValue schema = detail::find_saved_op(op)->form<double>().schema();
    for (const SettingsEntry& field : std::get<std::vector<SettingsEntry>>(schema)) {
        if (std::holds_alternative<double>(field.value) || std::holds_alternative<float>(field.value)) {
            reals.emplace(field.name);
        }
    }
    return reals;
}

std::string in_suffix(ObjectKind kind) {
    return kind == ObjectKind::settings ? " in \"settings\"" : kind == ObjectKind::tiles ? " in \"tiles\"" : "";
}

// Each key of each object written twice, the twin inserted at each place among the object's keys.
void duplicate_keys(const Json& doc, const Sink& emit) {
    for (const Object& o : objects_of(doc)) {
        if (o.json == nullptr) continue;
        const Members members = members_of(*o.json);
        for (std::size_t k = 0; k < members.size(); ++k) {
            for (std::size_t place = 0; place <= members.size(); ++place) {
                emit({Kind::duplicate_key,
                      fmt::format("\"{}\" of node {} twice, the twin at place {}", members[k].first,
                                  o.node ? std::to_string(*o.node) : "-", place),
                      o.json,
                      object_text(inserted(members, place, members[k].first, members[k].second)),
                      o.node,
                      {fmt::format("duplicate key \"{}\"{}", members[k].first, in_suffix(o.kind))}});
            }
        }
    }
}

// Every key any object of the documents holds, with a value it had (a shallow one for "nodes" and
// "settings", so that the damage is the key, not the nesting).
std::map<std::string, Json> key_universe(const std::vector<Base>& bases) {
    std::map<std::string, Json> keys;
    for (const Base& base : bases) {
        for (const Object& o : objects_of(base.doc)) {
            if (o.json == nullptr) continue;
            for (const auto& [key, value] : o.json->items()) keys.emplace(key, value);
        }
    }
    keys["nodes"] = Json::array();
    keys["settings"] = Json{{"axis", 0}, {"keepdims", false}};
    return keys;
}

// Each key of every kind put in every object of each kind that lacks it, first or last in turn; an
// op without settings is given a settings object holding the key.
void misplaced_keys(const Json& doc, const std::map<std::string, Json>& universe, const Sink& emit) {
    for (const Object& o : objects_of(doc)) {
        const std::set<std::string> own = keys_of(o);
        const Members members = o.json == nullptr ? Members{} : members_of(*o.json);
        std::size_t turn = 0;
        for (const auto& [key, value] : universe) {
            if (own.contains(key)) continue;
            Json placed = value;
            if (key == "values" && o.kind == ObjectKind::op_node) {  // as many as its shape holds: the key is the fault
                std::size_t count = 1;
                for (const Json& d : (*o.json)["shape"]) count *= d.get<std::size_t>();
                placed = Json(std::vector<std::string>(count, "0p+0"));
            }
            const std::size_t place = turn++ % 2 == 0 ? 0 : members.size();
            const std::string object = object_text(inserted(members, place, key, placed.dump()));
            const std::string words = o.kind == ObjectKind::settings ? fmt::format("unknown setting \"{}\"", key)
                                      : o.kind == ObjectKind::tiles
                                          ? fmt::format("unknown field of \"tiles\" \"{}\"", key)
                                          : fmt::format("unknown key \"{}\"", key);
            const std::string what =
                fmt::format("\"{}\" in node {} at place {}", key, o.node ? std::to_string(*o.node) : "-", place);
            if (o.json != nullptr) {
                emit({Kind::misplaced_key, what, o.json, object, o.node, {words}});
            } else {  // the settings an op without settings lacks
                emit({Kind::misplaced_key,
                      what,
                      o.node_json,
                      object_text(
                          inserted(members_of(*o.node_json), members_of(*o.node_json).size(), "settings", object)),
                      o.node,
                      {words}});
            }
        }
    }
}

// Each required key removed.
void missing_keys(const Json& doc, const Sink& emit) {
    for (const Object& o : objects_of(doc)) {
        if (o.json == nullptr) continue;
        for (const auto& [key, value] : o.json->items()) {
            if (key == "label") continue;  // optional
            std::string words = fmt::format("\"{}\" is missing", key);
            // Without its settings, an op misses each: the first is named.
            if (key == "settings") words = fmt::format("setting \"{}\" is missing", value.begin().key());
            if (o.kind == ObjectKind::settings) words = fmt::format("setting \"{}\" is missing", key);
            if (o.kind == ObjectKind::tiles) words = fmt::format("setting \"tiles.{}\" is missing", key);
            emit({Kind::missing_key,
                  fmt::format("\"{}\" of node {} removed", key, o.node ? std::to_string(*o.node) : "-"),
                  o.json,
                  object_text(without(members_of(*o.json), key)),
                  o.node,
                  {words}});
        }
    }
}

// The replacements of an integer. The largest is a JSON non-negative integer: it passes the check
// of its type and meets the check of its range.
constexpr std::array<std::string_view, 11> bad_numbers{
    "-1", "2.5", "2.0", "1e30", "18446744073709551616", "18446744073709551615", "\"2\"", "null", "true", "[2]", "{}"};
constexpr std::string_view largest = "18446744073709551615";

// Calls f(value, name) for each integer in a settings object: "axis", "tiles.query", "targets"[2].
void integer_settings(const Json& j, const std::string& name, bool element,
                      const std::function<void(const Json&, const std::string&)>& f) {
    if (j.is_object()) {
        for (const auto& [key, value] : j.items())
            integer_settings(value, name.empty() ? key : name + "." + key, false, f);
    } else if (j.is_array()) {
        for (std::size_t k = 0; k < j.size(); ++k) integer_settings(j[k], fmt::format("\"{}\"[{}]", name, k), true, f);
    } else if (j.is_number_unsigned()) {
        f(j, element ? name : fmt::format("\"{}\"", name));
    }
}

// Each integer replaced by each bad number.
void bad_numbers_in(const Json& doc, const Sink& emit) {
    const auto each = [&](const Json& at, std::optional<std::size_t> node, const std::string& what,
                          const std::function<std::vector<std::string>(std::string_view)>& words) {
        for (const std::string_view bad : bad_numbers) {
            emit({Kind::bad_number, fmt::format("{} = {}", what, bad), &at, std::string(bad), node, words(bad)});
        }
    };
    each(doc["version"], std::nullopt, "version", [](std::string_view) {
        return std::vector<std::string>{"format version ", " is not supported (this library reads version 1)"};
    });
    each(doc["output"], std::nullopt, "output", [](std::string_view bad) {
        return std::vector<std::string>{bad == largest
                                            ? fmt::format("\"output\" is {}, but the output is the last", bad)
                                            : "\"output\" is not a non-negative integer"};
    });
    const Json& nodes = doc["nodes"];
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Json& node = nodes[i];
        for (std::size_t k = 0; k < node["shape"].size(); ++k) {
            each(node["shape"][k], i, fmt::format("node {} shape[{}]", i, k), [k](std::string_view bad) {
                return std::vector<std::string>{bad == largest
                                                    ? "elements exceed the limit"
                                                    : fmt::format("\"shape\"[{}] is not a non-negative integer", k)};
            });
        }
        if (node["node"] != "op") continue;
        for (std::size_t k = 0; k < node["inputs"].size(); ++k) {
            each(node["inputs"][k], i, fmt::format("node {} inputs[{}]", i, k), [k](std::string_view bad) {
                return std::vector<std::string>{bad == largest
                                                    ? fmt::format("input {} is not an earlier node", bad)
                                                    : fmt::format("\"inputs\"[{}] is not a non-negative integer", k)};
            });
        }
        if (!node.contains("settings")) continue;
        integer_settings(node["settings"], "", false, [&](const Json& at, const std::string& name) {
            each(at, i, fmt::format("node {} setting {}", i, name), [&](std::string_view bad) {
                return std::vector<std::string>{bad == largest
                                                    ? fmt::format("setting {} is {}, above", name, bad)
                                                    : fmt::format("setting {} is not a non-negative integer", name)};
            });
        });
    }
}

// Each value replaced by one of another JSON kind, where the loader reads a kind of its own: every
// node's "shape" by a number, a string, an object and null ("is not an array of dimensions"); every
// true/false setting by a string, a number and null ("is not true or false"); every choice setting
// (gelu's form, rope's pairing) by an unknown name and a number, refused with each of its names.
void wrong_kinds(const Json& doc, const Sink& emit) {
    const Json& nodes = doc["nodes"];
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Json& node = nodes[i];
        for (const std::string_view raw : {"4", "\"2x3\"", "{}", "null"}) {
            emit({Kind::wrong_kind, fmt::format("node {} shape = {}", i, raw), &node["shape"], std::string(raw), i,
                  {"\"shape\" is not an array of dimensions"}});
        }
        if (node["node"] != "op" || !node.contains("settings")) continue;
        const SettingsValue schema = detail::find_saved_op(node["op"].get<std::string>())->form<double>().schema();
        for (const SettingsEntry& field : std::get<std::vector<SettingsEntry>>(schema)) {
            const std::string name(field.name);
            if (!node["settings"].contains(name)) continue;
            const Json& at = node["settings"][name];
            if (std::holds_alternative<bool>(field.value)) {
                for (const std::string_view raw : {"\"true\"", "1", "null"}) {
                    emit({Kind::wrong_kind, fmt::format("node {} setting {} = {}", i, name, raw), &at, std::string(raw), i,
                          {fmt::format("setting \"{}\" is not true or false", name)}});
                }
            } else if (const auto* choice = std::get_if<SettingsChoice>(&field.value)) {
                std::vector<std::string> quoted;
                for (const std::string_view n : choice->names) quoted.push_back(fmt::format("\"{}\"", n));
                const std::string names = quoted.size() == 2 ? fmt::format("{} or {}", quoted[0], quoted[1])
                                                             : fmt::format("{}", fmt::join(quoted, ", "));
                for (const std::string_view raw : {"\"none\"", "1"}) {
                    emit({Kind::wrong_kind, fmt::format("node {} setting {} = {}", i, name, raw), &at, std::string(raw), i,
                          {fmt::format("setting \"{}\" is not {}", name, names)}});
                }
            }
        }
    }
}

// What the op's own check says of each settings array made empty (reshape's "shape", permute's
// "axes", embedding's "indices", cross_entropy's "targets"); another array is held to its op's name.
const std::map<std::string, std::string> empty_array_words{{"shape", "into []"},
                                                           {"axes", "axes () name 0 axes"},
                                                           {"indices", "no indices given"},
                                                           {"targets", "0 targets for"}};

// Each size made zero or empty.
void empty_sizes(const Json& doc, const Sink& emit) {
    const Json& nodes = doc["nodes"];
    emit({Kind::empty_size, "no nodes", &nodes, "[]", std::nullopt, {"\"nodes\" is not a non-empty array"}});
    const std::size_t last = nodes.size() - 1;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Json& node = nodes[i];
        const bool op = node["node"] == "op";
        for (std::size_t k = 0; k < node["shape"].size(); ++k) {
            Json zero = node;
            zero["shape"][k] = 0;
            const std::string what = fmt::format("node {} shape[{}] = 0", i, k);
            if (op) {
                emit({Kind::empty_size, what, &node, zero.dump(), i, {"its output has shape", "the file says ["}});
                continue;
            }
            emit({Kind::empty_size, what + ", values kept", &node, zero.dump(), i, {"holds 0 values, \"values\" has"}});
            // An empty tensor is a valid leaf (a tape holds one); the op it feeds refuses it, naming its shape.
            std::vector<std::size_t> dims = node["shape"];
            dims[k] = 0;
            zero["values"] = Json::array();
            emit({Kind::empty_size,
                  what + ", no values",
                  &node,
                  zero.dump(),
                  last,
                  {testing::rules::shape_of(dims).to_string()}});
        }
        if (!op) {
            emit({Kind::empty_size,
                  fmt::format("node {}: no values", i),
                  &node["values"],
                  "[]",
                  i,
                  {"\"values\" has 0"}});
            continue;
        }
        emit({Kind::empty_size,
              fmt::format("node {}: no inputs", i),
              &node["inputs"],
              "[]",
              i,
              {"\"inputs\" is not an array of"}});
        const auto settings = node.find("settings");
        if (settings == node.end()) {  // an empty settings object where the op has none: the same document
            Json with = node;
            with["settings"] = Json::object();
            emit({Kind::empty_size, fmt::format("node {}: empty settings", i), &node, with.dump(), i, {}, true});
            continue;
        }
        emit({Kind::empty_size,
              fmt::format("node {}: empty settings", i),
              &*settings,
              "{}",
              i,
              {fmt::format("setting \"{}\" is missing", settings->begin().key())}});
        for (const auto& [key, value] : settings->items()) {
            if (value.is_object()) {
                emit({Kind::empty_size,
                      fmt::format("node {}: empty {}", i, key),
                      &value,
                      "{}",
                      i,
                      {fmt::format("setting \"{}.{}\" is missing", key, value.begin().key())}});
            }
            if (value.is_array() && !value.empty()) {  // the op's own check refuses it, in its own words
                const auto words = empty_array_words.find(key);
                // Except a reshape of one element: into [] it is valid (a scalar), and the loader
                // refuses the output's shape against the file's.
                const bool one_element =
                    testing::rules::shape_of(node["shape"].get<std::vector<std::size_t>>()).size() == 1;
                emit({Kind::empty_size,
                      fmt::format("node {}: empty {}", i, key),
                      &value,
                      "[]",
                      i,
                      {key == "shape" && one_element      ? std::string("its output has shape [], the file says [")
                       : words != empty_array_words.end() ? words->second
                                                          : fmt::format("{}: ", node["op"].get<std::string>())}});
            }
        }
    }
}

// Each value's and real setting's text replaced.
void bad_value_texts(const Json& doc, bool float32, const Sink& emit) {
    // Not exact in the tape's scalar: 1 + 2^-52 (a float64, not a float32), 1 + 2^-53 (neither).
    const std::string_view inexact = float32 ? "1.0000000000001p+0" : "1.00000000000008p+0";
    const std::string_view scalar = float32 ? "float32" : "float64";
    std::vector<std::string_view> texts{"1.5", "nan", "0x1p+0", "", "1p+99999", inexact};
    const auto why = [&](std::string_view text) -> std::string {
        if (text == "1.5") return "has no binary exponent";
        if (text == inexact) return fmt::format("is not exact in {}", scalar);
        return fmt::format("is not a {} in hexadecimal floating-point text", scalar);
    };
    const Json& nodes = doc["nodes"];
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const Json& node = nodes[i];
        if (node["node"] != "op") {
            for (std::size_t k = 0; k < node["values"].size(); ++k) {
                for (const std::string_view text : texts) {
                    emit({Kind::bad_value_text, fmt::format("node {} value {} = \"{}\"", i, k, text),
                          &node["values"][k], Json(text).dump(), i,
                          text == "nan"
                              ? std::vector<std::string>{fmt::format("value {} (at ", k), ") is NaN"}
                              : std::vector<std::string>{fmt::format("value {} \"{}\" {}", k, text, why(text))}});
                }
            }
            continue;
        }
        if (!node.contains("settings")) continue;
        for (const std::string& field : real_fields(node["op"].get<std::string>())) {
            for (const std::string_view text : texts) {
                emit({Kind::bad_value_text, fmt::format("node {} setting {} = \"{}\"", i, field, text),
                      &node["settings"][field], Json(text).dump(), i,
                      text == "nan" ? std::vector<std::string>{fmt::format("setting \"{}\" is NaN", field)}
                                    : std::vector<std::string>{fmt::format("{} \"{}\" {}", field, text, why(text))}});
            }
        }
    }
}

// ---- running the cases ----

struct Tally {
    std::size_t generated = 0, refused = 0, equivalent = 0, failed = 0;
};

// Loads the damaged document; a refusal must be an io_error naming load_tape, the source, the node
// and the fault, and leave the tape empty; an equivalent document must load to the base's graph.
// Failures are reported (the first 40 of each kind), not asserted case by case: Boost.Test's
// bookkeeping would cost more than the loading.
template <Scalar T>
void run(const Base& base, const Case& c, Tally& tally) {
    ++tally.generated;
    std::string text;
    text.reserve(base.text.size() + c.raw.size());
    write(text, base.doc, c.at, c.raw);
    std::string fault;
    Tape<T> tape;
    try {
        const Var<T> out = parse_tape(text, base.name, tape);
        if (!c.equivalent)
            fault = "loaded";
        else if (tape_file_text(tape, out) != base.text)
            fault = "loaded, but not as the original";
        else
            ++tally.equivalent;
    } catch (const io_error& e) {
        const std::string message = e.what();
        std::vector<std::string> words = c.words;
        words.push_back(fmt::format("load_tape: {}: ", base.name));
        if (c.node) words.push_back(fmt::format(": node {} (", *c.node));
        for (const std::string& w : words) {
            if (message.find(w) == std::string::npos)
                fault += fmt::format("{}\"{}\" not in: {}", fault.empty() ? "" : "; ", w, message);
        }
        if (c.equivalent) fault += "refused an equivalent document: " + message;
        if (tape.size() != 0) fault += fmt::format("; {} nodes left on the tape", tape.size());
        if (fault.empty()) ++tally.refused;
    } catch (const std::exception& e) {
        fault = fmt::format("{} instead of io_error: {}", typeid(e).name(), e.what());
    }
    if (fault.empty()) return;
    if (++tally.failed <= 40) {
        BOOST_ERROR(kind_names[std::size_t(c.kind)] << ": " << base.name << ": " << c.what << ": " << fault);
    }
}

// Lower bounds of each kind's count, from the documents alone (not from the generator), so that a
// generator that silently generates nothing of a kind fails.
std::array<std::size_t, 7> floors(const std::vector<Base>& bases) {
    std::array<std::size_t, 7> floor{};
    for (const Base& base : bases) {
        const Json& nodes = base.doc["nodes"];
        floor[std::size_t(Kind::duplicate_key)] += 5 * 6 + nodes.size() * 3 * 4;  // every node has 3 keys or more
        floor[std::size_t(Kind::misplaced_key)] += (nodes.size() + 1) * 5;  // at least the root's keys, or a node's
        floor[std::size_t(Kind::missing_key)] += 5 + nodes.size() * 3;
        std::size_t integers = 2, values = 0, dims = 0;
        for (const Json& node : nodes) {
            dims += node["shape"].size();
            integers += node["shape"].size() + (node.contains("inputs") ? node["inputs"].size() : 0);
            if (node.contains("values")) values += node["values"].size();
        }
        floor[std::size_t(Kind::bad_number)] += bad_numbers.size() * integers;
        floor[std::size_t(Kind::empty_size)] += 1 + dims + nodes.size();
        floor[std::size_t(Kind::bad_value_text)] += 5 * values;
        floor[std::size_t(Kind::wrong_kind)] += 4 * nodes.size();
    }
    return floor;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_damage_at_every_position_is_refused_by_name_or_loads_as_the_same_graph) {
    std::vector<Base> bases = bases_at<double>("float64");
    for (Base& base : bases_at<float>("float32")) bases.push_back(std::move(base));

    // The documents cover every op of the library at both scalars, and every node kind.
    std::set<std::string> covered, kinds;
    for (const Base& base : bases) {
        covered.insert(base.name);
        for (const Json& node : base.doc["nodes"])
            kinds.insert(fmt::format("{} {}", base.doc["scalar"].get<std::string>(), node["node"].get<std::string>()));
    }
    std::set<std::string> expected, expected_kinds;
    for (const std::string_view scalar : {"float64", "float32"}) {
        for (const std::string_view op : LibraryOps::names) expected.insert(fmt::format("{} {}", scalar, op));
        for (const std::string_view kind : {"leaf", "constant", "op"})
            expected_kinds.insert(fmt::format("{} {}", scalar, kind));
    }
    const std::string uncovered = testing::missing_names(expected, covered);
    BOOST_TEST(uncovered.empty(), "ops without a base document: " << uncovered);
    BOOST_TEST(testing::missing_names(expected_kinds, kinds).empty(),
               "node kinds without a node: " << testing::missing_names(expected_kinds, kinds));
    BOOST_TEST(testing::missing_names(kinds, expected_kinds).empty(),
               "unexpected node kinds: " << testing::missing_names(kinds, expected_kinds));

    const std::map<std::string, Json> universe = key_universe(bases);
    std::array<Tally, 7> tallies{};
    for (const Base& base : bases) {
        const Sink emit = [&](Case c) {
            Tally& tally = tallies[std::size_t(c.kind)];
            if (base.float32)
                run<float>(base, c, tally);
            else
                run<double>(base, c, tally);
        };
        duplicate_keys(base.doc, emit);
        misplaced_keys(base.doc, universe, emit);
        missing_keys(base.doc, emit);
        bad_numbers_in(base.doc, emit);
        empty_sizes(base.doc, emit);
        bad_value_texts(base.doc, base.float32, emit);
        wrong_kinds(base.doc, emit);
    }

    const std::array<std::size_t, 7> floor = floors(bases);
    std::size_t total = 0;
    for (std::size_t k = 0; k < tallies.size(); ++k) {
        const Tally& t = tallies[k];
        total += t.generated;
        BOOST_TEST_MESSAGE(fmt::format("{}: {} generated, {} refused by name, {} equivalent (floor {})", kind_names[k],
                                       t.generated, t.refused, t.equivalent, floor[k]));
        BOOST_TEST(t.generated >= floor[k], kind_names[k] << ": " << t.generated << " cases, fewer than " << floor[k]);
        BOOST_TEST(t.failed == 0u, kind_names[k] << ": " << t.failed << " cases failed (the first 40 are reported)");
        BOOST_TEST(t.refused + t.equivalent + t.failed == t.generated);
    }
    BOOST_TEST_MESSAGE(fmt::format("{} base documents, {} damaged documents", bases.size(), total));
}

// The rule behind bad_value_text's "1.5" and inexact texts, at the edges of each scalar: every value
// the writer can write loads bit for bit (zeros, the smallest subnormal, the largest finite, random
// bit patterns), as do exact texts in other spellings (leading zeros, a point first, a shifted
// exponent); a text with no binary exponent, or one bit below the scalar's precision or range, is
// refused by name rather than rounded.
template <Scalar T>
void expect_value_texts(std::string_view scalar) {
    const auto document = [&](std::string_view text) {
        return fmt::format(R"({{"format": "tapegrad-tape", "version": 1, "scalar": "{}", "output": 0, "nodes": [
{{"node":"leaf","shape":[1],"values":["{}"]}}]}})",
                           scalar, text);
    };
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    const auto loads_as = [&](std::string_view text, T x) {
        Tape<T> tape;
        try {
            const Var<T> v = parse_tape(document(text), "value", tape);
            BOOST_TEST(std::bit_cast<Bits>(v.value()[0]) == std::bit_cast<Bits>(x), text);
        } catch (const io_error& e) {
            BOOST_ERROR(scalar << " \"" << text << "\" refused: " << e.what());
        }
    };
    const auto refused = [&](std::string_view text, std::string_view words) {
        Tape<T> tape;
        const std::string message =
            testing::message_of<io_error>([&] { (void)parse_tape(document(text), "value", tape); });
        BOOST_TEST(message.find(words) != std::string::npos, scalar << " \"" << text << "\": " << message);
    };
    using limits = std::numeric_limits<T>;
    for (const T x : {T(0), -T(0), T(1), -T(1.5), limits::denorm_min(), T(3) * limits::denorm_min(), limits::min(),
                      limits::min() - limits::denorm_min(), limits::max(), -limits::max(), limits::epsilon(),
                      limits::infinity(), -limits::infinity()}) {
        loads_as(hex_text(x), x);
    }
    std::mt19937_64 rng(49);
    for (int k = 0; k < 2000; ++k) {
        const T x = std::bit_cast<T>(Bits(rng()));
        if (!is_nan(x)) loads_as(hex_text(x), x);
    }
    for (const std::string_view one : {"0.8p+1", ".8p+1", "10p-4", "0.000001p+24", "1.80p+0"})
        loads_as(one, one == "1.80p+0" ? T(1.5) : T(1));
    const std::string_view name = sizeof(T) == 4 ? "float32" : "float64";
    const std::string inexact = fmt::format("is not exact in {}", name);
    refused("1.5", "value 0 \"1.5\" has no binary exponent");
    refused("-10", "has no binary exponent");
    // Beyond the range, from_chars itself may refuse the text (out of range) before it is rounded:
    // either way the value is named and refused.
    const auto beyond = [&](std::string_view text) { refused(text, fmt::format("value 0 \"{}", text.substr(0, 16))); };
    if constexpr (sizeof(T) == 4) {
        loads_as("1.000002p+0", T(1) + limits::epsilon());
        refused("1.000001p+0", inexact);  // 1 + 2^-24: one bit below float's precision
        // Each letter digit in either case, last at 2^-24: an even one ends at 2^-23 (exact), an odd
        // one needs 2^-24 (inexact), so the exactness test must read each letter's own value.
        for (int d = 10; d < 16; ++d) {
            for (const char first : {'a', 'A'}) {
                const std::string text = fmt::format("1.00000{}p+0", char(first + d - 10));
                if (d % 2 == 0) loads_as(text, T(1) + T(d / 2) * limits::epsilon());
                else refused(text, inexact);
            }
        }
        refused("1.000001p-126", inexact);
        beyond("1.8p-149");                                       // 1.5 times the smallest subnormal
        beyond("1.fffffe8p+127");                                 // half a bit above the largest float
        beyond("0.0000000000000000000000000000000000000001p+0");  // 2^-160: below the subnormals
    } else {
        loads_as("1.0000000000001p+0", T(1) + limits::epsilon());
        refused("1.00000000000008p+0", inexact);  // 1 + 2^-53
        refused("1.00000000000008p-1022", inexact);
        beyond("1.8p-1074");
        beyond("1.fffffffffffff8p+1023");
    }
}

BOOST_AUTO_TEST_CASE(a_value_text_loads_exactly_or_is_refused_at_the_edges_of_each_scalar) {
    expect_value_texts<float>("float32");
    expect_value_texts<double>("float64");
}
