/// \file
/// NumPy interchange: reads and writes `.npy` files (format version 1.0; float64 '<f8' and float32
/// '<f4'; C order; little-endian), so tensors cross over to NumPy and PyTorch:
///
///     save_npy("O.npy", O.value());                 // np.load("O.npy")
///     Tensor<double> X = load_npy("X.npy");         // np.save("X.npy", X)
///
/// Every malformed file raises io_error naming the file and what is wrong with it (missing file,
/// bad magic, truncated header or data, unknown or wrong dtype, Fortran order, a shape that
/// disagrees with the data size, absurd sizes); nothing is read outside the bytes given, and
/// nothing is allocated before the shape has been checked against the data actually present.
/// The parser works on bytes in memory (parse_npy), which is what the fuzzer drives.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tensor.hpp"
#include "io/read_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

enum class NpyDtype { float64, float32 };

/// What a .npy header says: element type, shape, and where the data starts.
struct NpyHeader {
    NpyDtype dtype = NpyDtype::float64;
    Shape shape;
    std::size_t data_offset = 0;
};

namespace npy_detail {

inline constexpr std::string_view magic = "\x93NUMPY";

inline std::size_t item_size(NpyDtype dtype) { return dtype == NpyDtype::float64 ? 8 : 4; }

/// A cursor over the header's Python-literal dict, raising io_error with the file's name.
class HeaderParser {
public:
    HeaderParser(std::string_view text, std::string_view source) : text_(text), source_(source) {}

    [[noreturn]] void fail(std::string_view what) const {
        // Quote at most 80 characters of the header, non-printable bytes as '?'.
        std::string excerpt(text_.substr(0, 80));
        for (char& c : excerpt)
            if (c < 32 || c > 126) c = '?';
        throw io_error(fmt::format("load_npy: {}: malformed header ({}) in \"{}\"", source_, what, excerpt));
    }
    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n')) ++pos_;
    }
    bool accept(char c) {
        skip_space();
        if (pos_ < text_.size() && text_[pos_] == c) {
            ++pos_;
            return true;
        }
        return false;
    }
    void expect(char c) {
        if (!accept(c)) fail(fmt::format("expected '{}' at offset {}", c, pos_));
    }
    std::string quoted() {
        skip_space();
        if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
            fail(fmt::format("expected a quoted string at offset {}", pos_));
        }
        const char quote = text_[pos_++];
        const std::size_t end = text_.find(quote, pos_);
        if (end == std::string_view::npos) fail("unterminated string");
        std::string value(text_.substr(pos_, end - pos_));
        pos_ = end + 1;
        return value;
    }
    bool boolean() {
        skip_space();
        for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
            if (text_.substr(pos_, word.size()) == word) {
                pos_ += word.size();
                return value;
            }
        }
        fail(fmt::format("expected True or False at offset {}", pos_));
    }
    std::size_t integer() {
        skip_space();
        const std::size_t start = pos_;
        std::size_t value = 0;
        while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
            const std::size_t digit = static_cast<std::size_t>(text_[pos_] - '0');
            if (value > (max_elements - digit) / 10) fail("a dimension exceeds the element limit (absurd size)");
            value = value * 10 + digit;
            ++pos_;
        }
        if (pos_ == start) fail(fmt::format("expected a non-negative integer at offset {}", pos_));
        if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
        return value;
    }
    /// (2, 3) or (3,) or ().
    std::vector<std::size_t> tuple() {
        expect('(');
        std::vector<std::size_t> dims;
        while (!accept(')')) {
            if (dims.size() == max_rank) fail(fmt::format("rank above the maximum {}", max_rank));
            dims.push_back(integer());
            if (!accept(',')) {
                expect(')');
                break;
            }
        }
        return dims;
    }
    bool at_end() {
        skip_space();
        return pos_ == text_.size();
    }

private:
    std::string_view text_;
    std::string_view source_;
    std::size_t pos_ = 0;
};

template <class Word>
Word little_endian_word(const char* bytes) {
    Word word = 0;
    for (std::size_t b = 0; b < sizeof(Word); ++b) word |= Word(static_cast<unsigned char>(bytes[b])) << (8 * b);
    return word;
}

