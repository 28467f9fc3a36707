// The safetensors reader and writer (io/safetensors.hpp) and the decoder's weights under Hugging
// Face's names (models/llama_weights.hpp): round trips bit for bit in F64 and F32; BF16 and F16
// written rounded to nearest even;
// read exactly (normal, subnormal, infinite, NaN and signed-zero values built byte by byte); every
// malformed file of the corpus below refused with io_error naming the fault (23 of them); a failed
// save leaves no file; a directory given as the file is named, not thrown past; and the decoder's logits unchanged through a file of its weights, with a missing, a
// misshapen or a foreign tensor named.
#define BOOST_TEST_MODULE safetensors
#include "support.hpp"
#include "models/llama_weights.hpp"
#include "autodiff/low_precision.hpp"

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace tapegrad;
using tapegrad::testing::message_of;
using tapegrad::testing::random_tensor;

namespace {

// A file from its header text and data bytes.
std::string file_of(const std::string& header, const std::string& data) {
    std::string out;
    for (int k = 0; k < 8; ++k) out.push_back(char((header.size() >> (8 * k)) & 0xff));
    return out + header + data;
}

std::string bytes_of(std::initializer_list<int> values) {
    std::string out;
    for (const int v : values) out.push_back(char(v));
    return out;
}

std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }

}  // namespace

BOOST_AUTO_TEST_CASE(f64_and_f32_round_trip_bit_for_bit) {
    std::mt19937_64 rng(3);
    Tensor<double> a = random_tensor(Shape{2, 3}, rng), b = random_tensor(Shape{4}, rng);
    a[0] = -0.0, a[1] = std::numeric_limits<double>::infinity(), a[2] = 5e-324;  // signed zero, inf, subnormal
    const std::vector<SafetensorsTensor> tensors{{"a", SafetensorsDtype::float64, a},
                                                 {"b", SafetensorsDtype::float32, b},
                                                 {"scalar", SafetensorsDtype::float64, Tensor<double>::scalar(2.5)},
                                                 {"empty", SafetensorsDtype::float32, Tensor<double>(Shape{0, 3})}};
    const std::string bytes = safetensors_bytes(tensors);
    BOOST_TEST(static_cast<unsigned char>(bytes[0]) % 8 == 0u);  // the header padded: the data 8-byte aligned
    const std::vector<SafetensorsTensor> back = parse_safetensors(bytes);
    BOOST_TEST_REQUIRE(back.size() == 4u);
    for (const SafetensorsTensor& t : back) {
        const auto original = std::find_if(tensors.begin(), tensors.end(), [&](const auto& o) { return o.name == t.name; });
        BOOST_TEST_REQUIRE((original != tensors.end()));
        BOOST_TEST((t.dtype == original->dtype));
        BOOST_TEST(t.value.shape().to_string() == original->value.shape().to_string());
        for (std::size_t k = 0; k < t.value.size(); ++k) {
            const double expected = t.dtype == SafetensorsDtype::float32 ? double(float(original->value[k])) : original->value[k];
            BOOST_TEST(bits(t.value[k]) == bits(expected), t.name << "[" << k << "]");
        }
    }
}

