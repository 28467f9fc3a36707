// Saved tapes (io/tape_file.hpp): a recorded tape saved and loaded is the same graph bit for bit
// (every node's op, inputs, label and value), so it checks exactly like the original: the graph of
// every library op, the spec's attention, a transformer block, the retrieval model, a float tape;
// every op's settings away from their defaults (each rule's settings sample, tests/op_rules.hpp),
// and each setting changed in the file loads as that
// change (a loader that dropped or mixed up a setting fails here).
// Every file of the malformed corpus (tests/data/tape_files/bad_*.json) is refused with an
// io_error naming the file, the node and the fault, and leaves the tape empty; a tape of a user's
// op cannot be saved, and a save that fails leaves no file behind. parse_tape_scalar validates the
// values as the scalar the file names (what the tools pick the tape's type by); an unlabelled node
// is written without a label.
#define BOOST_TEST_MODULE tape_file
#include "op_rules.hpp"

#include "models/retrieval.hpp"

#include <nlohmann/json.hpp>

#include <bit>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::expect_same_report;
using tapegrad::testing::random_tensor;

namespace {

namespace fs = std::filesystem;

const fs::path corpus = TAPEGRAD_TAPE_FILES;

// A fresh directory for one test's files.
fs::path scratch_dir(std::string_view name) {
    const fs::path dir = fs::temp_directory_path() / fmt::format("tapegrad_tape_file_{}_{}", ::getpid(), name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

template <Scalar T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
    if (!(a.shape() == b.shape())) return false;
    for (std::size_t k = 0; k < a.size(); ++k) {
        if (std::bit_cast<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>(a[k]) !=
            std::bit_cast<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>(b[k])) {
            return false;
        }
    }
    return true;
}

// The loaded tape holds the saved graph node for node: op, inputs, label, value (bit for bit), and
// which leaves need a gradient; and it saves to the same text.
template <Scalar T>
void expect_same_graph(const Tape<T>& saved, const Var<T>& out, const Tape<T>& loaded, const Var<T>& out_loaded) {
    BOOST_TEST_REQUIRE(loaded.size() == out.index() + 1);
    BOOST_TEST(out_loaded.index() == out.index());
    for (std::uint32_t i = 0; i <= out.index(); ++i) {
        const auto a = saved.recorded(i), b = loaded.recorded(i);
        BOOST_TEST((a.kind == nullptr ? "leaf" : a.kind->name) == (b.kind == nullptr ? "leaf" : b.kind->name), "node " << i);
        BOOST_TEST((std::vector<std::uint32_t>(a.inputs.begin(), a.inputs.end()) ==
                    std::vector<std::uint32_t>(b.inputs.begin(), b.inputs.end())), "node " << i);
        BOOST_TEST(a.label == b.label, "node " << i);
        BOOST_TEST(a.requires_grad == b.requires_grad, "node " << i);
        BOOST_TEST(same_bits(a.value, b.value), "node " << i << " (" << (a.kind ? a.kind->name : "leaf") << ")");
    }
    BOOST_TEST(tape_file_text(loaded, out_loaded) == tape_file_text(saved, out));
}

// f() throws E, and E's message holds `words`.
template <class E, class F>
void expect_refusal(F f, std::string_view words) {
    const std::string message = testing::message_of<E>(f);
    BOOST_TEST(message.find(words) != std::string::npos, "message: " << message << "\nexpected words: " << words);
}

CheckOptions fast_mode() {
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    return options;
}

// Every op that has settings, each setting away from its default: the settings sample of each rule
// that gives one (tests/op_rules.hpp), each summed into J. A loader that dropped a setting, or read
// it into the wrong field, would give another graph, which expect_same_graph sees in the values or
// the text; an op whose settings decide its shape feeds a sum only, so that a changed setting the
// op accepts gives a graph that still records (the test below changes each setting).
template <class... Rule>
Var<double> sum_of_settings_samples(const testing::rules::SettingsLeaves& leaves, testing::rules::RuleList<Rule...>) {
    std::vector<Var<double>> terms;
    const auto add_sample = [&]<class R>(R*) {
        if constexpr (requires { R::settings_sample(leaves); }) terms.push_back(sum(R::settings_sample(leaves)));
    };
    (add_sample(static_cast<Rule*>(nullptr)), ...);
    Var<double> J = terms.at(0);
    for (std::size_t k = 1; k < terms.size(); ++k) J = add(J, terms[k]);
    return J;
}

Var<double> settings_graph(Tape<double>& tape) {
    std::mt19937_64 rng(29);
    Tensor<double> x = random_tensor({2, 4}, rng, 0.5);
    for (double& v : x.data()) v += 1.0;  // in [0.5, 1.5): inside clamp's bounds, pow's and sqrt's domain
    const testing::rules::SettingsLeaves leaves{
        .X = tape.leaf(x, "X"), .E = tape.leaf(random_tensor({5, 4}, rng), "E"),
        .gain = tape.leaf(random_tensor({4}, rng), "gain"), .bias = tape.leaf(random_tensor({4}, rng), "bias"),
        .keep = tape.constant(Tensor<double>::matrix({{1, 0, 1, 1}, {1, 1, 0, 1}}), "keep")};
    return sum_of_settings_samples(leaves, testing::rules::Rules{});
}

using Json = nlohmann::ordered_json;

std::string hex_text(double x) {
    std::array<char, 64> buffer{};
    const auto end = std::to_chars(buffer.data(), buffer.data() + buffer.size(), x, std::chars_format::hex).ptr;
    return std::string(buffer.data(), end);
}

// The document loaded and saved again, each node's declared shape changed to the one its op
// records (a changed axis changes its node's shape and those after it); nothing when an op refuses
// the changed graph.
std::optional<Json> load_following_shapes(Json document, std::string_view name) {
    const std::string said = "its output has shape [", file_says = "], the file says";
    for (std::size_t attempt = 0; attempt < 32; ++attempt) {
        try {
            Tape<double> loaded;
            const Var<double> out = parse_tape(document.dump(), name, loaded);
            return Json::parse(tape_file_text(loaded, out));
        } catch (const io_error& e) {
            const std::string message = e.what();
            const std::size_t at = message.find(said), node = message.find(": node "), end = message.find(file_says);
            if (at == std::string::npos || node == std::string::npos || end == std::string::npos) return std::nullopt;
            Json shape = Json::array();
            std::string dims = message.substr(at + said.size(), end - at - said.size());
            for (std::size_t k = 0; k < dims.size();) {  // "2x1x4"
                std::size_t d = 0;
                k = std::size_t(std::from_chars(dims.data() + k, dims.data() + dims.size(), d).ptr - dims.data()) + 1;
                shape.push_back(d);
            }
            document["nodes"][std::stoul(message.substr(node + 7))]["shape"] = shape;
        }
    }
    return std::nullopt;
}

// Other values for one saved setting: each kind of field changed in each way that can stay valid.
// The names of a choice field of a library op (an enum's names, from the op's declared fields);
// empty for a field of another kind.
std::vector<std::string> choice_names(const std::string& op, const std::string& key) {
    const SavedOp* saved = detail::find_saved_op(op);
    if (saved == nullptr) return {};
    const SettingsValue schema = saved->form<double>().schema();  // held: the loop reads into it
    for (const SettingsEntry& field : std::get<std::vector<SettingsEntry>>(schema)) {
        const auto* choice = std::get_if<SettingsChoice>(&field.value);
        if (field.name == key && choice != nullptr) return {choice->names.begin(), choice->names.end()};
    }
    return {};
}

// Values other than v for a setting: for a choice, its op's other names (`choices`).
std::vector<Json> changed_values(const Json& v, const std::vector<std::string>& choices = {}) {
    std::vector<Json> out;
    if (v.is_boolean()) out.push_back(!v.get<bool>());
    if (v.is_number_unsigned()) {
        out.push_back(v.get<std::size_t>() + 1);
        if (v.get<std::size_t>() > 0) out.push_back(v.get<std::size_t>() - 1);
    }
    for (const std::string& name : choices)
        if (v != name) out.push_back(name);
    double x = 0;
    if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), x, std::chars_format::hex);
        if (error == std::errc{} && end == s.data() + s.size()) out.insert(out.end(), {hex_text(2 * x), hex_text(x / 2)});
    }
    if (v.is_array() && !v.empty()) {
        Json reversed = Json::array(), bumped = v;
        for (auto it = v.rbegin(); it != v.rend(); ++it) reversed.push_back(*it);
        bumped[0] = v[0].get<std::size_t>() + 1;
        out.insert(out.end(), {reversed, bumped});
    }
    if (v.is_object()) {
        for (const auto& [key, member] : v.items()) {
            for (const Json& other : changed_values(member)) {
                Json changed = v;
                changed[key] = other;
                out.push_back(changed);
            }
        }
    }
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_graph_of_every_op_saved_and_loaded_is_the_same_graph_and_checks_alike) {
    Tape<double> tape;
    const Var<double> J = testing::every_op_graph(tape);
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(tape_file_text(tape, J), "every op", loaded);
    expect_same_graph(tape, J, loaded, J_loaded);
    expect_same_report(check_gradients(loaded, J_loaded, fast_mode()), check_gradients(tape, J, fast_mode()));
}

