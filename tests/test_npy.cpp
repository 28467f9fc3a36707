// .npy interchange: exact round trips for float64 and float32 at every rank, the exact bytes
// NumPy writes, and a corpus of malformed files (written by this test) that must each raise
// io_error with a message naming the file and the fault, never crash or read out of bounds.
#define BOOST_TEST_MODULE npy
#include "support.hpp"

#include "io/npy.hpp"

#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <unistd.h>

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

using testing::TempDir;  // (tests/support.hpp)

void write_bytes(const fs::path& path, std::string_view bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A version-1.0 image with the given header text (padded the way NumPy pads) and data bytes.
std::string image(std::string header, std::string_view data) {
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string bytes = "\x93NUMPY\x01";
    bytes += '\0';
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    return bytes + header + std::string(data);
}

std::string doubles(std::size_t count) { return std::string(count * 8, '\0'); }

}  // namespace

BOOST_AUTO_TEST_CASE(writes_the_bytes_numpy_writes) {
    // np.save of np.zeros((2, 3)) with NumPy 1.x: this exact header, padded to 128 bytes.
    const std::string expected_header =
        std::string("\x93NUMPY\x01\x00\x76\x00{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 69) +
        std::string(58, ' ') + "\n";
    const std::string bytes = npy_bytes(Tensor<double>(Shape{2, 3}));
    BOOST_TEST(bytes.size() == 128u + 6 * 8);
    BOOST_TEST(bytes.substr(0, 128) == expected_header);
    // A 1-d shape is the one-element tuple (4,), a 0-d one the empty tuple ().
    BOOST_TEST(npy_bytes(Tensor<double>(Shape{4})).find("'shape': (4,), }") != std::string::npos);
    BOOST_TEST(npy_bytes(Tensor<double>::scalar(1.0)).find("'shape': (), }") != std::string::npos);
    BOOST_TEST(npy_bytes(Tensor<double>(Shape{1}), NpyDtype::float32).find("'<f4'") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(round_trips_every_rank_bit_for_bit) {
    const TempDir dir("npy_roundtrip");
    std::mt19937_64 rng(11);
    for (const Shape& shape : {Shape{}, Shape{5}, Shape{3, 4}, Shape{2, 1, 3}, Shape{2, 2, 1, 3}, Shape{0, 3}}) {
        BOOST_TEST_CONTEXT("shape " << fmt::format("{}", fmt::join(shape.dims(), "x"))) {
            Tensor<double> t = testing::random_tensor(shape, rng, 1e3);
            if (t.size() > 0) t[0] = -0.0;
            if (t.size() > 2) t[1] = std::numeric_limits<double>::denorm_min(), t[2] = -std::numeric_limits<double>::infinity();
            const fs::path file = dir.path / "t.npy";
            save_npy(file, t);
            const Tensor<double> back = load_npy(file);
            BOOST_TEST((back.shape() == t.shape()));
            for (std::size_t k = 0; k < t.size(); ++k) {
                BOOST_TEST(std::bit_cast<std::uint64_t>(back[k]) == std::bit_cast<std::uint64_t>(t[k]));
            }
            // float32: the file holds the rounded values, which come back exactly.
            save_npy(file, t, NpyDtype::float32);
            const Tensor<float> single = load_npy<float>(file);
            for (std::size_t k = 0; k < t.size(); ++k) {
                BOOST_TEST(std::bit_cast<std::uint32_t>(single[k]) == std::bit_cast<std::uint32_t>(static_cast<float>(t[k])));
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(multiprecision_tensors_are_saved_rounded_to_double) {
    const Tensor<mp50> third = Tensor<mp50>::matrix({{mp50(1) / 3, mp50(-2) / 7}});
    const Tensor<double> back = parse_npy(npy_bytes(third));
    BOOST_TEST(back[0] == 1.0 / 3.0);
    BOOST_TEST(back[1] == -2.0 / 7.0);
    // Loading into mp50 widens exactly.
    BOOST_TEST(parse_npy<mp50>(npy_bytes(back))[0] == mp50(1.0 / 3.0));
}

// A 50-digit value written as float32 is rounded once, as if directly: values just off a float
// midpoint by less than half a double's ulp round to a double ON the midpoint, where a second
// rounding (double to float, ties to even) would go the wrong way half the time. Each row: a float
// midpoint m (1 + 2^-24 between 1 and 1 + 2^-23, both signs, a subnormal's, a large one's) moved by
// ±2^-64 of its ulp; the expected float is computed here from the bits, not by the library: the
// neighbour on x's side. Exact midpoints keep ties to even, and values that are not near a midpoint
// are unaffected.
BOOST_AUTO_TEST_CASE(multiprecision_values_are_rounded_to_float32_once) {
    struct Row {
        float low, high;  // adjacent floats, low < high
    };
    const float tiny = std::numeric_limits<float>::denorm_min();
    const std::vector<Row> rows{{1.0f, std::nextafter(1.0f, 2.0f)},
                                {std::nextafter(-1.0f, -2.0f), -1.0f},
                                {3 * tiny, 4 * tiny},
                                {std::nextafter(3e38f, 0.0f), 3e38f},
                                {0.1f, std::nextafter(0.1f, 1.0f)}};
    for (const Row& row : rows) {
        const mp50 m = (mp50(row.low) + mp50(row.high)) / 2, ulp = mp50(row.high) - mp50(row.low);
        const mp50 off = ulp / mp50(std::pow(2.0, 64));  // below half a double's ulp at m, 2^-54 of m
        const mp50 above = m + off, below = m - off;
        const Tensor<mp50> x = Tensor<mp50>::matrix({{above, below, m}});
        const Tensor<float> back = parse_npy<float>(npy_bytes(x, NpyDtype::float32));
        BOOST_TEST_CONTEXT("between " << row.low << " and " << row.high) {
            BOOST_REQUIRE(to_double(above) == to_double(m));  // the case: both land on the midpoint as doubles
            BOOST_TEST(std::bit_cast<std::uint32_t>(back[0]) == std::bit_cast<std::uint32_t>(row.high));
            BOOST_TEST(std::bit_cast<std::uint32_t>(back[1]) == std::bit_cast<std::uint32_t>(row.low));
            // The midpoint itself: ties to even (the float whose last significand bit is 0).
            const float even = (std::bit_cast<std::uint32_t>(row.low) & 1u) == 0 ? row.low : row.high;
            BOOST_TEST(std::bit_cast<std::uint32_t>(back[2]) == std::bit_cast<std::uint32_t>(even));
        }
    }
}

BOOST_AUTO_TEST_CASE(accepts_what_numpy_may_write) {
    // Double quotes, keys in another order, no trailing comma, version 2.0 header length.
    const Tensor<double> t = parse_npy(image("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<f8\"}", doubles(2)));
    BOOST_TEST((t.shape() == Shape{2}));
    std::string v2 = "\x93NUMPY\x02";
    v2 += std::string("\0", 1);
    const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }\n";
    v2 += static_cast<char>(header.size());
    v2 += std::string(3, '\0');
    BOOST_TEST((parse_npy(v2 + header + std::string(4, '\0')).shape() == Shape{1, 1}));
}

// Every malformed input, from a file on disk: the exception type, and the words the message
// must contain (besides the file's name).
BOOST_AUTO_TEST_CASE(malformed_files_raise_io_error_naming_the_fault) {
    const TempDir dir("npy_malformed");
    const std::string good = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
    std::string truncated_preamble = "\x93NUMPY\x01";
    truncated_preamble += '\0';
    std::string long_header = image(good, doubles(6));
    long_header[8] = '\xff';  // declares 0x??ff header bytes, beyond the file
    long_header[9] = '\x7f';
    struct Case {
        std::string name;
        std::string bytes;
        std::string message;
    };
    const std::vector<Case> corpus = {
        {"empty", "", "truncated header"},
        {"short_preamble", truncated_preamble, "truncated header"},
        {"bad_magic", "PK\x03\x04 this is a zip file, not npy", "bad magic"},
        {"version_9", "\x93NUMPY\x09" + std::string(3, '\0'), "unsupported format version 9.0"},
        {"header_beyond_file", long_header, "truncated header (declares"},
        {"header_cut_short", image(good, doubles(6)).substr(0, 40), "truncated header"},
        {"not_a_dict", image("[1, 2, 3]", ""), "expected '{'"},
        {"missing_shape", image("{'descr': '<f8', 'fortran_order': False}", doubles(1)), "needs the keys"},
        {"repeated_key", image("{'descr': '<f8', 'descr': '<f8'}", ""), "repeated key 'descr'"},
        {"unknown_key", image("{'descr': '<f8', 'fortran_order': False, 'shape': (), 'x': 1}", doubles(1)), "unexpected or repeated key 'x'"},
        {"unterminated_string", image("{'descr: <f8}", ""), "unterminated string"},
        {"bad_boolean", image("{'descr': '<f8', 'fortran_order': maybe, 'shape': ()}", doubles(1)), "True or False"},
        {"negative_dimension", image("{'descr': '<f8', 'fortran_order': False, 'shape': (-1,)}", ""), "non-negative integer"},
        {"unclosed_tuple", image("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3", ""), "expected ')'"},
        {"text_after_dict", image(good + " junk", doubles(6)), "text after the dict"},
        {"int64_dtype", image("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", doubles(6)), "dtype '<i8' is not supported"},
        {"big_endian", image("{'descr': '>f8', 'fortran_order': False, 'shape': (2, 3), }", doubles(6)), "dtype '>f8' is not supported"},
        {"complex_dtype", image("{'descr': '<c16', 'fortran_order': False, 'shape': (2, 3), }", doubles(12)), "dtype '<c16'"},
        {"fortran_order", image("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", doubles(6)), "Fortran-order"},
        {"truncated_data", image(good, doubles(5)), "needs 48 data bytes, the file has 40 (truncated data)"},
        {"trailing_bytes", image(good, doubles(6) + "x"), "(trailing bytes)"},
        {"float32_size_for_float64", image(good, std::string(6 * 4, '\0')), "truncated data"},
        {"absurd_product", image("{'descr': '<f8', 'fortran_order': False, 'shape': (4000000, 4000000), }", ""), "absurd shape"},
        {"absurd_dimension", image("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999999,), }", ""), "absurd size"},
        {"rank_5", image("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1), }", doubles(1)), "rank above the maximum 4"},
        {"binary_header", image(std::string("{\x01\x02\xff", 4), ""), "malformed header"},
    };
    for (const Case& c : corpus) {
        BOOST_TEST_CONTEXT(c.name) {
            const fs::path file = dir.path / (c.name + ".npy");
            write_bytes(file, c.bytes);
            bool thrown = false;
            try {
                (void)load_npy(file);
            } catch (const io_error& e) {
                thrown = true;
                const std::string message = e.what();
                BOOST_TEST_MESSAGE(c.name << ": " << message);
                BOOST_TEST(message.find(c.message) != std::string::npos, "message: " << message);
                BOOST_TEST(message.find(c.name + ".npy") != std::string::npos, "message: " << message);
            }
            BOOST_TEST(thrown);
        }
    }
    BOOST_CHECK_EXCEPTION((void)load_npy(dir.path / "missing.npy"), io_error, [](const io_error& e) {
        return std::string(e.what()).find("cannot open") != std::string::npos &&
               std::string(e.what()).find("missing.npy") != std::string::npos;
    });
    // A directory: libstdc++ throws std::ios_base::failure reading it; the reader names it instead.
    std::filesystem::create_directories(dir.path / "a_directory.npy");
    BOOST_CHECK_EXCEPTION((void)load_npy(dir.path / "a_directory.npy"), io_error, [](const io_error& e) {
        return std::string(e.what()).find("load_npy: cannot read '") != std::string::npos &&
               std::string(e.what()).find("a_directory.npy': it is a directory") != std::string::npos;
    });
    // Every prefix of a valid file is malformed (truncation at each byte), and never crashes.
    const std::string valid = npy_bytes(Tensor<double>(Shape{2, 3}, 1.5));
    for (std::size_t length = 0; length < valid.size(); ++length) {
        BOOST_CHECK_THROW((void)parse_npy(std::string_view(valid).substr(0, length)), io_error);
    }
    BOOST_TEST(parse_npy(valid)(1, 2) == 1.5);
}

BOOST_AUTO_TEST_CASE(unwritable_path_raises_io_error) {
    BOOST_CHECK_THROW(save_npy("/nonexistent-dir/x.npy", Tensor<double>(Shape{1})), io_error);
}