BOOST_AUTO_TEST_CASE(bf16_and_f16_read_exactly) {
    // BF16: 1.0 (0x3f80), −2.5 (0xc020), the smallest subnormal (0x0001 = 2^−133), +inf (0x7f80),
    // NaN (0x7fc0), −0 (0x8000). F16: 1.0 (0x3c00), 65504 (0x7bff), 2^−24 (0x0001), −inf (0xfc00),
    // NaN (0x7e00), 1/3 rounded (0x3555 = 0.333251953125).
    const std::string bf16 = bytes_of({0x80, 0x3f, 0x20, 0xc0, 0x01, 0x00, 0x80, 0x7f, 0xc0, 0x7f, 0x00, 0x80});
    const std::string f16 = bytes_of({0x00, 0x3c, 0xff, 0x7b, 0x01, 0x00, 0x00, 0xfc, 0x00, 0x7e, 0x55, 0x35});
    const std::string header = R"({"b":{"dtype":"BF16","shape":[6],"data_offsets":[0,12]},)"
                               R"("h":{"dtype":"F16","shape":[2,3],"data_offsets":[12,24]},"__metadata__":{"format":"pt"}})";
    const std::vector<SafetensorsTensor> t = parse_safetensors(file_of(header, bf16 + f16));
    BOOST_TEST_REQUIRE(t.size() == 2u);
    BOOST_TEST(t[0].name == "b");
    BOOST_TEST((t[0].dtype == SafetensorsDtype::bfloat16));
    const Tensor<double>& b = t[0].value;
    BOOST_TEST(b[0] == 1.0);
    BOOST_TEST(b[1] == -2.5);
    BOOST_TEST(b[2] == std::ldexp(1.0, -133));
    BOOST_TEST(b[3] == std::numeric_limits<double>::infinity());
    BOOST_TEST(std::isnan(b[4]));
    BOOST_TEST((b[5] == 0.0 && std::signbit(b[5])));
    const Tensor<double>& h = t[1].value;
    BOOST_TEST(h.shape().to_string() == "[2x3]");
    BOOST_TEST(h[0] == 1.0);
    BOOST_TEST(h[1] == 65504.0);
    BOOST_TEST(h[2] == std::ldexp(1.0, -24));
    BOOST_TEST(h[3] == -std::numeric_limits<double>::infinity());
    BOOST_TEST(std::isnan(h[4]));
    BOOST_TEST(h[5] == 0.333251953125);
}

// BF16 and F16 written: the bytes are the patterns autodiff/low_precision.hpp rounds to (ties to
// even, subnormals, ±inf past the largest, NaN quiet), and they read back as the rounded values.
// BF16: 1 + 2⁻⁸ (a tie: down to the even 1.0, 0x3f80), 1 + 3·2⁻⁸ (a tie: up to 0x3f82), −2.5,
// 1.5·2⁻¹³³ (a subnormal tie: 0x0002), 1e39 (past the largest finite, 3.39e38: inf 0x7f80), NaN.
// F16: 65520 (the tie past 65504: inf 0x7c00), 2⁻²⁵ (the tie with 0: +0), −1/3 (0xb555).
BOOST_AUTO_TEST_CASE(bf16_and_f16_written_round_to_nearest_even) {
    const Tensor<double> b(Shape{6}, std::vector<double>{1 + std::ldexp(1.0, -8), 1 + 3 * std::ldexp(1.0, -8), -2.5,
                                                         1.5 * std::ldexp(1.0, -133), 1e39,
                                                         std::numeric_limits<double>::quiet_NaN()});
    const Tensor<double> h(Shape{3}, std::vector<double>{65520.0, std::ldexp(1.0, -25), -1.0 / 3});
    const std::vector<SafetensorsTensor> tensors{{"b", SafetensorsDtype::bfloat16, b}, {"h", SafetensorsDtype::float16, h}};
    const std::string bytes = safetensors_bytes(tensors);
    const std::string data = bytes.substr(bytes.size() - 18);
    BOOST_TEST(data == bytes_of({0x80, 0x3f, 0x82, 0x3f, 0x20, 0xc0, 0x02, 0x00, 0x80, 0x7f, 0xc0, 0x7f,  // BF16
                                 0x00, 0x7c, 0x00, 0x00, 0x55, 0xb5}));                                  // F16
    const std::vector<SafetensorsTensor> back = parse_safetensors(bytes);
    BOOST_TEST_REQUIRE(back.size() == 2u);
    BOOST_TEST((back[0].dtype == SafetensorsDtype::bfloat16 && back[1].dtype == SafetensorsDtype::float16));
    for (std::size_t k = 0; k + 1 < b.size(); ++k) BOOST_TEST(back[0].value[k] == bfloat16_value(bfloat16_bits(b[k])));
    BOOST_TEST(std::isnan(back[0].value[5]));
    BOOST_TEST(back[1].value[0] == std::numeric_limits<double>::infinity());
    BOOST_TEST(back[1].value[2] == -0.333251953125);
}

