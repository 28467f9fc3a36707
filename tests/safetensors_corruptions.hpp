// The corruptions of tests/test_safetensors.cpp, by structure: a few valid files, held as their
// parts (the header's items and each entry's fields in order, as JSON text; the padding; the
// data), and every corruption of the format applied at every place it can go. Each case says
// what the reader must do: refuse the file with io_error whose message holds `words`, or, where
// the corruption leaves a file equivalent to the original (spaces as padding, whitespace between
// tokens, an unknown key in an entry, a string key in __metadata__), load it equal to the
// original. The expected words are computed here from the model, never from the reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace safetensors_corruptions {

// One key of a JSON object and its value's JSON text.
struct Field {
    std::string key, value;
};
using Object = std::vector<Field>;

// An item of the header's top object: a tensor's entry (its fields, and what they mean, which
// the expected words need), or __metadata__; or, corrupted, any JSON text in place of the object.
struct Item {
    std::string key;
    Object fields;
    std::optional<std::string> raw;  // the value's text when it is not `fields` as an object
    // An entry's meaning, as the model wrote it:
    std::string dtype;
    std::vector<std::size_t> dims;
    std::size_t begin = 0, end = 0;

    bool metadata() const { return key == "__metadata__"; }
};

// A valid file as its parts; `lead` before the object is a corruption (a valid file has none).
struct Model {
    std::string what;
    std::vector<Item> items;
    std::string padding, data, lead;
    bool pretty = false;  // whitespace between every two tokens (valid JSON; equivalent)
};

// What the reader must do with one corrupted file.
struct Case {
    std::string what;
    std::string bytes;
    std::string words;  // the refusal's distinctive words; empty: loads, equal to the original
};

inline std::size_t item_size(const std::string& dtype) { return dtype == "F64" ? 8 : dtype == "F32" ? 4 : 2; }

inline std::string join(const std::vector<std::string>& parts, const std::string& separator) {
    std::string out;
    for (std::size_t k = 0; k < parts.size(); ++k) out += (k ? separator : "") + parts[k];
    return out;
}

// (Appended, not "[" + ... + "]": GCC 12 draws a false -Warray-bounds from that inlined operator+.)
inline std::string list_text(const std::vector<std::string>& elements) {
    std::string out = "[";
    out += join(elements, ",");
    return out += ']';
}

inline std::vector<std::string> texts_of(const std::vector<std::size_t>& counts) {
    std::vector<std::string> out;
    for (const std::size_t n : counts) out.push_back(std::to_string(n));
    return out;
}

// A tensor's entry with its fields in `order` (a permutation of "dso": dtype, shape, offsets).
inline Item entry(const std::string& name, const std::string& dtype, std::vector<std::size_t> dims, std::size_t begin,
                  const std::string& order = "dso") {
    std::size_t elements = 1;
    for (const std::size_t d : dims) elements *= d;
    Item item{name, {}, std::nullopt, dtype, std::move(dims), begin, begin + elements * item_size(dtype)};
    for (const char c : order) {
        if (c == 'd') item.fields.push_back({"dtype", "\"" + dtype + "\""});
        if (c == 's') item.fields.push_back({"shape", list_text(texts_of(item.dims))});
        if (c == 'o') item.fields.push_back({"data_offsets", list_text(texts_of({item.begin, item.end}))});
    }
    return item;
}

inline std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// Bytes as a case's name shows them: printable ASCII as it is, others as \xNN.
inline std::string visible(const std::string& bytes) {
    std::string out;
    for (const char c : bytes) {
        const auto b = static_cast<unsigned char>(c);
        out += b >= 0x20 && b < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", b);
    }
    return out;
}

inline std::string object_text(const Object& fields, bool pretty, int depth) {
    if (fields.empty()) return "{}";
    const std::string indent = pretty ? "\n" + std::string(std::size_t(depth + 1), '\t') : "";
    std::vector<std::string> parts;
    for (const Field& f : fields) parts.push_back(indent + quoted(f.key) + (pretty ? " : " : ":") + f.value);
    return "{" + join(parts, pretty ? " ," : ",") + (pretty ? "\n" + std::string(std::size_t(depth), '\t') : "") + "}";
}

inline std::string header_text(const Model& m) {
    Object top;
    for (const Item& item : m.items)
        top.push_back({item.key, item.raw ? *item.raw : object_text(item.fields, m.pretty, 1)});
    return m.lead + object_text(top, m.pretty, 0) + m.padding;
}

// The bytes of a file: the header's length (`length` if given, else the header's), header, data.
inline std::string file_bytes(const std::string& header, const std::string& data,
                              std::optional<std::uint64_t> length = {}) {
    const std::uint64_t n = length.value_or(header.size());
    std::string out;
    for (int k = 0; k < 8; ++k) out.push_back(char((n >> (8 * k)) & 0xff));
    return out + header + data;
}

