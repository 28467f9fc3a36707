// The safetensors reader and writer (io/safetensors.hpp). The header is JSON, read in two passes
// as saved tapes are (src/io/tape_document.cpp): an outline, a SAX pass that builds nothing and
// refuses what a tree would hide (a key given twice in any object: the tree keeps the last) and
// keeps what it would lose (the text of a number written with a fraction or an exponent, which a
// message quotes as the file has it); then the tree, with nlohmann. Around them, the format's own
// rules that JSON does not hold: the header begins with '{', holds no NUL, and after its object
// only spaces. Every field is checked against the bytes present before anything is allocated, and
// each fault is named with the file and the tensor; every message is printable UTF-8, whatever
// bytes of the file it quotes (those that are not UTF-8, and control characters, as \xNN).
#include "io/safetensors.hpp"
#include "io/read_file.hpp"
#include "autodiff/low_precision.hpp"
#include "io/tape_file.hpp"  // write_file_atomically

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace tapegrad {

namespace {

using Json = nlohmann::json;

constexpr std::array<std::string_view, 4> dtype_names{"F64", "F32", "BF16", "F16"};
constexpr std::array<std::size_t, 4> item_sizes{8, 4, 2, 2};

std::size_t item_size(SafetensorsDtype dtype) { return item_sizes[std::size_t(dtype)]; }

/// The length of the valid UTF-8 sequence that starts `s` (1 to 4), or 0 when its bytes are not
/// one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
std::size_t utf8_sequence(std::string_view s) {
    const auto byte = [&](std::size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
    const unsigned lead = byte(0);
    const auto continuation = [&](std::size_t k, unsigned low = 0x80, unsigned high = 0xbf) {
        return byte(k) >= low && byte(k) <= high;
    };
    if (lead < 0x80) return 1;
    if (lead >= 0xc2 && lead <= 0xdf) return continuation(1) ? 2 : 0;
    if (lead >= 0xe0 && lead <= 0xef) {
        const unsigned low = lead == 0xe0 ? 0xa0 : 0x80, high = lead == 0xed ? 0x9f : 0xbf;
        return continuation(1, low, high) && continuation(2) ? 3 : 0;
    }
    if (lead >= 0xf0 && lead <= 0xf4) {
        const unsigned low = lead == 0xf0 ? 0x90 : 0x80, high = lead == 0xf4 ? 0x8f : 0xbf;
        return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
    }
    return 0;
}

/// `text` as a message may show it: valid UTF-8 kept as it is, control characters (C0, DEL, C1)
/// and bytes that are no UTF-8 written as \xNN, so a message is always printable UTF-8 whatever
/// bytes the file holds (names, JSON text, nlohmann's "last read" bytes, the path).
std::string printable(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t k = 0; k < text.size();) {
        const std::size_t n = utf8_sequence(text.substr(k));
        const auto lead = static_cast<unsigned char>(text[k]);
        const bool control = (n == 1 && (lead < 0x20 || lead == 0x7f)) ||
                             (n == 2 && lead == 0xc2 && static_cast<unsigned char>(text[k + 1]) < 0xa0);
        if (n == 0 || control) {
            for (std::size_t b = 0; b < std::max<std::size_t>(n, 1); ++b) {
                out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[k + b]));
            }
            k += std::max<std::size_t>(n, 1);
        } else {
            out.append(text.substr(k, n));
            k += n;
        }
    }
    return out;
}

[[noreturn]] void fail(std::string_view source, std::string_view what) {
    throw io_error(printable(fmt::format("load_safetensors: {}: {}", source, what)));
}

/// A JSON text as a message quotes it: at most `most` bytes (a shape of a million entries is
/// named, not printed), cut before a UTF-8 sequence, not inside one.
std::string shown(std::string text, std::size_t most = 100) {
    if (text.size() <= most) return text;
    std::size_t cut = most;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
    return text.substr(0, cut) + "...";
}

/// A byte named in a message: "'[' (0x5b)" when it is printable ASCII, "0x09" when not.
std::string byte_name(char c) {
    const auto b = static_cast<unsigned char>(c);
    return b > 0x20 && b < 0x7f ? fmt::format("'{}' (0x{:02x})", c, b)
           : b == 0x20          ? "a space (0x20)"
                                : fmt::format("0x{:02x}", b);
}

template <class Word>
Word little_endian(const char* p) {
    Word v = 0;
    for (int k = int(sizeof(Word)) - 1; k >= 0; --k) v = Word((v << 8) | static_cast<unsigned char>(p[k]));
    return v;
}