BOOST_AUTO_TEST_CASE(every_setting_away_from_its_default_round_trips) {
    Tape<double> tape;
    const Var<double> J = settings_graph(tape);
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(tape_file_text(tape, J), "settings", loaded);
    expect_same_graph(tape, J, loaded, J_loaded);
}

// Each saved setting of each op node changed in the file: where the op accepts the changed value,
// the loaded node holds it (saved again, the node's settings are the changed ones, and the graph is
// another), so no setting is dropped or read into another. Every setting must be taken at least
// once, or the test could not see it dropped.
BOOST_AUTO_TEST_CASE(a_changed_setting_loads_as_a_different_graph_for_every_op) {
    Tape<double> tape;
    const Var<double> J = settings_graph(tape);
    const Json original = Json::parse(tape_file_text(tape, J));
    std::set<std::string> taken, settings;
    for (std::size_t i = 0; i < original["nodes"].size(); ++i) {
        const Json& node = original["nodes"][i];
        if (!node.contains("settings")) continue;
        for (const auto& [key, value] : node["settings"].items()) {
            const std::string name = fmt::format("{}.{}", node["op"].get<std::string>(), key);
            settings.insert(name);
            for (const Json& other : changed_values(value, choice_names(node["op"].get<std::string>(), key))) {
                if (other == value) continue;  // [4, 4] reversed
                Json changed = original;
                changed["nodes"][i]["settings"][key] = other;
                const std::optional<Json> again = load_following_shapes(changed, name);
                if (!again) continue;
                BOOST_TEST((*again)["nodes"][i]["settings"] == changed["nodes"][i]["settings"], name << " = " << other.dump());
                BOOST_TEST(again->dump() != original.dump(), name << " = " << other.dump());
                taken.insert(name);
            }
        }
    }
    // Every field every library op's struct declares (its `fields`), as the registry's saved form
    // holds it: the graph above must save each (a new field without a node here fails, named).
    std::set<std::string> declared;
    for (const std::string_view op : LibraryOps::names) {
        const SavedOp* saved = detail::find_saved_op(op);
        BOOST_TEST_REQUIRE(saved != nullptr, op << " has no saved form");
        const SettingsValue schema = saved->form<double>().schema();
        for (const SettingsEntry& field : std::get<std::vector<SettingsEntry>>(schema)) {
            declared.insert(fmt::format("{}.{}", op, field.name));
        }
    }
    const std::string unsaved = testing::missing_names(declared, settings);
    BOOST_TEST(unsaved.empty(), "declared fields the settings graph does not save: " << unsaved);
    const std::string undeclared = testing::missing_names(settings, declared);
    BOOST_TEST(undeclared.empty(), "saved settings no op declares: " << undeclared);
    for (const std::string& name : settings) BOOST_TEST(taken.count(name) == 1u, name << ": no changed value was taken");
}

