// The safetensors reader and writer (io/safetensors.hpp). The header is JSON, parsed with nlohmann
// (the library's parser for saved tapes); every field is checked against the bytes present before
// anything is allocated, and each fault is named with the file and the tensor.
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
#include <set>

namespace tapegrad {

namespace {

using Json = nlohmann::json;

constexpr std::array<std::string_view, 4> dtype_names{"F64", "F32", "BF16", "F16"};
constexpr std::array<std::size_t, 4> item_sizes{8, 4, 2, 2};

std::size_t item_size(SafetensorsDtype dtype) { return item_sizes[std::size_t(dtype)]; }

[[noreturn]] void fail(std::string_view source, std::string_view what) {
    throw io_error(fmt::format("load_safetensors: {}: {}", source, what));
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

/// One tensor's entry of the header, checked: its dtype, shape and byte range in the data.
struct Entry {
    std::string name;
    SafetensorsDtype dtype;
    std::vector<std::size_t> dims;
    std::size_t begin, end;
};

SafetensorsDtype dtype_of(const Json& value, std::string_view source, const std::string& name) {
    if (value.is_string()) {
        const auto found = std::find(dtype_names.begin(), dtype_names.end(), value.get_ref<const std::string&>());
        if (found != dtype_names.end()) return SafetensorsDtype(found - dtype_names.begin());
    }
    fail(source, fmt::format("tensor '{}' has dtype {}; this reader takes F64, F32, BF16 and F16", name, value.dump()));
}

std::size_t count_of(const Json& value) {
    return value.is_number_unsigned() ? value.get<std::size_t>() : std::numeric_limits<std::size_t>::max();
}

Entry entry_of(const std::string& name, const Json& fields, std::size_t data_size, std::string_view source) {
    if (!fields.is_object() || !fields.contains("dtype") || !fields.contains("shape") ||
        !fields.contains("data_offsets")) {
        fail(source, fmt::format("tensor '{}' needs an object with dtype, shape and data_offsets", name));
    }
    Entry e{name, dtype_of(fields["dtype"], source, name), {}, 0, 0};
    const Json& shape = fields["shape"];
    if (!shape.is_array() || shape.size() > max_rank) {
        fail(source, fmt::format("tensor '{}' has shape {}: a list of at most {} counts", name, shape.dump(), max_rank));
    }
    std::size_t elements = 1;
    for (const Json& d : shape) {
        const std::size_t n = count_of(d);
        if (n == std::numeric_limits<std::size_t>::max() || (n != 0 && elements > data_size / n)) {
            fail(source, fmt::format("tensor '{}' has shape {}, more elements than the file's {} data bytes hold", name,
                                     shape.dump(), data_size));
        }
        elements *= n;
        e.dims.push_back(n);
    }
    const Json& offsets = fields["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || count_of(offsets[0]) > count_of(offsets[1]) ||
        count_of(offsets[1]) > data_size) {
        fail(source, fmt::format("tensor '{}' has data_offsets {}: need [begin, end] with begin <= end <= {} (the "
                                 "data's size)",
                                 name, offsets.dump(), data_size));
    }
    e.begin = count_of(offsets[0]), e.end = count_of(offsets[1]);
    if (e.end - e.begin != elements * item_size(e.dtype)) {
        fail(source, fmt::format("tensor '{}' is {} of shape {}: {} bytes, but data_offsets {} give {}", name,
                                 dtype_names[std::size_t(e.dtype)], shape.dump(), elements * item_size(e.dtype),
                                 offsets.dump(), e.end - e.begin));
    }
    return e;
}

/// The header as JSON; a duplicate name at the top level is refused (JSON itself allows it).
Json parse_header(std::string_view text, std::string_view source) {
    std::set<std::string> names;
    std::string duplicate;
    const Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
        if (depth == 1 && event == Json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second)
            duplicate = parsed.get<std::string>();
        return true;
    };
    Json header;
    try {
        header = Json::parse(text.begin(), text.end(), callback);
    } catch (const Json::exception& e) {
        fail(source, fmt::format("the header is not JSON ({})", e.what()));
    }
    if (!duplicate.empty()) fail(source, fmt::format("the header names tensor '{}' twice", duplicate));
    if (!header.is_object()) fail(source, "the header is not a JSON object");
    return header;
}

/// The entries, in the order of their data, covering the data exactly: no overlap, no hole.
std::vector<Entry> entries_of(const Json& header, std::size_t data_size, std::string_view source) {
    std::vector<Entry> entries;
    for (const auto& [name, fields] : header.items()) {
        if (name == "__metadata__") {
            if (!fields.is_object() || !std::all_of(fields.begin(), fields.end(), [](const Json& v) { return v.is_string(); }))
                fail(source, "__metadata__ must be an object of strings");
            continue;
        }
        entries.push_back(entry_of(name, fields, data_size, source));
    }
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::size_t covered = 0;
    for (const Entry& e : entries) {
        if (e.begin < covered) {
            fail(source, fmt::format("tensor '{}' (bytes {}..{}) overlaps the tensor before it (up to {})", e.name,
                                     e.begin, e.end, covered));
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
    const Json header = parse_header(bytes.substr(8, header_size), source);
    const std::string_view data = bytes.substr(8 + header_size);
    std::vector<SafetensorsTensor> tensors;
    for (const Entry& e : entries_of(header, data.size(), source)) {
        Tensor<double> value{Shape(std::span<const std::size_t>(e.dims))};
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
/// once from double, for BF16 and F16).
std::uint64_t stored_bits(SafetensorsDtype dtype, double x) {
    switch (dtype) {
        case SafetensorsDtype::float64: return std::bit_cast<std::uint64_t>(x);
        case SafetensorsDtype::float32: return std::bit_cast<std::uint32_t>(float(x));
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
