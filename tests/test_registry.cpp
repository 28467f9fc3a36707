// The registry of ops (autodiff/registry.hpp) and what it derives from an op's struct: a user's op
// saved as "user:<name>" and loaded back (refused, naming it, while unregistered), loaded from a
// shared library (load_ops: the good library, and the faults it must refuse), two structs under
// one name refused, a user's op named as a library op kept apart from it, an op registered for
// re-runs alone refused by save_tape; the tape's arity check; and the settings' fields as text
// (Tape::info, to_dot) and converted to another scalar type. Linked with libtapegrad.so, as
// tapegrad-check is, so that a loaded library registers into the same registry.
#define BOOST_TEST_MODULE registry
#include "support.hpp"
#include "tests/plugins/user_ops.hpp"

#include <string>

using namespace tapegrad;
using tapegrad::testing::message_of;

namespace {

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

// A saved tape of one user's op, written by hand as a user's program would save it: x (2 values)
// through affine(a = 2, b = 0.5), then a sum.
const std::string affine_tape = R"({"format": "tapegrad-tape", "version": 1, "scalar": "float64", "output": 2, "nodes": [
{"node": "leaf", "label": "x", "shape": [2], "values": ["1p-1", "-1.8p+0"]},
{"node": "op", "op": "user:affine", "inputs": [0], "shape": [2], "settings": {"a": "1p+1", "b": "1p-1"}},
{"node": "op", "op": "sum", "inputs": [1], "shape": []}
]}
)";

// Another struct that calls itself "affine".
struct OtherAffine : user_ops::Affine {
    static constexpr std::string_view name = "affine";
};

// A user's op named as a library op: saved as "user:scale", never confused with the library's scale.
struct UserScale : user_ops::Affine {
    static constexpr std::string_view name = "scale";
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return in[0].tape().template record<UserScale>({in[0]}, Settings<T>{s.a, s.b});
    }
};

// Registered for re-runs alone (as a test's fault control is): checked, but never saved.
struct SiblingsOnly : user_ops::Affine {
    static constexpr std::string_view name = "siblings only";
};

}  // namespace

// Before the library is loaded the tape's user op is unknown here: refused, naming the op and how to
// register it. After load_ops, the same text loads, keeps its settings, and passes the check.
BOOST_AUTO_TEST_CASE(a_user_op_loads_only_once_registered_from_its_library) {
    Tape<double> before;
    const std::string refusal = message_of<io_error>([&] { (void)parse_tape(affine_tape, "affine.json", before); });
    BOOST_TEST_MESSAGE(refusal);
    BOOST_TEST(contains(refusal, "node 1"));
    BOOST_TEST(contains(refusal, "\"user:affine\" is a user's op this program has not registered"));
    BOOST_TEST(contains(refusal, "register_op"));
    BOOST_TEST(contains(refusal, "--ops"));
    BOOST_TEST(before.size() == 0u);  // nothing half-loaded

    const std::vector<std::string> names = load_ops(TAPEGRAD_PLUGIN_GOOD);
    BOOST_TEST(names == std::vector<std::string>{"user:affine"});
    Tape<double> tape;
    const Var<double> J = parse_tape(affine_tape, "affine.json", tape);
    BOOST_TEST(J.value()[0] == (2 * 0.5 + 0.5) + (2 * -1.5 + 0.5));
    BOOST_TEST(tape.info(1).op == "affine");
    BOOST_TEST(tape.info(1).settings == "a=2, b=0.5");
    BOOST_TEST(check_gradients(tape, J).passed);
    // Saved again, the same text: the op's name space, its fields and values as they were.
    BOOST_TEST(contains(tape_file_text(tape, J), R"("op":"user:affine")"));
    BOOST_TEST(contains(tape_file_text(tape, J), R"("settings":{"a":"1p+1","b":"1p-1"})"));
}

// load_ops refuses what is not a library of ops, naming the file and the fault.
BOOST_AUTO_TEST_CASE(load_ops_refuses_a_missing_file_a_library_without_entry_point_and_one_that_registers_nothing) {
    const std::string missing = message_of<io_error>([] { (void)load_ops("/nonexistent/libnothing.so"); });
    BOOST_TEST(contains(missing, "cannot load '/nonexistent/libnothing.so'"), missing);
    const std::string no_entry = message_of<usage_error>([] { (void)load_ops("libm.so.6"); });
    BOOST_TEST(contains(no_entry, "'libm.so.6' has no entry point"), no_entry);
    BOOST_TEST(contains(no_entry, "tapegrad_register_ops"));
    const std::string nothing = message_of<usage_error>([] { (void)load_ops(TAPEGRAD_PLUGIN_NOTHING); });
    BOOST_TEST(contains(nothing, "registered no op"), nothing);
    BOOST_TEST(contains(nothing, "tapegrad_shared"));
}