BOOST_AUTO_TEST_CASE(the_spec_graph_saved_to_a_file_checks_exactly_like_the_original) {
    const fs::path dir = scratch_dir("spec");
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 0}, {0, 1}, {1, 1}}), "X");
    const Var<double> W_Q = tape.leaf(Tensor<double>::matrix({{0.5, -1}, {1, 0.25}}), "W_Q");
    const Var<double> W_K = tape.leaf(Tensor<double>::matrix({{1, 0}, {0.5, 1}}), "W_K");
    const Var<double> W_V = tape.leaf(Tensor<double>::matrix({{2, 0, 1}, {0, 4, -1}}), "W_V");
    const AttentionResult<double> attn = attention(X, W_Q, W_K, W_V);
    const Var<double> G = tape.constant(Tensor<double>::matrix({{1, -2, 0.5}, {0.25, 1, 3}, {-1, 0.5, 2}}), "G");
    const Var<double> J = sum(attn.O * G);
    save_tape(dir / "spec.json", tape, J);
    BOOST_TEST((tape_file_scalar(dir / "spec.json") == TapeFileScalar::float64));
    Tape<double> loaded;
    const Var<double> J_loaded = load_tape(dir / "spec.json", loaded);
    expect_same_graph(tape, J, loaded, J_loaded);
    expect_same_report(check_gradients(loaded, J_loaded), check_gradients(tape, J));
    BOOST_TEST(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);  // the file alone
    fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_transformer_block_and_the_retrieval_model_round_trip_bit_for_bit) {
    const testing::SmallTransformer small;
    const TransformerConfig& c = small.config;
    const std::vector<Tensor<double>>& values = small.values;
    const std::vector<std::size_t>&tokens = small.tokens, &targets = small.targets;
    Tape<double> tape;
    const auto vars = TransformerVars<double>::record(tape, values, c);
    const Var<double> J = transformer_loss(vars, c, std::span<const std::size_t>(tokens),
                                           std::span<const std::size_t>(targets), 1);
    Tape<double> loaded;
    expect_same_graph(tape, J, loaded, parse_tape(tape_file_text(tape, J), "transformer", loaded));

    RetrievalConfig config;
    config.pairs = 3, config.keys = 4, config.values = 4, config.width = 8, config.heads = 2;
    std::mt19937_64 generator(3);
    const RetrievalBatch batch = make_retrieval_batch(config, 2, generator);
    const RetrievalParameters p = RetrievalParameters::initial(config);
    Tape<double> retrieval;
    const Var<double> loss = retrieval_loss(
        RetrievalVars<double>{retrieval.leaf(p.E, "E"), retrieval.leaf(p.P, "P"), retrieval.leaf(p.W_Q, "W_Q"),
                              retrieval.leaf(p.W_K, "W_K"), retrieval.leaf(p.W_V, "W_V"), retrieval.leaf(p.W_O, "W_O"),
                              retrieval.leaf(p.W_U, "W_U")},
        batch, config.heads);
    Tape<double> retrieval_loaded;
    expect_same_graph(retrieval, loss, retrieval_loaded, parse_tape(tape_file_text(retrieval, loss), "retrieval", retrieval_loaded));
}

