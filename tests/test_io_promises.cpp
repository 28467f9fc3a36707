// The input/output headers' documented promises asserted where no other test made them bite (issue
// 49, item 2): io/npy.hpp, io/format.hpp, io/graphviz.hpp, io/read_file.hpp and io/tape_file.hpp,
// each promise held on inputs built so that the promise decides the outcome (a file shorter than
// the magic, a header quoted past 80 characters, every rank's padding, a node read in two slots, a
// failed write over an existing file, nodes before and after a saved output). test_npy,
// test_format, test_graphviz, test_tape_file and test_tape_file_structure hold the rest.
#define BOOST_TEST_MODULE io_promises
#include "support.hpp"

#include "io/format.hpp"
#include "io/graphviz.hpp"
#include "io/npy.hpp"
#include "io/read_file.hpp"
#include "io/tape_file.hpp"

#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

using testing::TempDir;  // (tests/support.hpp)

std::string file_text(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A version-`major` image with the given header text (padded as NumPy pads it) and data bytes; the
// header length is 2 bytes in version 1, 4 in versions 2 and 3.
std::string npy_image(std::string header, std::string_view data, unsigned char major = 1) {
    const std::size_t preamble = major == 1 ? 10 : 12;
    header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::string bytes = "\x93NUMPY";
    bytes += static_cast<char>(major);
    bytes += '\0';
    for (std::size_t b = 0; b < preamble - 8; ++b) bytes += static_cast<char>((header.size() >> (8 * b)) & 0xff);
    return bytes + header + std::string(data);
}

std::string npy_message(std::string_view bytes) {
    return testing::message_of<io_error>([&] { (void)parse_npy(bytes, "sample.npy"); });
}

// The DOT lines of `dot` that start (after the indent) with `start`.
std::vector<std::string> dot_lines(const std::string& dot, const std::string& start) {
    std::vector<std::string> lines;
    std::istringstream in(dot);
    for (std::string line; std::getline(in, line);)
        if (line.rfind("  " + start, 0) == 0) lines.push_back(line);
    return lines;
}

}  // namespace

// ---- io/npy.hpp -----------------------------------------------------------------------------------

// The magic is checked first, as far as the file goes: a short text file is "not a .npy file" (bad
// magic), not a truncated one; a prefix of the magic is a truncated header; a 6-byte file whose
// last byte differs from the magic's is bad magic again.
BOOST_AUTO_TEST_CASE(a_short_file_is_judged_by_its_magic_first) {
    for (const std::string text : {"hi\n", "x", "\x93NUMPX"}) {
        BOOST_TEST(npy_message(text) == "load_npy: sample.npy: bad magic (not a .npy file)", text);
    }
    for (const std::string prefix : {"\x93", "\x93NU", "\x93NUMPY", "\x93NUMPY\x01"}) {
        BOOST_TEST(npy_message(prefix).find("truncated header") != std::string::npos, npy_message(prefix));
    }
}

// A malformed header is quoted in the message, at most 80 characters of it, every byte that is not
// printable ASCII (a control byte, a byte above 126) as '?'.
BOOST_AUTO_TEST_CASE(a_malformed_header_is_quoted_to_80_characters_with_unprintable_bytes_as_question_marks) {
    const std::string header = std::string("{'descr': '<f8',\x01 'fortran_order': False, \xe9'shape': (2, 3), 'x': '") +
                               std::string(60, 'y') + "'}";
    BOOST_TEST_REQUIRE(header.size() > 80u);
    const std::string message = npy_message(npy_image(header, std::string(48, '\0')));
    std::string expected = header.substr(0, 80);
    for (char& c : expected)
        if (c < 32 || c > 126) c = '?';
    BOOST_TEST(message == "load_npy: sample.npy: malformed header (expected a quoted string at offset 16) in \"" +
                              expected + "\"");
}