double element(SafetensorsDtype dtype, const char* p) {
    switch (dtype) {
        case SafetensorsDtype::float64: return std::bit_cast<double>(little_endian<std::uint64_t>(p));
        case SafetensorsDtype::float32: return std::bit_cast<float>(little_endian<std::uint32_t>(p));
        case SafetensorsDtype::bfloat16: return bfloat16_value(little_endian<std::uint16_t>(p));
        case SafetensorsDtype::float16: return float16_value(little_endian<std::uint16_t>(p));
    }
    return 0;
}

// ---- the header's text ----

/// The texts of the numbers written with a fraction or an exponent, and of "-0", that are
/// elements of a tensor's "shape" or "data_offsets", by (tensor, field, index): the tree holds
/// them as doubles and 0, which print otherwise ("1e30" as 1e+30, 18446744073709551616 as
/// 1.8446744073709552e+19, "-0" as 0).
using NumberTexts = std::map<std::tuple<std::string, std::string, std::size_t>, std::string>;

/// Nesting a header may reach: it needs 3 (the object, an entry, its shape); anything an unknown
/// key holds gets a little more. The limit keeps printing and freeing a value shallow.
constexpr std::size_t max_nesting = 32;

/// The outline pass: refuses a key given twice in any object (JSON allows it, the format does
/// not: "duplicate keys are disallowed"), naming where; refuses nesting past max_nesting; keeps
/// the number texts of NumberTexts. Builds nothing else.
class Outline final : public nlohmann::json_sax<Json> {
public:
    explicit Outline(std::string_view source) : source_(source) {}
    NumberTexts texts;

    bool null() override { return element(); }
    bool boolean(bool) override { return element(); }
    bool number_integer(number_integer_t n) override {  // signed: only a literal with '-', so 0 is "-0"
        if (n == 0) keep_text("-0");
        return element();
    }
    bool number_unsigned(number_unsigned_t) override { return element(); }
    bool number_float(number_float_t, const string_t& text) override {
        keep_text(text);
        return element();
    }
    bool string(string_t&) override { return element(); }
    bool binary(binary_t&) override { return element(); }
    bool start_object(std::size_t) override { return open(true); }
    bool start_array(std::size_t) override { return open(false); }
    bool key(string_t& k) override;
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
        fail(source_, fmt::format("the header is not JSON ({})", shown(e.what(), 300)));  // "last read" may be long
    }

private:
    struct Frame {
        bool object = false;
        std::set<std::string> keys;  // an object's keys so far (a header may name many tensors)
        std::string key;             // the key whose value is being read
        std::size_t elements = 0;    // an array's elements so far
    };
    void keep_text(const std::string& text) {  // for an element of an entry's list
        if (frames_.size() == 3 && frames_[1].object && !frames_[2].object)
            texts[{frames_[0].key, frames_[1].key, frames_[2].elements}] = text;
    }
    bool element() {
        if (!frames_.empty() && !frames_.back().object) ++frames_.back().elements;
        return true;
    }
    bool open(bool object) {
        if (frames_.size() == max_nesting) {
            fail(source_,
                 fmt::format("the header nests deeper than {} levels (a safetensors header needs 3)", max_nesting));
        }
        frames_.push_back(Frame{object, {}, {}, 0});
        return true;
    }
    bool close() {
        frames_.pop_back();
        return element();
    }

    std::string_view source_;
    std::vector<Frame> frames_;
};

bool Outline::key(string_t& k) {
    Frame& frame = frames_.back();
    if (!frame.keys.insert(k).second) {
        const std::string quoted = shown(Json(k).dump(-1, ' ', false, Json::error_handler_t::replace));
        if (frames_.size() == 1 && k == "__metadata__") fail(source_, "the header holds __metadata__ twice");
        if (frames_.size() == 1) fail(source_, fmt::format("the header names tensor '{}' twice", shown(k)));
        const std::string& parent = frames_[0].key;
        if (frames_.size() == 2 && parent == "__metadata__")
            fail(source_, fmt::format("__metadata__ has key {} twice", quoted));
        if (frames_.size() == 2) fail(source_, fmt::format("tensor '{}' has key {} twice", shown(parent), quoted));
        if (parent == "__metadata__")
            fail(source_, fmt::format("__metadata__ holds an object with key {} twice", quoted));
        fail(source_, fmt::format("tensor '{}' holds an object with key {} twice", shown(parent), quoted));
    }
    frame.key = k;
    return true;
}