BOOST_AUTO_TEST_CASE(a_float_tape_round_trips_and_loads_only_as_float) {
    std::mt19937_64 rng(5);
    Tape<float> tape;
    const Var<float> X = tape.leaf(tensor_cast<float>(random_tensor({3, 4}, rng)), "X");
    const Var<float> W = tape.leaf(tensor_cast<float>(random_tensor({4, 4}, rng)), "W");
    const Var<float> J = sum(layer_norm(gelu(matmul(X, W)), tape.constant(Tensor<float>({4}, 1.5f)),
                                        tape.constant(Tensor<float>({4}, 0.25f))) * 0.1f);
    const std::string text = tape_file_text(tape, J);
    BOOST_TEST((parse_tape_scalar(text, "float tape") == TapeFileScalar::float32));
    Tape<float> loaded;
    const Var<float> J_loaded = parse_tape(text, "float tape", loaded);
    expect_same_graph(tape, J, loaded, J_loaded);
    expect_same_report(check_gradients(loaded, J_loaded), check_gradients(tape, J));
    Tape<double> wrong;
    expect_refusal<io_error>([&] { (void)parse_tape(text, "float tape", wrong); },
                                               "float tape: it holds a float32 tape; load it into a Tape<float>");
    BOOST_TEST(wrong.size() == 0u);
}

// parse_tape_scalar (and tape_file_scalar, which reads a file through it: what tapegrad-check and
// tapegrad-audit choose the tape's type by) reads the values as the scalar the file names, wherever
// "scalar" stands among the root's keys (here first, before "format"): a float32 file whose value
// overflows float is refused, as loading it into a Tape<float> refuses it, not passed as valid
// because the value would fit a double.
BOOST_AUTO_TEST_CASE(the_scalar_named_anywhere_in_the_root_is_the_type_the_values_are_validated_as) {
    const auto document = [](std::string_view value) {
        return fmt::format(R"({{"scalar": "float32", "format": "tapegrad-tape", "version": 1, "output": 0, "nodes": [
{{"node":"leaf","label":"x","shape":[1],"values":["{}"]}}]}}
)", value);
    };
    BOOST_TEST((parse_tape_scalar(document("1p+0"), "one") == TapeFileScalar::float32));
    expect_refusal<io_error>([&] { (void)parse_tape_scalar(document("1p+200"), "large"); },
                             "large: node 0 (leaf): value 0 \"1p+200\" is not a float32 in hexadecimal floating-point text");
    Tape<float> tape;
    expect_refusal<io_error>([&] { (void)parse_tape(document("1p+200"), "large", tape); },
                             "value 0 \"1p+200\" is not a float32");
}