// Shapes as Python 2 wrote them, (2L, 3L), are read; versions 2.0 and 3.0 (a 4-byte header
// length) are read like 1.0, and a version-2 file too short for its 12-byte preamble is truncated.
BOOST_AUTO_TEST_CASE(python_2_longs_and_versions_2_and_3_are_read) {
    const Tensor<double> longs = parse_npy(npy_image("{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }",
                                                     std::string(48, '\0')));
    BOOST_TEST((longs.shape() == Shape{2, 3}));
    for (const unsigned char major : {2, 3}) {
        const Tensor<float> t = parse_npy<float>(
            npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::string(12, '\0'), major));
        BOOST_TEST((t.shape() == Shape{3}), "version " << int(major));
    }
    const std::string short_v2 = std::string("\x93NUMPY\x02\x00\x10\x00\x00", 11);
    BOOST_TEST(npy_message(short_v2) == "load_npy: sample.npy: truncated header");
}

// The image is NumPy's layout at every rank and in both dtypes: the data starts on a 64-byte
// boundary right after a header ending in '\n', whose length the preamble holds little-endian.
// (Rank 0 to 4 and both dtypes give headers of several lengths; one that forgot the newline in
// its padding would be one byte off.)
BOOST_AUTO_TEST_CASE(the_data_starts_on_a_64_byte_boundary_at_every_rank_and_dtype) {
    for (const Shape& shape : {Shape{}, Shape{7}, Shape{2, 3}, Shape{2, 1, 12}, Shape{1, 2, 3, 1000}}) {
        for (const NpyDtype dtype : {NpyDtype::float64, NpyDtype::float32}) {
            BOOST_TEST_CONTEXT(shape.to_string() << (dtype == NpyDtype::float64 ? " float64" : " float32")) {
                const std::string bytes = npy_bytes(Tensor<double>(shape, 0.5), dtype);
                const std::size_t length = static_cast<unsigned char>(bytes[8]) + 256u * static_cast<unsigned char>(bytes[9]);
                const std::size_t item = dtype == NpyDtype::float64 ? 8 : 4;
                BOOST_TEST((10 + length) % 64 == 0u);
                BOOST_TEST(bytes[10 + length - 1] == '\n');
                BOOST_TEST(bytes.size() == 10 + length + shape.size() * item);
                BOOST_TEST(parse_npy_header(bytes).data_offset == 10 + length);
            }
        }
    }
}

// ---- io/read_file.hpp -----------------------------------------------------------------------------