/// One past the '}' that closes the object the header begins with, found by counting brackets
/// outside strings; npos when it never closes (the parser then names the fault).
std::size_t object_end(std::string_view text) {
    std::size_t depth = 0;
    bool in_string = false, escaped = false;
    for (std::size_t k = 0; k < text.size(); ++k) {
        const char c = text[k];
        if (in_string) {  // a string ends at a quote that no backslash escapes
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            ++depth;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return k + 1;
        }
    }
    return std::string_view::npos;
}

struct Header {
    Json tree;
    NumberTexts texts;
};

/// The header held to the format: UTF-8 JSON that begins with '{' and may be padded after its
/// object with spaces (0x20) alone; no NUL anywhere (JSON text holds none outside a string, where
/// it must be escaped; a NUL as padding, as some writers pad, is not the format's); no key twice
/// in an object.
Header parse_header(std::string_view text, std::string_view source) {
    if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
        fail(source, fmt::format("the header holds a NUL byte at byte {} (file offset {}); a header is UTF-8 JSON, "
                                 "padded with spaces only",
                                 nul, nul + 8));
    }
    if (text.empty()) fail(source, "the header is not JSON: it is empty (a header is a JSON object)");
    if (text[0] != '{') {
        fail(source,
             fmt::format("the header is not a JSON object: its first byte is {}, not '{{'", byte_name(text[0])));
    }
    const std::size_t end = object_end(text);
    const std::string_view object = text.substr(0, end);
    Header header;
    Outline outline(source);
    Json::sax_parse(object.begin(), object.end(), &outline);
    header.texts = std::move(outline.texts);
    try {
        header.tree = Json::parse(object.begin(), object.end());
    } catch (const Json::exception& e) {  // the outline has parsed the same text: not expected
        fail(source, fmt::format("the header is not JSON ({})", shown(e.what(), 300)));
    }
    for (std::size_t k = end; k < text.size(); ++k) {
        if (text[k] != ' ') {
            fail(source, fmt::format("the header's JSON object ends at byte {}, and byte {} after it is {}; only "
                                     "spaces (0x20) may pad a header",
                                     end - 1, k, byte_name(text[k])));
        }
    }
    if (!header.tree.is_object()) fail(source, "the header is not a JSON object");
    return header;
}

// ---- the entries ----

/// One tensor's entry of the header, checked: its dtype, shape and byte range in the data.
struct Entry {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<std::size_t> dims;
    std::size_t begin, end;
};

/// Where a tensor's entry is read: the file, the tensor, the number texts.
struct EntryReader {
    std::string_view source;
    const std::string& name;
    const NumberTexts& texts;

    [[noreturn]] void fail(std::string_view what) const {
        tapegrad::fail(source, fmt::format("tensor '{}' {}", shown(name), what));
    }
    std::string text(const Json& value) const {
        return shown(value.dump(-1, ' ', false, Json::error_handler_t::replace));
    }
    /// Element `index` of `field` as the file writes it.
    std::string element_text(std::string_view field, std::size_t index, const Json& value) const {
        const auto found = texts.find({name, std::string(field), index});
        return found != texts.end() ? found->second : text(value);
    }
    /// The field's JSON as the file writes it (its elements' texts, not the tree's doubles).
    std::string field_text(std::string_view field, const Json& value) const {
        if (!value.is_array()) return text(value);
        std::string out = "[";
        for (std::size_t k = 0; k < value.size() && out.size() <= 100; ++k) {
            out += (k ? "," : "") + element_text(field, k, value[k]);
        }
        return shown(out + "]");
    }

    SafetensorsDtype dtype(const Json& value) const {
        if (value.is_string()) {
            const auto found = std::find(dtype_names.begin(), dtype_names.end(), value.get_ref<const std::string&>());
            if (found != dtype_names.end()) return SafetensorsDtype(found - dtype_names.begin());
        }
        fail(fmt::format("has dtype {}; this reader takes F64, F32, BF16 and F16", text(value)));
    }