inline std::string file_bytes(const Model& m) { return file_bytes(header_text(m), m.data); }

// The reader's name for a byte after the header's object or at its start.
inline std::string byte_words(unsigned char b) {
    if (b == 0x20) return "a space (0x20)";
    if (b > 0x20 && b < 0x7f) return fmt::format("'{}' (0x{:02x})", char(b), b);
    return fmt::format("0x{:02x}", b);
}

// `object_end`: one past the object's closing brace, which the reader names.
inline std::string trailing_words(std::size_t object_end, std::size_t at, unsigned char b) {
    return fmt::format(
        "the header's JSON object ends at byte {}, and byte {} after it is {}; only spaces (0x20) may "
        "pad a header",
        object_end - 1, at, byte_words(b));
}

inline std::string nul_words(std::size_t at) {
    return fmt::format("the header holds a NUL byte at byte {} (file offset {})", at, at + 8);
}

inline std::string offsets_words(std::size_t data_size) {
    return fmt::format("need [begin, end] with begin <= end <= {} (the data's size)", data_size);
}

// The values a dimension or an offset is replaced by, each with the reader's words for it
// (empty: a valid count, whose words depend on the file).
struct Replacement {
    std::string text, fault;
};
inline const std::vector<Replacement>& replacements() {
    static const std::vector<Replacement> all = {
        {"-3", "which is negative"},
        {"-1", "which is negative"},
        {"-2.5", "which is negative"},
        {"-0", "which is negative"},
        {"-0.0", "which is negative"},
        {"-18446744073709551617", "which is negative"},
        {"2.5", "which is not an integer (a count is written without a fraction or an exponent)"},
        {"2.0", "which is not an integer (a count is written without a fraction or an exponent)"},
        {"0.0", "which is not an integer (a count is written without a fraction or an exponent)"},
        {"1e2", "which is not an integer (a count is written without a fraction or an exponent)"},
        {"1e30", "which is larger than 2^64 - 1"},
        {"18446744073709551616", "which is larger than 2^64 - 1"},
        {"18446744073709551617", "which is larger than 2^64 - 1"},
        {"\"2\"", "which is not a number"},
        {"null", "which is not a number"},
        {"true", "which is not a number"},
        {"false", "which is not a number"},
        {"[2]", "which is not a number"},
        {"{}", "which is not a number"},
        {"4294967296", ""},
        {"18446744073709551615", ""},
    };
    return all;
}