// A whole file's bytes, NULs and all, and an empty file as an empty string; a missing file is an
// io_error naming the reader, the file and the system's reason.
BOOST_AUTO_TEST_CASE(a_file_is_read_whole_and_a_missing_one_is_named) {
    const TempDir dir("read");
    // Appended rather than `std::string(...) + std::string(...)`: GCC 12 warns falsely
    // (-Warray-bounds) on that sum of two temporaries when it inlines it here.
    const std::string bytes = std::string("a\0b\r\n\xff", 6).append(100000, 'z');
    std::ofstream(dir.path / "binary", std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    std::ofstream(dir.path / "empty", std::ios::binary).close();
    BOOST_TEST(read_file_bytes(dir.path / "binary", "reader") == bytes);
    BOOST_TEST(read_file_bytes(dir.path / "empty", "reader").empty());
    const fs::path missing = dir.path / "missing";
    BOOST_TEST(testing::message_of<io_error>([&] { (void)read_file_bytes(missing, "the reader"); }) ==
               "the reader: cannot open '" + missing.string() + "': No such file or directory");
}

// ---- io/format.hpp --------------------------------------------------------------------------------

// Without a precision an mp50 prints max_digits10 significant digits (53: cpp_bin_float_50's 168
// bits need them to read back), which read back to the same number; a precision up to 1000 is
// accepted, 1001 is a format error; a shape refuses any spec.
BOOST_AUTO_TEST_CASE(mp50_prints_max_digits10_digits_and_precisions_stop_at_1000) {
    BOOST_TEST(std::numeric_limits<mp50>::max_digits10 == 53);
    const mp50 third = mp50(1) / 3;
    const std::string text = fmt::format("{}", Tensor<mp50>::scalar(third));
    // "0." and 53 significant digits, the first 50 of them the decimal third's (the last few are
    // the binary value's own: 1/3 in 168 bits is not 1/3)
    BOOST_TEST(text.size() == 2u + 53u, text);
    BOOST_TEST(text.starts_with("0." + std::string(50, '3')), text);
    BOOST_TEST(mp50(text) == third);
    BOOST_TEST(tensor_text(Tensor<mp50>::scalar(third)) == text);
    BOOST_TEST(fmt::format("{:.1000}", Tensor<double>::scalar(0.5)) == "0.5");
    BOOST_CHECK_THROW((void)fmt::format(fmt::runtime("{:.1001}"), Tensor<double>::scalar(0.5)), fmt::format_error);
    // A shape takes no format spec at all.
    BOOST_TEST(fmt::format("{}", Shape{2, 3}) == "[2x3]");
    BOOST_CHECK_THROW((void)fmt::format(fmt::runtime("{:.3}"), Shape{2, 3}), fmt::format_error);
}

// ---- io/graphviz.hpp ------------------------------------------------------------------------------

// One node per value, its label the op, its label if any, its settings and its shape; one edge per
// op input, numbered by slot only when the op has several inputs: mul reading X in both slots has
// two edges from X, "0" and "1", sum's one edge has no number. Costs, when asked for, go on ops,
// not on leaves.
BOOST_AUTO_TEST_CASE(edges_are_numbered_by_slot_only_for_ops_of_several_inputs) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{1, 2}}), "X");
    const Var<double> C = tape.constant(Tensor<double>::matrix({{3, 4}}));
    const Var<double> square = mul(X, X);
    const Var<double> scaled = scale(square, 0.5).named("half");
    (void)sum(add(scaled, C));
    const std::string dot = to_dot(tape, DotOptions{.show_cost = true});
    BOOST_TEST_MESSAGE(dot);
    BOOST_TEST((dot_lines(dot, "n0 -> ") == std::vector<std::string>{"  n0 -> n2 [label=\"0\"];", "  n0 -> n2 [label=\"1\"];"}));
    BOOST_TEST((dot_lines(dot, "n3 -> ") == std::vector<std::string>{"  n3 -> n4 [label=\"0\"];"}));
    BOOST_TEST((dot_lines(dot, "n2 -> ") == std::vector<std::string>{"  n2 -> n3;"}));
    BOOST_TEST((dot_lines(dot, "n4 -> ") == std::vector<std::string>{"  n4 -> n5;"}));
    const NodeInfo scale_node = tape.info(scaled.index());
    BOOST_TEST_REQUIRE(!scale_node.settings.empty());
    BOOST_TEST(dot.find(fmt::format("n3 [label=\"scale half\\n{}\\n[1x2]\\n{} madds\"", scale_node.settings,
                                    scale_node.cost.forward_madds)) != std::string::npos);
    BOOST_TEST(dot.find("n2 [label=\"mul\\n[1x2]\\n") != std::string::npos);  // unlabelled: the op alone
    BOOST_TEST(dot.find("n0 [label=\"leaf X\\n[1x2]\", shape=box, style=filled") != std::string::npos);
    BOOST_TEST(dot.find("n1 [label=\"constant\\n[1x2]\", shape=box, style=dashed") != std::string::npos);
}

// dot_graph: the header, the node defaults, then each graph attribute on a line of its own, then
// the nodes in the order given; a label's quotes, backslashes and newlines escaped.
BOOST_AUTO_TEST_CASE(dot_graph_writes_attributes_after_the_header_and_nodes_in_order) {
    const std::string dot = dot_graph("g", {{7, "b \"q\"\nline", "shape=box", {}}, {3, "a\\", "shape=ellipse", {7, 7}}},
                                      "fontname=\"Courier\"", {"label=\"title\"", "labelloc=t"});
    BOOST_TEST(dot == "digraph \"g\" {\n  rankdir=TB;\n  node [fontname=\"Courier\"];\n  label=\"title\";\n  labelloc=t;\n"
                      "  n7 [label=\"b \\\"q\\\"\\nline\", shape=box];\n"
                      "  n3 [label=\"a\\\\\", shape=ellipse];\n  n7 -> n3 [label=\"0\"];\n  n7 -> n3 [label=\"1\"];\n}\n");
}