    /// Element `index` of `field` ("shape" or "data_offsets") as a count: an integer from 0 to
    /// 2^64 - 1, written as one. serde_json, the reference reader's parser, takes neither "2.0" nor
    /// "-0" for one (both are floats to it); nlohmann reads "-0" as a signed integer, which is how
    /// it is told apart here. Each other kind of value has its own words.
    std::size_t count(std::string_view field, const Json& list, std::size_t index) const {
        const Json& value = list[index];
        if (value.is_number_unsigned()) return value.get<std::size_t>();
        const char* fault = "which is not a number";
        if (value.is_number_integer() || (value.is_number_float() && std::signbit(value.get<double>()))) {
            fault = "which is negative";  // a signed integer is one below 0, or "-0"
        } else if (value.is_number_float()) {
            fault = value.get<double>() >= 0x1p64 ? "which is larger than 2^64 - 1"
                                                  : "which is not an integer (a count is written without a fraction "
                                                    "or an exponent)";
        }
        fail(fmt::format("has {} {}: {} {} is {}, {}", field, field_text(field, list),
                         field == "shape" ? "dimension" : "offset", index, element_text(field, index, value), fault));
    }

    Entry entry(const Json& fields, std::size_t data_size) const {
        if (!fields.is_object()) {
            fail(fmt::format("needs an object with dtype, shape and data_offsets, not {}", text(fields)));
        }
        for (const char* key : {"dtype", "shape", "data_offsets"}) {
            if (!fields.contains(key))
                fail(fmt::format("lacks \"{}\" (an entry holds dtype, shape and data_offsets)", key));
        }
        // Other keys are let be: the reference reader (the safetensors crate's TensorInfo, derived
        // with serde and without deny_unknown_fields) ignores them, so a file it reads, this reads.
        // They are still JSON held to the format: no key twice (the outline), no NUL, nesting bounded.
        Entry e{name, dtype(fields["dtype"]), {}, 0, 0};
        const Json& shape = fields["shape"];
        if (!shape.is_array() || shape.size() > max_rank) {
            fail(fmt::format("has shape {}: a list of at most {} counts", field_text("shape", shape), max_rank));
        }
        for (std::size_t k = 0; k < shape.size(); ++k) e.dims.push_back(count("shape", shape, k));
        // The element count, checked against the data before it is formed: a dimension 0 makes a
        // tensor of no elements whatever the others are.
        std::size_t elements = 1;
        if (std::find(e.dims.begin(), e.dims.end(), 0) != e.dims.end()) elements = 0;
        for (const std::size_t n : e.dims) {
            if (elements == 0) break;
            if (elements > data_size / n) {
                fail(fmt::format("has shape {}, more elements than the file's {} data bytes hold",
                                 field_text("shape", shape), data_size));
            }
            elements *= n;
        }
        const Json& offsets = fields["data_offsets"];
        if (!offsets.is_array() || offsets.size() != 2) {
            fail(fmt::format("has data_offsets {}: need [begin, end] with begin <= end <= {} (the data's size)",
                             field_text("data_offsets", offsets), data_size));
        }
        e.begin = count("data_offsets", offsets, 0), e.end = count("data_offsets", offsets, 1);
        if (e.begin > e.end || e.end > data_size) {
            fail(fmt::format("has data_offsets {}: need [begin, end] with begin <= end <= {} (the data's size)",
                             field_text("data_offsets", offsets), data_size));
        }
        if (e.end - e.begin != elements * item_size(e.dtype)) {
            fail(fmt::format("is {} of shape {}: {} bytes, but data_offsets {} give {}",
                             dtype_names[std::size_t(e.dtype)], field_text("shape", shape),
                             elements * item_size(e.dtype), field_text("data_offsets", offsets), e.end - e.begin));
        }
        return e;
    }
};

