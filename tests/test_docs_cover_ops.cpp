// The docs' coverage of the library's ops: every op struct of LibraryOps (ops/all.hpp) has its row in
// the README's op tables (a row whose first cell names its function, `name(...)`, or says `(op
// `name`)` where the function is spelt otherwise, as sum(X, axis) for sum_axis) and in
// docs/tape-file.md's table of ops and settings (its name in backticks in a row's first cell). The
// list is the library's own, so a new op without its rows fails here, named. Fault control: a name
// no op has is found missing from both.
#define BOOST_TEST_MODULE docs_cover_ops
#include "support.hpp"

#include <fmt/format.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace tapegrad;

namespace {

// The first cell of every table row ("| cell | ...") of the file.
std::vector<std::string> first_cells(const std::string& path) {
    std::ifstream file(path);
    if (!file) throw std::runtime_error("cannot read " + path);
    std::vector<std::string> cells;
    for (std::string line; std::getline(file, line);) {
        if (!line.starts_with("| ")) continue;
        const std::size_t end = line.find(" | ", 1);
        cells.push_back(line.substr(2, end == std::string::npos ? std::string::npos : end - 2));
    }
    return cells;
}

// (The needles are made with fmt: GCC 12 warns falsely, -Warray-bounds, on "`" + std::string(...).)
bool any_cell_holds(const std::vector<std::string>& cells, std::initializer_list<std::string> needles) {
    for (const std::string& cell : cells)
        for (const std::string& needle : needles)
            if (cell.find(needle) != std::string::npos) return true;
    return false;
}

bool readme_has_row(const std::vector<std::string>& cells, std::string_view op) {
    return any_cell_holds(cells, {fmt::format("`{}(", op), fmt::format("(op `{}`)", op)});
}

bool tape_file_has_row(const std::vector<std::string>& cells, std::string_view op) {
    return any_cell_holds(cells, {fmt::format("`{}`", op)});
}

struct Docs {
    std::vector<std::string> readme = first_cells(TAPEGRAD_SOURCE_DIR "/README.md");
    std::vector<std::string> tape_file = first_cells(TAPEGRAD_SOURCE_DIR "/docs/tape-file.md");
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_library_op_has_its_rows_in_the_readme_and_the_tape_file_docs) {
    const auto [readme, tape_file] = Docs{};
    BOOST_TEST(LibraryOps::size >= 39u);  // the list the checks below walk is the library's
    for (const std::string_view op : LibraryOps::names) {
        BOOST_TEST(readme_has_row(readme, op), "op '" << op << "' has no row in README.md's op tables");
        BOOST_TEST(tape_file_has_row(tape_file, op), "op '" << op << "' has no row in docs/tape-file.md");
    }
}

BOOST_AUTO_TEST_CASE(an_op_without_rows_is_found_missing) {
    const auto [readme, tape_file] = Docs{};
    BOOST_TEST(!readme_has_row(readme, "no_such_op"));
    BOOST_TEST(!tape_file_has_row(tape_file, "no_such_op"));
    BOOST_TEST(!readme_has_row(readme, "sum_ax"));  // a prefix of a name is not the name
    BOOST_TEST(!tape_file_has_row(tape_file, "sum_ax"));
}