// ---- io/tape_file.hpp -----------------------------------------------------------------------------

// The file holds every node up to the output, in recorded order, one per line, and the output is
// its last node: a node J does not read but recorded before it (exp(X)) is saved, one recorded
// after J is not. The output of another tape is refused.
BOOST_AUTO_TEST_CASE(a_saved_tape_holds_every_node_up_to_its_output_and_none_after) {
    Tape<double> tape;
    const Var<double> X = tape.leaf(Tensor<double>::matrix({{0.5, 2}}), "X");
    const Var<double> C = tape.constant(Tensor<double>::matrix({{3, -1}}), "C");
    (void)exp(X);  // node 2: not read by J
    const Var<double> J = sum(mul(X, C));
    (void)exp(J);  // node 5: after J
    const std::string text = tape_file_text(tape, J);
    // The first line opens the document and the node list, the last closes them: one node on each
    // line between.
    std::vector<std::string> nodes;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) nodes.push_back(line);
    BOOST_TEST_REQUIRE(nodes.size() >= 2u);
    BOOST_TEST(nodes.back() == "]}");
    nodes.erase(nodes.begin());
    nodes.pop_back();
    BOOST_TEST_REQUIRE(nodes.size() == 5u, text);
    const std::vector<std::string> kinds{"\"node\":\"leaf\"", "\"node\":\"constant\"", "\"op\":\"exp\"", "\"op\":\"mul\"",
                                         "\"op\":\"sum\""};
    for (std::size_t i = 0; i < 5; ++i) BOOST_TEST(nodes[i].find(kinds[i]) != std::string::npos, nodes[i]);
    BOOST_TEST(text.find("\"output\": 4") != std::string::npos, text);
    Tape<double> loaded;
    const Var<double> back = parse_tape(text, "saved", loaded);
    BOOST_TEST(loaded.size() == 5u);
    BOOST_TEST(back.index() == 4u);
    BOOST_TEST(back.value()[0] == J.value()[0]);
    Tape<double> other;
    BOOST_TEST(testing::message_of<usage_error>([&] { (void)tape_file_text(other, J); }) ==
               "save_tape: the output is not a value of this tape");
}

// write_file_atomically: the file holds its old content or all of the new, never a part. A write
// that fails half way (the file size limit below the new content, SIGXFSZ ignored so that write()
// reports EFBIG) leaves the old content and no temporary file, and names the writer and the
// temporary file `<file>.partial-<pid>`; so does a temporary name that cannot be created (a
// directory already there); a write that succeeds replaces the content whole.
BOOST_AUTO_TEST_CASE(a_failed_atomic_write_leaves_the_old_content_and_no_partial_file) {
    const TempDir dir("atomic");
    const std::string file = (dir.path / "target.txt").string(), partial = fmt::format("{}.partial-{}", file, ::getpid());
    write_file_atomically(file, "old content", "writer");
    BOOST_TEST(file_text(file) == "old content");

    const std::string large(1 << 20, 'n');
    {
        rlimit saved{};
        BOOST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
        const auto previous = std::signal(SIGXFSZ, SIG_IGN);
        rlimit small = saved;
        small.rlim_cur = 4096;
        BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
        const std::string message = testing::message_of<io_error>([&] { write_file_atomically(file, large, "writer"); });
        ::setrlimit(RLIMIT_FSIZE, &saved);
        std::signal(SIGXFSZ, previous);
        BOOST_TEST(message == "writer: error writing '" + partial + "'");
    }
    BOOST_TEST(file_text(file) == "old content");
    BOOST_TEST(!fs::exists(partial));

    fs::create_directory(partial);
    const std::string blocked = testing::message_of<io_error>([&] { write_file_atomically(file, large, "writer"); });
    BOOST_TEST(blocked.rfind("writer: cannot create '" + partial + "': ", 0) == 0, blocked);
    BOOST_TEST(file_text(file) == "old content");
    fs::remove(partial);

    write_file_atomically(file, large, "writer");
    BOOST_TEST(file_text(file) == large);
    BOOST_TEST(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}