/// The entries, in the order of their data, covering the data exactly: no overlap, no hole.
std::vector<Entry> entries_of(const Header& header, std::size_t data_size, std::string_view source) {
    std::vector<Entry> entries;
    for (const auto& [name, fields] : header.tree.items()) {
        if (name == "__metadata__") {
            if (!fields.is_object()) {
                fail(source, fmt::format("__metadata__ must be an object of strings, not {}",
                                         shown(fields.dump(-1, ' ', false, Json::error_handler_t::replace))));
            }
            for (const auto& [key, value] : fields.items()) {
                if (!value.is_string()) {
                    fail(source, fmt::format("__metadata__ must be an object of strings; its \"{}\" is {}", shown(key),
                                             shown(value.dump(-1, ' ', false, Json::error_handler_t::replace))));
                }
            }
            continue;
        }
        entries.push_back(EntryReader{source, name, header.texts}.entry(fields, data_size));
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::size_t covered = 0;
    for (const Entry& e : entries) {
        if (e.begin < covered) {
            fail(source, fmt::format("tensor '{}' (bytes {}..{}) overlaps the tensor before it (up to {})",
                                     shown(e.name), e.begin, e.end, covered));
        }
        if (e.begin > covered) fail(source, fmt::format("data bytes {}..{} belong to no tensor", covered, e.begin));
        covered = e.end;
    }
    if (covered != data_size) fail(source, fmt::format("data bytes {}..{} belong to no tensor", covered, data_size));
    return entries;
}

void put_u64(std::string& out, std::uint64_t v) {
    for (int k = 0; k < 8; ++k) out.push_back(char((v >> (8 * k)) & 0xff));
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDtype dtype) { return dtype_names[std::size_t(dtype)]; }

std::vector<SafetensorsTensor> parse_safetensors(std::string_view bytes, std::string_view source) {
    if (bytes.size() < 8) fail(source, fmt::format("{} bytes; a safetensors file starts with 8", bytes.size()));
    const std::uint64_t header_size = little_endian<std::uint64_t>(bytes.data());
    if (header_size > bytes.size() - 8) {
        fail(source, fmt::format("the header is {} bytes long but the file holds {} after its length", header_size,
                                 bytes.size() - 8));
    }
    const Header header = parse_header(bytes.substr(8, header_size), source);
    const std::string_view data = bytes.substr(8 + header_size);
    std::vector<SafetensorsTensor> tensors;
    for (const Entry& e : entries_of(header, data.size(), source)) {
        std::optional<Shape> shape;
        try {
            shape.emplace(std::span<const std::size_t>(e.dims));
        } catch (const shape_error& fault) {  // past the library's 2^40 elements: a file of terabytes
            fail(source, fmt::format("tensor '{}': {}", shown(e.name), fault.what()));
        }
        Tensor<double> value{*shape};
        const std::size_t size = item_size(e.dtype);
        for (std::size_t k = 0; k < value.size(); ++k) value[k] = element(e.dtype, data.data() + e.begin + k * size);
        tensors.push_back({e.name, e.dtype, std::move(value)});
    }
    return tensors;
}

std::vector<SafetensorsTensor> load_safetensors(const std::filesystem::path& path) {
    return parse_safetensors(read_file_bytes(path, "load_safetensors"), path.string());
}

namespace {

/// x as `dtype` stores it (little-endian order is the caller's): exact in F64; rounded to nearest,
/// ties to even, in the others (float's own conversion for F32; autodiff/low_precision.hpp's,
/// once from double, for BF16 and F16: never through float, which would round twice). NaN: F64
/// keeps its bits, payload and all; the others store their format's quiet NaN with the NaN's sign
/// (a payload has no place in 7 or 10 bits, and F32 follows suit so no CPU's conversion decides).
std::uint64_t stored_bits(SafetensorsDtype dtype, double x) {
    switch (dtype) {
        case SafetensorsDtype::float64: return std::bit_cast<std::uint64_t>(x);
        case SafetensorsDtype::float32:
            return std::isnan(x) ? (std::signbit(x) ? 0xffc00000u : 0x7fc00000u)
                                 : std::bit_cast<std::uint32_t>(float(x));
        case SafetensorsDtype::bfloat16: return bfloat16_bits(x);
        case SafetensorsDtype::float16: return float16_bits(x);
    }
    return 0;
}

}  // namespace

std::string safetensors_bytes(std::span<const SafetensorsTensor> tensors) {
    Json header = Json::object();
    std::string data;
    for (const SafetensorsTensor& t : tensors) {
        if (t.name.empty() || t.name == "__metadata__" || header.contains(t.name)) {
            throw usage_error(fmt::format("save_safetensors: tensor name '{}' is empty, reserved or given twice", t.name));
        }
        const std::size_t begin = data.size();
        for (const double x : t.value.data()) {
            const std::uint64_t bits = stored_bits(t.dtype, x);
            for (std::size_t k = 0; k < item_size(t.dtype); ++k) data.push_back(char((bits >> (8 * k)) & 0xff));
        }
        const std::span<const std::size_t> dims = t.value.shape().dims();
        header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                          {"shape", std::vector<std::size_t>(dims.begin(), dims.end())},
                          {"data_offsets", {begin, data.size()}}};
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data 8-byte aligned, as the reference writer pads
    std::string out;
    put_u64(out, text.size());
    return out + text + data;
}

void save_safetensors(const std::filesystem::path& path, std::span<const SafetensorsTensor> tensors) {
    write_file_atomically(path.string(), safetensors_bytes(tensors), "save_safetensors");
}

}  // namespace tapegrad