BOOST_AUTO_TEST_CASE(malformed_files_are_refused_naming_the_fault) {
    const std::string f64_one = bytes_of({0, 0, 0, 0, 0, 0, 0xf0, 0x3f});
    struct Row {
        std::string what, bytes, words;
    };
    const std::vector<Row> rows = {
        {"shorter than 8 bytes", "abc", "3 bytes; a safetensors file starts with 8"},
        {"the length alone", std::string(8, '\0'), "the header is not JSON"},
        {"header longer than the file", file_of("{}", "").substr(0, 8) + "{", "the header is 2 bytes long but the file holds 1"},
        {"header length near 2^64", bytes_of({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) + "{}", "the header is 18446744073709551615 bytes long"},
        {"header not JSON", file_of("{\"a\":", ""), "the header is not JSON"},
        {"header not an object", file_of("[1, 2]", ""), "the header is not a JSON object"},
        {"unknown dtype", file_of(R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"), "dtype \"I8\""},
        {"empty dtype", file_of(R"({"a":{"dtype":"","shape":[1],"data_offsets":[0,1]}})", "x"), "dtype \"\""},
        {"shape not counts", file_of(R"({"a":{"dtype":"F64","shape":[-1],"data_offsets":[0,8]}})", f64_one), "has shape [-1]"},
        {"shape of rank 5", file_of(R"({"a":{"dtype":"F64","shape":[1,1,1,1,1],"data_offsets":[0,8]}})", f64_one), "a list of at most 4 counts"},
        {"shape overflowing", file_of(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f64_one), "more elements than the file's 8 data bytes hold"},
        {"offsets past the data", file_of(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,16]}})", f64_one), "data_offsets [0,16]: need [begin, end] with begin <= end <= 8"},
        {"offsets reversed", file_of(R"({"a":{"dtype":"F64","shape":[0],"data_offsets":[8,0]}})", f64_one), "data_offsets [8,0]"},
        {"offsets not a pair", file_of(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0]}})", f64_one), "data_offsets [0]"},
        {"offsets of three", file_of(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8,9]}})", f64_one), "data_offsets [0,8,9]"},
        {"offsets an object", file_of(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":{"b":0,"e":8}}})", f64_one), "data_offsets {\"b\":0,\"e\":8}"},
        {"size not the shape's", file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", f64_one), "is F32 of shape [1]: 4 bytes, but data_offsets [0,8] give 8"},
        {"overlapping tensors", file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f64_one), "overlaps the tensor before it"},
        {"a hole in the data", file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f64_one), "data bytes 0..4 belong to no tensor"},
        {"data left over", file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f64_one), "data bytes 4..8 belong to no tensor"},
        {"a duplicate name", file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f64_one), "names tensor 'a' twice"},
        {"entry not an object", file_of(R"({"a":[1]})", ""), "tensor 'a' needs an object with dtype, shape and data_offsets"},
        {"metadata not strings", file_of(R"({"__metadata__":{"n":1}})", ""), "__metadata__ must be an object of strings"},
    };
    for (const Row& row : rows) {
        BOOST_TEST_CONTEXT(row.what) {
            const std::string message = message_of<io_error>([&] { (void)parse_safetensors(row.bytes, "bad.safetensors"); });
            BOOST_TEST(message.find("load_safetensors: bad.safetensors: ") == 0u, message);
            BOOST_TEST(message.find(row.words) != std::string::npos, message);
        }
    }
}

