// The saved-tape document read in two passes (src/io/tape_document.hpp): the outline, a SAX pass
// that builds nothing and refuses what a tree would hide or could not hold (duplicate keys, a
// "values" array longer than its shape), and the tree, with the leaves' values read into typed
// storage instead of JSON nodes. Why two passes: the scalar type (and a node's shape) may come
// after the values in a document, and the first pass is what makes the second's memory a known
// size before it starts.
#include "src/io/tape_document.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <limits>
#include <optional>
#include <span>

namespace tapegrad::tape_document {

Where Where::at(std::size_t node, std::string_view what) const {
    Where inner(source_);
    inner.node_ = fmt::format("node {} ({})", node, what);
    return inner;
}

void Where::fail(std::string_view fault) const {
    if (node_.empty()) throw io_error(fmt::format("load_tape: {}: {}", source_, fault));
    throw io_error(fmt::format("load_tape: {}: {}: {}", source_, node_, fault));
}

namespace {

// What from_chars accepts but the format does not hold: a number without the binary exponent C's
// %a always writes ("1.5" is read as 0x1.5 = 1.3125, not as the decimal a person meant), and a
// number T cannot hold exactly (from_chars rounds to nearest: "1.0000000000001p+0" would load into
// a float tape as 1, silently another value than the file's). `s` is text from_chars has read whole
// as a T; the fault, or empty. Exactness is read off the text's bits: the significand's highest and
// lowest set bits, moved by the exponent, must lie within T's precision and range.
template <class T>
std::string format_fault(std::string_view s) {
    std::string_view number = s;
    if (!number.empty() && number.front() == '-') number.remove_prefix(1);
    const auto hex_digit = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    if (number.empty() || (number.front() != '.' && hex_digit(number.front()) < 0)) return {};  // inf, infinity, nan
    const std::size_t p = number.find_first_of("pP");
    if (p == std::string_view::npos) {
        return "has no binary exponent (C's %a form has one: \"1.8p+1\" for 3, not a decimal)";
    }
    const std::string_view significand = number.substr(0, p);
    const long long point = static_cast<long long>(std::min(significand.find('.'), significand.size()));
    std::optional<long long> high, low;  // the exponents of the highest and lowest set bits, before the exponent
    long long digit = 0;                 // the index of a hex digit among the significand's digits
    for (const char c : significand) {
        const int v = hex_digit(c);
        if (v < 0) continue;  // the point
        if (v != 0) {
            const long long weight = 4 * (point - 1 - digit);
            if (!high) high = weight + std::bit_width(unsigned(v)) - 1;
            low = weight + std::countr_zero(unsigned(v));
        }
        ++digit;
    }
    if (!high) return {};  // zero
    // The exponent, capped: beyond ±2^20 every bit is far out of T's range either way.
    std::string_view e = number.substr(p + 1);
    const bool negative = !e.empty() && e.front() == '-';
    if (!e.empty() && (e.front() == '-' || e.front() == '+')) e.remove_prefix(1);
    long long exponent = 0;
    for (const char c : e) exponent = std::min(exponent * 10 + (c - '0'), 1LL << 20);
    if (negative) exponent = -exponent;
    using limits = std::numeric_limits<T>;
    const long long top = *high + exponent, bottom = *low + exponent;
    if (top < limits::max_exponent && top - bottom < limits::digits &&
        bottom >= limits::min_exponent - limits::digits) {
        return {};
    }
    return fmt::format("is not exact in {} (it would be rounded)", sizeof(T) == 4 ? "float32" : "float64");
}

}  // namespace

template <class T>
bool exact_value(const Json& text, T& x, std::string& fault, std::string_view what) {
    if (!text.is_string()) {
        fault = fmt::format("{} is not a string of hexadecimal floating-point text", what);
        return false;
    }
    const std::string& s = text.get_ref<const std::string&>();
    const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), x, std::chars_format::hex);
    if (error != std::errc{} || end != s.data() + s.size()) {
        fault = fmt::format("{} \"{}\" is not a {} in hexadecimal floating-point text (as \"1.8p+1\" for 3)", what,
                            s.substr(0, 40), sizeof(T) == 4 ? "float32" : "float64");
        return false;
    }
    if (const std::string format = format_fault<T>(s); !format.empty()) {
        fault = fmt::format("{} \"{}\" {}", what, s.substr(0, 40), format);
        return false;
    }
    return true;
}
template bool exact_value<float>(const Json&, float&, std::string&, std::string_view);
template bool exact_value<double>(const Json&, double&, std::string&, std::string_view);