/// x rounded to float once, to nearest even, as if directly (a double or float already is one
/// rounding away). A wider T goes through its nearest double d first, and float(d) is x's nearest
/// float except where d lands exactly on the midpoint between two floats (a double) while x does
/// not: x < m implies d <= m and x > m implies d >= m, so that tie is the only double rounding that
/// can err (1 + 2^-24 + 2^-60 would become 1, not 1 + 2^-23); there the side of m that x lies on
/// decides.
template <Scalar T>
float rounded_to_float(const T& x) {
    const double d = to_double(x);
    const float f = static_cast<float>(d);
    if constexpr (!std::is_same_v<T, double> && !std::is_same_v<T, float>) {
        if (std::isfinite(f) && double(f) != d) {
            const float other = std::nextafter(f, double(f) < d ? std::numeric_limits<float>::infinity()
                                                                : -std::numeric_limits<float>::infinity());
            const double midpoint = (double(f) + double(other)) / 2;  // exact: floats' midpoints are doubles
            if (d == midpoint && x != T(d)) {
                const bool above = T(d) < x;
                return (double(other) > double(f)) == above ? other : f;
            }
        }
    }
    return f;
}

}  // namespace npy_detail

/// Parses and checks the header of the .npy image `bytes` (the whole file); `source` names it in
/// messages. Checks the data size against the shape too, so a header that passes describes
/// exactly the bytes that follow it.
inline NpyHeader parse_npy_header(std::string_view bytes, std::string_view source = "<memory>") {
    using npy_detail::HeaderParser;
    // Magic first (as far as the file goes), so a short text file is called what it is.
    const std::size_t magic_seen = std::min(bytes.size(), npy_detail::magic.size());
    if (bytes.substr(0, magic_seen) != npy_detail::magic.substr(0, magic_seen)) {
        throw io_error(fmt::format("load_npy: {}: bad magic (not a .npy file)", source));
    }
    if (bytes.size() < 10) {
        throw io_error(fmt::format("load_npy: {}: truncated header ({} bytes; a .npy file starts with at least 10)",
                                   source, bytes.size()));
    }
    const unsigned major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
    std::size_t header_length = 0, header_start = 0;
    if (major == 1) {
        header_length = npy_detail::little_endian_word<std::uint16_t>(bytes.data() + 8);
        header_start = 10;
    } else if (major == 2 || major == 3) {  // 4-byte header length; NumPy uses them for huge headers only
        if (bytes.size() < 12) throw io_error(fmt::format("load_npy: {}: truncated header", source));
        header_length = npy_detail::little_endian_word<std::uint32_t>(bytes.data() + 8);
        header_start = 12;
    } else {
        throw io_error(fmt::format("load_npy: {}: unsupported format version {}.{}", source, major, minor));
    }
    if (header_length > bytes.size() - header_start) {
        throw io_error(fmt::format("load_npy: {}: truncated header (declares {} bytes, the file has {} after the "
                                   "preamble)",
                                   source, header_length, bytes.size() - header_start));
    }
    HeaderParser parser(bytes.substr(header_start, header_length), source);
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<std::size_t>> dims;
    parser.expect('{');
    while (!parser.accept('}')) {
        const std::string key = parser.quoted();
        parser.expect(':');
        if (key == "descr" && !descr) {
            descr = parser.quoted();
        } else if (key == "fortran_order" && !fortran_order) {
            fortran_order = parser.boolean();
        } else if (key == "shape" && !dims) {
            dims = parser.tuple();
        } else {
            parser.fail(fmt::format("unexpected or repeated key '{}'", key));
        }
        if (!parser.accept(',')) {
            parser.expect('}');
            break;
        }
    }
    if (!parser.at_end()) parser.fail("text after the dict");
    if (!descr || !fortran_order || !dims) parser.fail("it needs the keys descr, fortran_order and shape");

    NpyHeader header;
    if (*descr == "<f8") {
        header.dtype = NpyDtype::float64;
    } else if (*descr == "<f4") {
        header.dtype = NpyDtype::float32;
    } else {
        throw io_error(fmt::format("load_npy: {}: dtype '{}' is not supported (only little-endian float64 '<f8' "
                                   "and float32 '<f4')",
                                   source, *descr));
    }
    if (*fortran_order) {
        throw io_error(fmt::format("load_npy: {}: Fortran-order data is not supported; save a C-order array "
                                   "(np.ascontiguousarray)",
                                   source));
    }
    try {
        header.shape = Shape(std::span<const std::size_t>(*dims));
    } catch (const shape_error& e) {
        throw io_error(fmt::format("load_npy: {}: absurd shape: {}", source, e.what()));
    }
    header.data_offset = header_start + header_length;
    const std::size_t available = bytes.size() - header.data_offset;
    const std::size_t item = npy_detail::item_size(header.dtype);
    // shape.size() ≤ max_elements = 2^40, so the product with 8 cannot overflow.
    const std::size_t needed = header.shape.size() * item;
    if (available != needed) {
        throw io_error(fmt::format("load_npy: {}: shape {} of {} needs {} data bytes, the file has {}{}", source,
                                   header.shape.to_string(), *descr, needed, available,
                                   available < needed ? " (truncated data)" : " (trailing bytes)"));
    }
    return header;
}