BOOST_AUTO_TEST_CASE(two_structs_under_one_name_are_refused) {
    BOOST_TEST(register_op<user_ops::Affine>());
    BOOST_TEST(register_op<user_ops::Affine>());  // the same struct again: its entries replaced
    const std::string clash = message_of<usage_error>([] { (void)register_op<OtherAffine>(); });
    BOOST_TEST(contains(clash, "the op name 'user:affine' is already registered by another struct"), clash);
}

// A user's "scale" and the library's scale in one tape: each saved under its own name, each loaded
// as its own struct (the library's with one setting c, the user's with a and b).
BOOST_AUTO_TEST_CASE(a_user_op_named_as_a_library_op_is_kept_apart) {
    BOOST_TEST(register_op<UserScale>());
    Tape<double> tape;
    const auto x = tape.leaf(Tensor<double>(Shape{2}, std::vector<double>{1, 2}), "x");
    const Var<double> J = sum(scale(UserScale::record<double>({3, 1}, std::span(&x, 1)), 0.5));
    const std::string text = tape_file_text(tape, J);
    BOOST_TEST(contains(text, R"("op":"user:scale")"));
    BOOST_TEST(contains(text, R"("op":"scale")"));
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(text, "scales", loaded);
    BOOST_TEST(J_loaded.value()[0] == J.value()[0]);
    BOOST_TEST(loaded.info(1).settings == "a=3, b=1");
    BOOST_TEST(loaded.info(2).settings == "c=0.5");
}

BOOST_AUTO_TEST_CASE(an_op_registered_for_reruns_alone_is_not_saved) {
    BOOST_TEST(register_siblings<SiblingsOnly>());
    Tape<double> tape;
    const auto x = tape.leaf(Tensor<double>(Shape{2}, std::vector<double>{1, 2}), "x");
    const Var<double> J = sum(tape.record<SiblingsOnly>({x}, SiblingsOnly::Settings<double>{2, 0}));
    BOOST_TEST(check_gradients(tape, J).passed);  // re-run and checked
    const std::string refusal = message_of<usage_error>([&] { (void)tape_file_text(tape, J); });
    BOOST_TEST(contains(refusal, "op 'siblings only' (node 1) is not registered for saving"), refusal);
    BOOST_TEST(contains(refusal, "register_op"));
}

// The arity an op declares is enforced where it is recorded, naming the op and both counts.
BOOST_AUTO_TEST_CASE(the_tape_refuses_an_op_recorded_with_another_number_of_inputs) {
    Tape<double> tape;
    const auto x = tape.leaf(Tensor<double>(Shape{2}, std::vector<double>{1, 2}), "x");
    const std::string one = message_of<usage_error>([&] { (void)tape.record<Add>({x}); });
    BOOST_TEST(one == "add: 1 input given, it takes 2 inputs");
    const std::string three = message_of<usage_error>([&] { (void)tape.record<Exp>({x, x, x}); });
    BOOST_TEST(three == "exp: 3 inputs given, it takes 1 input");
    BOOST_TEST(tape.size() == 1u);
    BOOST_TEST(Concat::arity.text() == fmt::format("1 to {} inputs", max_arity));
}

// The settings' text every picture and description shows, from the fields: a scalar, flags and
// counts, a nested object, a choice, a proxy list, a long list shortened.
BOOST_AUTO_TEST_CASE(settings_print_from_their_fields) {
    Tape<double> tape;
    const auto x = tape.leaf(Tensor<double>(Shape{2, 4}, std::vector<double>(8, 0.25)), "x");
    const auto q = tape.leaf(Tensor<double>(Shape{2, 4}, std::vector<double>(8, 0.5)), "q");
    const std::vector<std::size_t> rows{0, 1, 1, 0, 1, 0, 0, 1, 1, 1};
    const Var<double> nodes[] = {scale(x, 0.125),
                                 permute(x, {1, 0}),
                                 gelu(x, GeluForm::erf),
                                 max(x, 1, true),
                                 fused_attention(q, q, q, true, 0),
                                 embedding(x, std::span(rows))};
    const std::string expected[] = {"c=0.125",
                                    "axes=[1, 0]",
                                    "form=erf",
                                    "axis=1, keepdims=true",
                                    "causal=true, query_offset=0, window=0, alibi_heads=0, tiles={query=128, key=128}",
                                    "indices=[0, 1, 1, 0, 1, 0, 0, 1, ... (10 in all)], sequences=0"};
    for (std::size_t k = 0; k < std::size(nodes); ++k) BOOST_TEST(tape.info(nodes[k].index()).settings == expected[k]);
    BOOST_TEST(tape.info(0).settings.empty());  // a leaf
    BOOST_TEST(contains(to_dot(tape), "scale\\nc=0.125\\n[2x4]"), to_dot(tape));
}