namespace {

// ---- the first pass ----

// One open object or array.
struct Frame {
    bool object = false;
    std::vector<std::string> keys;  // an object's keys so far
    std::string key;                // the key whose value is being read
    std::size_t elements = 0;       // an array's elements so far
};

// The node being read, as far as the first pass follows it: its kind (for messages), its shape
// once the array has ended, and its values' count.
struct NodeOutline {
    std::size_t index = 0;
    std::string kind, op;
    std::array<std::size_t, max_rank> dims{};
    std::size_t rank = 0;
    bool shape_valid = true;
    std::optional<Shape> shape;  // once "shape" has ended and holds a valid shape
    std::optional<std::size_t> values;

    std::string what() const { return kind == "op" ? "op " + op : kind.empty() ? "?" : kind; }
};

class OutlineReader final : public nlohmann::json_sax<Json> {
public:
    explicit OutlineReader(const Where& where) : where_(where) {}
    Outline outline;

    bool null() override { return element(); }
    bool boolean(bool) override { return element(); }
    bool number_integer(number_integer_t) override { return element(); }
    bool number_unsigned(number_unsigned_t n) override { return element(std::size_t(n)); }
    bool number_float(number_float_t, const string_t&) override { return element(); }
    bool binary(binary_t&) override { return element(); }
    bool string(string_t& s) override {
        if (frames_.size() == 1 && frames_[0].key == "scalar") outline.scalar = s;
        if (in_node() && frames_[2].key == "node") node_.kind = s;
        if (in_node() && frames_[2].key == "op") node_.op = s;
        return element();
    }
    bool start_object(std::size_t) override { return open(true); }
    bool start_array(std::size_t) override { return open(false); }
    bool key(string_t& k) override;
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        where_.fail(fmt::format("not a JSON document ({})", e.what()));
    }

private:
    bool in_nodes() const { return frames_.size() >= 2 && frames_[0].object && frames_[0].key == "nodes" && !frames_[1].object; }
    bool in_node() const { return frames_.size() >= 3 && in_nodes() && frames_[2].object; }
    bool in_node_array(std::string_view key) const {
        return frames_.size() == 4 && in_node() && !frames_[3].object && frames_[2].key == key;
    }
    [[noreturn]] void fail(std::string_view fault) const {
        if (in_node()) where_.at(node_.index, node_.what()).fail(fault);
        where_.fail(fault);
    }
    bool element(std::optional<std::size_t> dimension = std::nullopt);
    bool open(bool object);
    bool close();
    void end_node();

    const Where& where_;
    std::vector<Frame> frames_;
    NodeOutline node_;
};

// A value (or a container starting) in the innermost frame: counted in an array, checked against
// the format's limits where it is a node's shape, inputs or values.
bool OutlineReader::element(std::optional<std::size_t> dimension) {
    if (frames_.empty() || frames_.back().object) return true;
    const std::size_t k = ++frames_.back().elements;
    if (in_node_array("shape")) {
        if (dimension && k <= max_rank) node_.dims[k - 1] = *dimension;
        else node_.shape_valid = false;
    }
    if ((in_node_array("shape") || in_node_array("inputs")) && k > max_short_array) {
        fail(fmt::format("\"{}\" has more than {} elements", frames_[2].key, max_short_array));
    }
    if (in_node_array("values") && node_.shape && k > node_.shape->size()) {
        fail(fmt::format("shape {} holds {} values, \"values\" has more", node_.shape->to_string(), node_.shape->size()));
    }
    return true;
}