// Each file of the corpus, and the fault its message must name (the file's name is in every one).
BOOST_AUTO_TEST_CASE(every_malformed_file_is_refused_naming_the_file_the_node_and_the_fault) {
    const std::map<std::string, std::string> faults{
        {"bad_not_json.json", "not a JSON document"},
        {"bad_truncated.json", "not a JSON document"},
        {"bad_not_an_object.json", "the document is not a JSON object"},
        {"bad_format.json", "\"format\" is not \"tapegrad-tape\""},
        {"bad_version.json", "format version 2 is not supported (this library reads version 1)"},
        {"bad_version_text.json", "format version \"1\" is not supported"},
        {"bad_version_float.json", "format version 1.0 is not supported"},
        {"bad_scalar.json", "\"scalar\" \"float16\" is not \"float32\" or \"float64\""},
        {"bad_unknown_key.json", "unknown key \"comment\""},
        {"bad_no_nodes.json", "\"nodes\" is not a non-empty array"},
        {"bad_output.json", "\"output\" is 3, but the output is the last of the 15 nodes"},
        {"bad_node_kind.json", "node 1 (parameter): \"node\" \"parameter\" is not \"leaf\", \"constant\" or \"op\""},
        {"bad_values_count.json", "node 0 (leaf): shape [3x2] holds 6 values, \"values\" has 5"},
        {"bad_value_text.json", "node 2 (leaf): value 1 \"0x1p+0\" is not a float64 in hexadecimal floating-point text"},
        {"bad_value_nan.json", "node 3 (leaf): value 0 (at (0, 0)) is NaN"},
        {"bad_rank.json", "node 0 (leaf): \"shape\" has rank 9, above the maximum 4"},
        {"bad_dimension.json", "node 0 (leaf): \"shape\"[0] is not a non-negative integer"},
        {"bad_unknown_op.json", "node 4 (op softmax_fast): op \"softmax_fast\" is not one of the library's ops"},
        {"bad_input_later.json", "node 4 (op matmul): input 14 is not an earlier node"},
        {"bad_input_count.json", "node 4 (op matmul): \"inputs\" is not an array of 2 node indices"},
        {"bad_missing_setting.json", "node 9 (op scale): setting \"c\" is missing"},
        {"bad_unknown_setting.json", "node 9 (op scale): unknown setting \"factor\""},
        {"bad_setting_text.json", "node 9 (op scale): c \"one half\" is not a float64 in hexadecimal floating-point text"},
        {"bad_shape_mismatch.json", "node 8 (op matmul): matmul: inner dimensions differ"},
        {"bad_declared_shape.json", "node 4 (op matmul): its output has shape [3x2], the file says [2x3]"},
        {"bad_label.json", "node 1 (leaf): \"label\" is not a string"},
        // The first pass: what a JSON tree would hide (a duplicate key, the last one winning) or
        // could not hold (values beyond the shape, refused after the first one too many).
        {"bad_duplicate_root_key.json", "load_tape: " + (corpus / "bad_duplicate_root_key.json").string() + ": duplicate key \"version\""},
        {"bad_duplicate_values.json", "node 0 (leaf): duplicate key \"values\""},
        {"bad_duplicate_setting.json", "node 9 (op scale): duplicate key \"c\" in \"settings\""},
        {"bad_version_zero.json", "format version 0 is not supported (this library reads version 1)"},
        {"bad_version_negative.json", "format version -1 is not supported"},
        {"bad_version_wraps.json", "format version 4294967297 is not supported"},
        {"bad_values_too_many.json", "node 0 (leaf): shape [3x2] holds 6 values, \"values\" has more"},
        {"bad_values_before_shape.json", "node 0 (leaf): shape [3x2] holds 6 values, \"values\" has 5"},
        {"bad_value_not_string.json", "node 0 (leaf): value 0 is not a string of hexadecimal floating-point text"},
        {"bad_value_nested.json", "node 0 (leaf): nested deeper than the format's 6 levels"},
        {"bad_too_many_keys.json", "node 0 (leaf): an object with more than 16 keys"},
        {"bad_long_shape.json", "node 0 (leaf): \"shape\" has more than 64 elements"},
        // Found by mutation testing (make_corpus.py says which mutant each one kills).
        {"bad_output_node_like.json", "\"output\" is not a non-negative integer"},
        {"bad_values_too_many_rank4.json", "node 0 (leaf): shape [1x1x3x2] holds 6 values, \"values\" has more"},
        {"bad_values_count_first_pass.json", "node 1 (leaf): shape [2x2] holds 4 values, \"values\" has 5"},
        {"bad_values_not_array.json", "node 0 (leaf): \"values\" is not an array"},
        {"bad_op_not_string.json", "node 4 (op ): \"op\" is not a string"},
        {"bad_shape_too_large.json", "node 0 (leaf): Shape: [1048576x1048576x2] elements exceed the limit of 1099511627776"},
    };
    std::size_t files = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(corpus)) {
        const std::string name = entry.path().filename().string();
        if (!name.starts_with("bad_")) continue;
        ++files;
        const auto fault = faults.find(name);
        BOOST_TEST_REQUIRE((fault != faults.end()), "no expected fault listed for " << name);
        Tape<double> tape;
        expect_refusal<io_error>([&] { (void)load_tape(entry.path(), tape); },
                                                   fmt::format("load_tape: {}", entry.path().string()));
        expect_refusal<io_error>([&] { (void)load_tape(entry.path(), tape); }, fault->second);
        BOOST_TEST(tape.size() == 0u, name << " left nodes on the tape");
    }
    BOOST_TEST(files == faults.size());  // every listed fault has its file
    // The valid file the corpus is made from loads, checks, and passes.
    Tape<double> tape;
    const Var<double> J = load_tape(corpus / "spec.json", tape);
    BOOST_TEST(check_gradients(tape, J).passed);
}