// Settings held in the tape's precision convert field by field to another scalar type (a re-run),
// exactly; other fields are copied.
BOOST_AUTO_TEST_CASE(settings_convert_field_by_field) {
    const Clamp::Settings<float> recorded{-0.1f, 0.3f};
    const Clamp::Settings<mp50> precise = detail::settings_as<Clamp, float, mp50>(recorded);
    BOOST_TEST(precise.lo == mp50(-0.1f));
    BOOST_TEST(precise.hi == mp50(0.3f));
    BOOST_TEST(precise.hi != mp50("0.3"));  // the float's value, not the decimal it was written from
    const Permute::Settings axes{{2, 0, 1, 0}, 3};
    const Permute::Settings same = detail::settings_as<Permute, double, mp50>(axes);
    BOOST_TEST(same.rank == 3u);
    BOOST_TEST((same.axes == axes.axes));
}

// The refusal of a saved tape's text with its first `from` replaced by `to` (loading it must fail).
std::string refusal_after(const std::string& text, const std::string& from, const std::string& to) {
    std::string changed = text;
    const std::size_t at = changed.find(from);
    BOOST_TEST_REQUIRE(at != std::string::npos, from << " is not in the saved text");
    changed.replace(at, from.size(), to);
    Tape<double> loaded;
    return message_of<io_error>([&] { (void)parse_tape(changed, "changed", loaded); });
}

// A file's settings that the op's fields cannot hold are refused with the field named.
BOOST_AUTO_TEST_CASE(a_file_setting_the_fields_cannot_hold_is_refused_by_name) {
    Tape<double> tape;
    const auto x = tape.leaf(Tensor<double>(Shape{2, 3}, std::vector<double>(6, 1.0)), "x");
    const std::string text = tape_file_text(tape, sum(permute(x, {1, 0})));
    BOOST_TEST(contains(refusal_after(text, R"("axes":[1,0])", R"("axes":[1,0,2,3,4])"),
                        "setting \"axes\" names 5 axes, above the maximum rank 4"));
    BOOST_TEST(contains(refusal_after(text, R"("axes":[1,0])", R"("axes":true)"), "setting \"axes\" is not an array"));
    BOOST_TEST(contains(refusal_after(text, R"("axes":[1,0])", R"("axis":[1,0])"), "unknown setting \"axis\""));
}

// Each kind of field given a value of another kind, and the settings given as no object: each
// refused with the setting and the kind it must have named.
BOOST_AUTO_TEST_CASE(a_file_setting_of_the_wrong_kind_is_refused_by_name) {
    Tape<double> tape;
    const auto x = tape.leaf(Tensor<double>(Shape{2, 4}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}), "x");
    const Var<double> attended = fused_attention(x, x, x, true, 0);
    const std::string text = tape_file_text(tape, sum(gelu(max(attended, 1, true), GeluForm::erf)));
    const std::string node = "load_tape: changed: node ";
    BOOST_TEST(refusal_after(text, R"("keepdims":true)", R"("keepdims":1)") ==
               node + "2 (op max): setting \"keepdims\" is not true or false");
    BOOST_TEST(refusal_after(text, R"("form":"erf")", R"("form":"exact")") ==
               node + "3 (op gelu): setting \"form\" is not \"tanh\" or \"erf\"");
    BOOST_TEST(refusal_after(text, R"("tiles":{"query":128,"key":128})", R"("tiles":128)") ==
               node + "1 (op fused_attention): setting \"tiles\" is not an object");
    BOOST_TEST(refusal_after(text, R"({"query":128,"key":128})", R"({"size":128,"key":128})") ==
               node + "1 (op fused_attention): unknown field of \"tiles\" \"size\"");
    BOOST_TEST(refusal_after(text, R"("settings":{"form":"erf"})", R"("settings":["erf"])") ==
               node + "3 (op gelu): \"settings\" is not an object");
}