bool OutlineReader::open(bool object) {
    element();
    if (frames_.size() == max_nesting) fail(fmt::format("nested deeper than the format's {} levels", max_nesting));
    Frame frame;
    frame.object = object;
    frames_.push_back(std::move(frame));
    if (object && frames_.size() == 3 && in_node()) {
        node_ = NodeOutline();
        node_.index = frames_[1].elements - 1;
    }
    return true;
}

bool OutlineReader::key(string_t& k) {
    Frame& frame = frames_.back();
    const std::string_view in = frames_.size() > 3 ? frames_[frames_.size() - 2].key : std::string_view();
    if (std::find(frame.keys.begin(), frame.keys.end(), k) != frame.keys.end()) {
        fail(in.empty() ? fmt::format("duplicate key \"{}\"", k) : fmt::format("duplicate key \"{}\" in \"{}\"", k, in));
    }
    if (frame.keys.size() == max_keys_per_object) {
        fail(fmt::format("an object with more than {} keys (no object of the format has as many)", max_keys_per_object));
    }
    frame.keys.push_back(k);
    frame.key = k;
    return true;
}

bool OutlineReader::close() {
    if (in_node_array("shape") && node_.shape_valid) {
        try {
            node_.shape = Shape(std::span<const std::size_t>(node_.dims.data(), frames_.back().elements));
        } catch (const shape_error&) {  // left to the second pass, which names the fault
        }
    }
    if (in_node_array("values")) node_.values = frames_.back().elements;
    if (frames_.size() == 3 && in_node()) end_node();
    frames_.pop_back();
    return true;
}

void OutlineReader::end_node() {
    if (node_.shape && node_.values && *node_.values != node_.shape->size()) {
        fail(fmt::format("shape {} holds {} values, \"values\" has {}", node_.shape->to_string(), node_.shape->size(),
                         *node_.values));
    }
    outline.value_counts.push_back(node_.values.value_or(0));
}

}  // namespace

Outline read_outline(std::string_view text, const Where& where) {
    OutlineReader reader(where);
    Json::sax_parse(text.begin(), text.end(), &reader);
    return std::move(reader.outline);
}

// ---- the second pass ----

template <class T>
Tree<T> read_tree(std::string_view text, const Outline& outline, const Where& where) {
    Tree<T> tree;
    tree.values.resize(outline.value_counts.size());
    std::string root_key, node_key;
    std::size_t nodes = 0;
    LeafValues<T>* reading = nullptr;  // the node whose "values" are being read
    using Event = Json::parse_event_t;
    const auto divert = [&](int depth, Event event, Json& parsed) -> bool {
        if (event == Event::key && depth == 1) root_key = parsed.get<std::string>();
        if (event == Event::key && depth == 3) node_key = parsed.get<std::string>();
        if (event == Event::object_start && depth == 2 && root_key == "nodes") ++nodes;
        if (event == Event::array_start && depth == 3 && root_key == "nodes" && node_key == "values") {
            reading = &tree.values.at(nodes - 1);  // the outline counted the same nodes
            reading->values.reserve(outline.value_counts.at(nodes - 1));
        }
        if (event == Event::array_end && depth == 3) reading = nullptr;
        if (reading == nullptr || depth != 4) return true;
        // An element of "values": kept as T, never as a tree node.
        if (reading->fault.empty()) {
            T x{};
            const std::string what = fmt::format("value {}", reading->values.size());
            if (exact_value(parsed, x, reading->fault, what)) reading->values.push_back(x);
        }
        return false;
    };
    try {
        tree.root = Json::parse(text.begin(), text.end(), divert);
    } catch (const Json::exception& e) {  // the outline has parsed the same text: not expected
        where.fail(fmt::format("not a JSON document ({})", e.what()));
    }
    return tree;
}
template Tree<float> read_tree<float>(std::string_view, const Outline&, const Where&);
template Tree<double> read_tree<double>(std::string_view, const Outline&, const Where&);

}  // namespace tapegrad::tape_document