/// The tensor in the .npy image `bytes`, converted to T.
template <Scalar T = double>
Tensor<T> parse_npy(std::string_view bytes, std::string_view source = "<memory>") {
    const NpyHeader header = parse_npy_header(bytes, source);
    std::vector<T> data;
    data.reserve(header.shape.size());
    const char* cursor = bytes.data() + header.data_offset;
    for (std::size_t k = 0; k < header.shape.size(); ++k) {
        if (header.dtype == NpyDtype::float64) {
            data.push_back(T(std::bit_cast<double>(npy_detail::little_endian_word<std::uint64_t>(cursor))));
            cursor += 8;
        } else {
            data.push_back(T(std::bit_cast<float>(npy_detail::little_endian_word<std::uint32_t>(cursor))));
            cursor += 4;
        }
    }
    return Tensor<T>(header.shape, std::move(data));
}

/// Reads a .npy file. Raises io_error for a missing or unreadable file (a directory too) and
/// anything malformed.
template <Scalar T = double>
Tensor<T> load_npy(const std::filesystem::path& path) {
    return parse_npy<T>(read_file_bytes(path, "load_npy"), fmt::format("'{}'", path.string()));
}

/// The .npy image of `tensor` (version 1.0, C order, little-endian). Multiprecision values are
/// rounded to the dtype once, to nearest even (not to double and then to float); `dtype` float32
/// rounds doubles too.
template <Scalar T>
std::string npy_bytes(const Tensor<T>& tensor, NpyDtype dtype = NpyDtype::float64) {
    std::string shape = "(";
    for (std::size_t axis = 0; axis < tensor.rank(); ++axis) shape += fmt::format("{}{}", axis ? ", " : "", tensor.shape()[axis]);
    shape += tensor.rank() == 1 ? ",)" : ")";  // Python's one-element tuple is (3,)
    std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                     dtype == NpyDtype::float64 ? "<f8" : "<f4", shape);
    // Pad with spaces and a final newline so the data starts on a 64-byte boundary (NumPy's layout).
    const std::size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    if (header.size() > 65535) throw io_error("save_npy: header too long for format version 1.0");
    std::string bytes(npy_detail::magic);
    bytes += '\x01';
    bytes += '\x00';
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    bytes += header;
    const std::size_t item = npy_detail::item_size(dtype);
    bytes.reserve(bytes.size() + tensor.size() * item);
    for (const T& x : tensor.data()) {
        std::uint64_t word = 0;
        if (dtype == NpyDtype::float64) {
            word = std::bit_cast<std::uint64_t>(to_double(x));
        } else {
            word = std::bit_cast<std::uint32_t>(npy_detail::rounded_to_float(x));
        }
        for (std::size_t b = 0; b < item; ++b) bytes += static_cast<char>((word >> (8 * b)) & 0xff);
    }
    return bytes;
}

/// Writes `tensor` as a .npy file. Raises io_error when the file cannot be written completely.
template <Scalar T>
void save_npy(const std::filesystem::path& path, const Tensor<T>& tensor, NpyDtype dtype = NpyDtype::float64) {
    const std::string bytes = npy_bytes(tensor, dtype);
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    if (!file) throw io_error(fmt::format("save_npy: cannot create '{}': {}", path.string(), std::strerror(errno)));
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    file.close();
    if (!file) throw io_error(fmt::format("save_npy: error writing '{}'", path.string()));
}

}  // namespace tapegrad