// The format's "label" is optional, and the writer leaves it out where a node has none (leaf,
// constant and op alike); a labelled node keeps its label.
BOOST_AUTO_TEST_CASE(an_unlabelled_node_is_saved_without_a_label_key) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>({2}, 1.0));
    const Var<double> C = tape.constant(Tensor<double>({2}, 2.0));
    const Var<double> J = sum(X * C);
    const std::string text = tape_file_text(tape, J);
    BOOST_TEST(text.find("\"label\"") == std::string::npos, text);
    Tape<double> labelled;
    const Var<double> Y = labelled.leaf(Tensor<double>({2}, 1.0), "Y");
    BOOST_TEST(tape_file_text(labelled, sum(Y * Y)).find("\"label\":\"Y\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_missing_file_and_a_tape_that_is_not_empty_are_refused) {
    Tape<double> tape;
    expect_refusal<io_error>([&] { (void)load_tape(corpus / "no_such_file.json", tape); },
                                               "cannot open");
    (void)tape.leaf(Tensor<double>({1}, 1.0));
    expect_refusal<usage_error>([&] { (void)load_tape(corpus / "spec.json", tape); },
                                                  "the tape to load into must be empty (it holds 1 nodes)");
}

// An op registered for re-runs alone (a test's broken variant, register_siblings) is not saved; a
// user's op registered whole (register_op) is: tests/test_registry.cpp.
BOOST_AUTO_TEST_CASE(an_op_not_registered_for_saving_is_refused_and_a_failed_save_leaves_no_file) {
    const fs::path dir = scratch_dir("refused");
    Tape<double> tape;
    const Var<double> S = tape.leaf(Tensor<double>::matrix({{1, 2}, {3, 4}}), "S");
    const Var<double> A = tape.template record<testing::SoftmaxWithoutDenominator>({S});
    const Var<double> J = sum(A * A);
    expect_refusal<usage_error>([&] { save_tape(dir / "user.json", tape, J); },
                                                  "op 'softmax without denominator path' (node 1) is not registered for saving");
    // The target is a directory: the rename fails, and the temporary file goes with it.
    fs::create_directory(dir / "taken");
    Tape<double> plain;
    const Var<double> P = plain.leaf(Tensor<double>::matrix({{1, 2}, {3, 4}}), "P");
    const Var<double> K = sum(P * P);
    expect_refusal<io_error>([&] { save_tape(dir / "taken", plain, K); }, "cannot rename");
    expect_refusal<io_error>([&] { save_tape(dir / "missing" / "k.json", plain, K); }, "cannot create");
    BOOST_TEST(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);  // only "taken"
    BOOST_TEST(fs::is_empty(dir / "taken"));
    fs::remove_all(dir);
}