BOOST_AUTO_TEST_CASE(the_writer_refuses_what_it_cannot_store_and_a_failed_save_leaves_no_file) {
    const Tensor<double> x(Shape{2}, 1.0);
    const std::vector<SafetensorsTensor> twice{{"w", SafetensorsDtype::float64, x}, {"w", SafetensorsDtype::float64, x}};
    BOOST_TEST(message_of<usage_error>([&] { (void)safetensors_bytes(twice); }).find("'w' is empty, reserved or given twice") != std::string::npos);
    const std::filesystem::path missing_dir = std::filesystem::temp_directory_path() / fmt::format("no_such_dir_{}", ::getpid());
    const std::vector<SafetensorsTensor> one{{"w", SafetensorsDtype::float64, x}};
    BOOST_TEST(message_of<io_error>([&] { save_safetensors(missing_dir / "w.safetensors", one); }).find("save_safetensors: cannot create") != std::string::npos);
    BOOST_TEST(!std::filesystem::exists(missing_dir));  // the failed save made nothing
    BOOST_TEST(message_of<io_error>([&] { (void)load_safetensors(missing_dir / "w.safetensors"); }).find("cannot open") != std::string::npos);
    // A directory: libstdc++ throws std::ios_base::failure reading it; the reader names it instead.
    std::filesystem::create_directories(missing_dir / "d.safetensors");
    BOOST_TEST(message_of<io_error>([&] { (void)load_safetensors(missing_dir / "d.safetensors"); })
                   .find("load_safetensors: cannot read '") != std::string::npos);
    std::filesystem::remove_all(missing_dir);
}

// The decoder's weights written under Hugging Face's names and read back give the same logits bit
// for bit (F64); a missing tensor, a wrong shape and a foreign tensor are named.
BOOST_AUTO_TEST_CASE(the_decoder_through_a_file_of_its_weights_gives_the_same_logits) {
    LlamaConfig c;
    c.vocabulary = 9, c.width = 8, c.heads = 4, c.kv_heads = 2, c.layers = 2, c.hidden = 12, c.context = 6;
    c.rope_pairing = RopePairing::halves;
    std::mt19937_64 rng(8);
    std::vector<Tensor<double>> values;
    for (const Shape& shape : parameter_shapes(c)) values.push_back(random_tensor(shape, rng, 0.5));
    const std::filesystem::path file = std::filesystem::temp_directory_path() / fmt::format("llama_{}.safetensors", ::getpid());
    save_safetensors(file, llama_safetensors(values, c));
    const std::vector<SafetensorsTensor> loaded = load_safetensors(file);
    std::filesystem::remove(file);
    BOOST_TEST(loaded.size() == values.size());
    const std::vector<std::size_t> tokens{1, 4, 2, 8, 0, 3};
    const auto logits = [&](const std::vector<Tensor<double>>& parameters) {
        Tape<double> tape;
        return llama_logits(LlamaVars<double>::record(tape, parameters, c), c, std::span<const std::size_t>(tokens), 2).value();
    };
    const Tensor<double> before = logits(values), after = logits(llama_parameters_from(loaded, c));
    for (std::size_t k = 0; k < before.size(); ++k) BOOST_TEST(bits(after[k]) == bits(before[k]));
    // Faults a user's file can hold, each named.
    std::vector<SafetensorsTensor> missing(loaded.begin() + 1, loaded.end());
    BOOST_TEST(message_of<io_error>([&] { (void)llama_parameters_from(missing, c); }).find("no tensor 'model.embed_tokens.weight'") != std::string::npos);
    std::vector<SafetensorsTensor> wrong = loaded;
    for (SafetensorsTensor& t : wrong)
        if (t.name == "model.layers.1.self_attn.k_proj.weight") t.value = Tensor<double>(Shape{8, 4}, 0.0);
    BOOST_TEST(message_of<io_error>([&] { (void)llama_parameters_from(wrong, c); }).find("'model.layers.1.self_attn.k_proj.weight' is [8x4]; the config needs [4x8]") != std::string::npos);
    std::vector<SafetensorsTensor> extra = loaded;
    extra.push_back({"model.layers.2.mlp.up_proj.weight", SafetensorsDtype::float64, Tensor<double>(Shape{1}, 0.0)});
    BOOST_TEST(message_of<io_error>([&] { (void)llama_parameters_from(extra, c); }).find("'model.layers.2.mlp.up_proj.weight' is not a parameter") != std::string::npos);
}