// Every corruption of `m` at every place, with what the reader must do.
inline std::vector<Case> corruptions(const Model& m) {
    std::vector<Case> cases;
    const std::string header = header_text(m);
    const std::size_t data_size = m.data.size();
    const auto add = [&](std::string what, const Model& changed, std::string words) {
        cases.push_back({m.what + ": " + what, file_bytes(changed), std::move(words)});
    };
    std::optional<std::size_t> metadata_at;
    for (std::size_t i = 0; i < m.items.size(); ++i)
        if (m.items[i].metadata()) metadata_at = i;

    for (std::size_t i = 0; i < m.items.size(); ++i) {
        const Item& item = m.items[i];
        const std::string name = item.key;
        // Each key of an entry (or of __metadata__) repeated at each place in its object: beside
        // its twin (before and after) and with other keys between.
        for (std::size_t f = 0; f < item.fields.size(); ++f) {
            for (std::size_t at = 0; at <= item.fields.size(); ++at) {
                Model changed = m;
                Object& fields = changed.items[i].fields;
                fields.insert(fields.begin() + std::ptrdiff_t(at), item.fields[f]);
                const std::string key = item.fields[f].key;
                add(fmt::format("'{}' key \"{}\" repeated at {}", name, key, at), changed,
                    item.metadata() ? fmt::format("__metadata__ has key \"{}\" twice", key)
                                    : fmt::format("tensor '{}' has key \"{}\" twice", name, key));
            }
        }
        // The item itself repeated at each place of the top object.
        for (std::size_t at = 0; at <= m.items.size(); ++at) {
            Model changed = m;
            changed.items.insert(changed.items.begin() + std::ptrdiff_t(at), item);
            add(fmt::format("'{}' repeated at {}", name, at), changed,
                item.metadata() ? "the header holds __metadata__ twice"
                                : fmt::format("the header names tensor '{}' twice", name));
        }
        if (item.metadata()) {
            // An entry where __metadata__ is expected: not strings.
            Model changed = m;
            changed.items[i] = entry("__metadata__", "F32", {1}, 0);
            add("an entry as __metadata__", changed,
                "__metadata__ must be an object of strings; its \"data_offsets\" is [0,4]");
            changed.items[i].raw = "\"pt\"";
            add("a string as __metadata__", changed, "__metadata__ must be an object of strings, not \"pt\"");
            changed.items[i].raw = "[\"pt\",{\"a\":\"b\"}]";
            add("a list as __metadata__", changed,
                "__metadata__ must be an object of strings, not [\"pt\",{\"a\":\"b\"}]");
            continue;
        }
        // Each required key removed; an unknown key removed (equivalent).
        for (std::size_t f = 0; f < item.fields.size(); ++f) {
            Model changed = m;
            changed.items[i].fields.erase(changed.items[i].fields.begin() + std::ptrdiff_t(f));
            const std::string key = item.fields[f].key;
            const bool required = key == "dtype" || key == "shape" || key == "data_offsets";
            add(fmt::format("'{}' without \"{}\"", name, key), changed,
                required
                    ? fmt::format("tensor '{}' lacks \"{}\" (an entry holds dtype, shape and data_offsets)", name, key)
                    : "");
        }
        // An unknown key (holding what any JSON may) added at each place: ignored, as by the
        // reference reader.
        for (std::size_t at = 0; at <= item.fields.size(); ++at) {
            Model changed = m;
            Object& fields = changed.items[i].fields;
            fields.insert(fields.begin() + std::ptrdiff_t(at), {"extra", R"({"a":[1,2.5,null,"x"],"b":{}})"});
            add(fmt::format("'{}' with an unknown key at {}", name, at), changed, "");
        }
        // A metadata-style string where the entry is expected.
        {
            Model changed = m;
            changed.items[i].raw = "\"pt\"";
            add(fmt::format("'{}' as a string", name), changed,
                fmt::format("tensor '{}' needs an object with dtype, shape and data_offsets, not \"pt\"", name));
        }
        // Each of the entry's keys placed in __metadata__ (the file's, or one made for it), at each
        // place in it: a string (the dtype) is a valid metadata value, the lists are not.
        for (const Field& field : item.fields) {
            const std::size_t places = metadata_at ? m.items[*metadata_at].fields.size() + 1 : 1;
            for (std::size_t at = 0; at < places; ++at) {
                Model changed = m;
                if (!metadata_at)
                    changed.items.insert(changed.items.begin(), Item{"__metadata__", {}, {}, {}, {}, 0, 0});
                Object& fields = changed.items[metadata_at.value_or(0)].fields;
                fields.insert(fields.begin() + std::ptrdiff_t(at), field);
                add(fmt::format("\"{}\" of '{}' in __metadata__ at {}", field.key, name, at), changed,
                    field.value.front() == '"'
                        ? ""
                        : fmt::format("__metadata__ must be an object of strings; its \"{}\" is {}", field.key,
                                      field.value));
            }
        }
        // Each number (each dimension, each offset) replaced.
        for (std::size_t f = 0; f < item.fields.size(); ++f) {
            const std::string key = item.fields[f].key;
            if (key != "shape" && key != "data_offsets") continue;
            const bool shape = key == "shape";
            const std::vector<std::size_t> counts = shape ? item.dims : std::vector<std::size_t>{item.begin, item.end};
            for (std::size_t index = 0; index < counts.size(); ++index) {
                for (const Replacement& r : replacements()) {
                    std::vector<std::string> texts = texts_of(counts);
                    texts[index] = r.text;
                    Model changed = m;
                    changed.items[i].fields[f].value = list_text(texts);
                    std::string words;
                    if (!r.fault.empty()) {
                        words = fmt::format("tensor '{}' has {} {}: {} {} is {}, {}", name, key, list_text(texts),
                                            shape ? "dimension" : "offset", index, r.text, r.fault);
                    } else if (!shape) {
                        words = fmt::format("tensor '{}' has data_offsets {}: {}", name, list_text(texts),
                                            offsets_words(data_size));
                    } else {
                        // A valid count too large: the data's size names it, unless another
                        // dimension is 0 (a tensor of no elements, another file: not generated).
                        std::size_t others = 1;
                        for (std::size_t d = 0; d < counts.size(); ++d)
                            if (d != index) others *= counts[d];
                        if (others == 0) continue;
                        words =
                            fmt::format("tensor '{}' has shape {}, more elements than the file's {} data bytes hold",
                                        name, list_text(texts), data_size);
                    }
                    add(fmt::format("'{}' {}[{}] = {}", name, key, index, r.text), changed, words);
                }
                // A dimension made 0, or doubled, where that changes the byte count.
                if (!shape) continue;
                std::size_t elements = 1;
                for (const std::size_t d : counts) elements *= d;
                if (elements == 0) continue;
                for (const std::size_t factor : {0, 2}) {
                    std::vector<std::size_t> dims = counts;
                    dims[index] *= factor;
                    const std::size_t changed_elements = elements * factor;
                    Model changed = m;
                    changed.items[i].fields[f].value = list_text(texts_of(dims));
                    const std::string words =
                        changed_elements > data_size
                            ? fmt::format("tensor '{}' has shape {}, more elements than the file's {} data bytes hold",
                                          name, list_text(texts_of(dims)), data_size)
                            : fmt::format("tensor '{}' is {} of shape {}: {} bytes, but data_offsets {} give {}", name,
                                          item.dtype, list_text(texts_of(dims)),
                                          changed_elements * item_size(item.dtype),
                                          list_text(texts_of({item.begin, item.end})), item.end - item.begin);
                    add(fmt::format("'{}' shape[{}] times {}", name, index, factor), changed, words);
                }
            }
        }
    }
    // A key of __metadata__'s kind at the top: read as a tensor's name, whose entry is a string.
    for (std::size_t at = 0; at <= m.items.size(); ++at) {
        Model changed = m;
        changed.items.insert(changed.items.begin() + std::ptrdiff_t(at), Item{"format", {}, "\"pt\"", {}, {}, 0, 0});
        add(fmt::format("\"format\": \"pt\" at the top, at {}", at), changed,
            "tensor 'format' needs an object with dtype, shape and data_offsets, not \"pt\"");
    }
    // The padding varied: spaces are the format's, anything else after the object is not.
    const std::size_t object_end = header.size() - m.padding.size();
    for (const std::string padding : {"", " ", "  ", "       ", "        ", "         ", "                "}) {
        Model changed = m;
        changed.padding = padding;
        add(fmt::format("padded with {} spaces", padding.size()), changed, "");
    }
    for (const std::string padding :
         {"\t", "\n", "\r", "\r\n", "\x0b", "\x0c", " \t", "   \n", "x", "}", " }", "\xc2\xa0", "\x7f", "\xff"}) {
        Model changed = m;
        changed.padding = padding;
        const std::size_t first = padding.find_first_not_of(' ');
        add("padded with " + visible(padding), changed,
            trailing_words(object_end, object_end + first, static_cast<unsigned char>(padding[first])));
    }
    for (const std::string& padding : {std::string(1, '\0'), std::string(" \0", 2), std::string("   \0   ", 7)}) {
        Model changed = m;
        changed.padding = padding;
        add(fmt::format("padded with a NUL at {}", padding.find('\0')), changed,
            nul_words(object_end + padding.find('\0')));
    }
    // Something before the object.
    for (const std::string lead : {" ", "\n", "\t", "\r\n", "\xef\xbb\xbf", "["}) {
        Model changed = m;
        changed.lead = lead;
        add("led by " + visible(lead), changed,
            fmt::format("the header is not a JSON object: its first byte is {}, not '{{'",
                        byte_words(static_cast<unsigned char>(lead[0]))));
    }
    // Whitespace between every two tokens: JSON's own, equivalent.
    {
        Model changed = m;
        changed.pretty = true;
        add("whitespace between tokens", changed, "");
    }
    // A NUL inserted at every byte of the header (the length counting it), and put in place of
    // every byte.
    for (std::size_t at = 0; at <= header.size(); ++at) {
        std::string changed = header;
        changed.insert(at, 1, '\0');
        cases.push_back(
            {fmt::format("{}: NUL inserted at {}", m.what, at), file_bytes(changed, m.data), nul_words(at)});
        if (at == header.size()) continue;
        changed = header;
        changed[at] = '\0';
        cases.push_back(
            {fmt::format("{}: NUL in place of byte {}", m.what, at), file_bytes(changed, m.data), nul_words(at)});
    }
    // The header's length off by one. Longer: the data's first byte read as the header's last
    // (past the file if there is no data); shorter: the header's last byte read as the data's first.
    {
        std::string words;
        if (m.data.empty()) {
            words = fmt::format("the header is {} bytes long but the file holds {} after its length", header.size() + 1,
                                header.size());
        } else if (m.data[0] == '\0') {
            words = nul_words(header.size());
        } else if (m.data[0] == ' ') {
            words = offsets_words(data_size - 1);
        } else {
            words = trailing_words(object_end, header.size(), static_cast<unsigned char>(m.data[0]));
        }
        cases.push_back({m.what + ": length + 1", file_bytes(header, m.data, header.size() + 1), words});
        words = header.back() == ' ' ? fmt::format("data bytes {}..{} belong to no tensor", data_size, data_size + 1)
                                     : "the header is not JSON (";
        cases.push_back({m.what + ": length - 1", file_bytes(header, m.data, header.size() - 1), words});
    }
    return cases;
}

}  // namespace safetensors_corruptions
