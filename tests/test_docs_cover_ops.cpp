// The docs' coverage of the library's ops: every op struct of LibraryOps (ops/all.hpp) has its row in
// the README's op tables (a row whose first cell names its function, `name(...)`, or says `(op
// `name`)` where the function is spelt otherwise, as sum(X, axis) for sum_axis) and in
// docs/tape-file.md's table of ops and settings (its name in backticks in a row's first cell). The
// list is the library's own, so a new op without its rows fails here, named. And every op struct
// declared under ops/ (a struct whose first member is its `name`) is in LibraryOps, so an op left
// out of the list is named here too. Fault controls: a name no op has is found missing from both
// docs, and an op struct in a header of a scratch folder is found missing from the list.
#define BOOST_TEST_MODULE docs_cover_ops
#include "op_rules.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unistd.h>
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

// The op structs the headers of `folder` declare, by name, with their files: each
// `struct X {` whose next line is `static constexpr std::string_view name = "...";`.
std::map<std::string, std::string> declared_ops(const std::filesystem::path& folder) {
    static const std::regex op_struct(R"re(\nstruct \w+ \{\n +static constexpr std::string_view name = "([^"]+)";)re");
    std::map<std::string, std::string> ops;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(folder)) {
        if (entry.path().extension() != ".hpp") continue;
        std::ifstream file(entry.path());
        std::stringstream text;
        text << file.rdbuf();
        const std::string source = text.str();
        for (auto m = std::sregex_iterator(source.begin(), source.end(), op_struct); m != std::sregex_iterator(); ++m) {
            ops.emplace((*m)[1].str(), entry.path().filename().string());
        }
    }
    return ops;
}

// The declared ops that LibraryOps does not list, as "name (file)".
std::string unlisted(const std::map<std::string, std::string>& declared) {
    std::string names;
    for (const auto& [name, file] : declared) {
        const bool listed = std::find(LibraryOps::names.begin(), LibraryOps::names.end(), name) != LibraryOps::names.end();
        if (!listed) names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", name, file);
    }
    return names;
}

// The public functions the README's op tables name (the section "### Ops (" up to the next "### "):
// each `name(` in a row's first cell, or the op a cell names with "(op `name`)" (sum(X, axis) is
// sum_axis).
std::set<std::string> readme_functions(const std::string& path) {
    std::ifstream file(path);
    if (!file) throw std::runtime_error("cannot read " + path);
    static const std::regex function(R"re(`([a-z0-9_]+)\()re"), op_named(R"re(\(op `([a-z0-9_]+)`\))re");
    std::set<std::string> names;
    bool in_ops = false;
    for (std::string line; std::getline(file, line);) {
        if (line.starts_with("### ")) in_ops = line.starts_with("### Ops (");
        if (!in_ops || !line.starts_with("| ")) continue;
        const std::string cell = line.substr(2, line.find(" | ", 1) - 2);
        std::smatch m;
        if (std::regex_search(cell, m, op_named)) {
            names.insert(m[1].str());
            continue;
        }
        for (auto it = std::sregex_iterator(cell.begin(), cell.end(), function); it != std::sregex_iterator(); ++it)
            names.insert((*it)[1].str());
    }
    return names;
}

std::set<std::string> rule_names() {
    return {testing::rules::Rules::names.begin(), testing::rules::Rules::names.end()};
}

struct Docs {
    std::vector<std::string> readme = first_cells(TAPEGRAD_SOURCE_DIR "/README.md");
    std::vector<std::string> tape_file = first_cells(TAPEGRAD_SOURCE_DIR "/docs/tape-file.md");
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_library_op_has_its_rows_in_the_readme_and_the_tape_file_docs) {
    const auto [readme, tape_file] = Docs{};
    BOOST_TEST(LibraryOps::size >= 43u);  // the list the checks below walk is the library's
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

BOOST_AUTO_TEST_CASE(every_op_struct_under_ops_is_in_library_ops) {
    const auto declared = declared_ops(TAPEGRAD_SOURCE_DIR "/ops");
    BOOST_TEST(declared.size() == LibraryOps::size, "op structs under ops/ and in LibraryOps differ in number");
    const std::string missing = unlisted(declared);
    BOOST_TEST(missing.empty(), "op structs under ops/ missing from LibraryOps (ops/all.hpp): " << missing);
}

BOOST_AUTO_TEST_CASE(an_op_struct_left_out_of_library_ops_is_found) {
    const std::filesystem::path folder = std::filesystem::temp_directory_path() / fmt::format("ops_{}", ::getpid());
    std::filesystem::create_directories(folder);
    std::ofstream(folder / "orphan.hpp") << "#pragma once\nstruct Orphan {\n    static constexpr std::string_view name = "
                                            "\"orphan\";\n};\nstruct Scale {\n    static constexpr std::string_view "
                                            "name = \"scale\";\n};\n";
    const auto declared = declared_ops(folder);
    std::filesystem::remove_all(folder);
    BOOST_TEST(declared.size() == 2u);
    BOOST_TEST(unlisted(declared) == "orphan (orphan.hpp)");
}

// The random graphs, the second-order rows and the graph of every op (tests/op_rules.hpp) draw each
// public function through its rule: every function of the README's op tables has one, and every
// rule is a documented function.
BOOST_AUTO_TEST_CASE(every_public_function_of_the_readme_has_a_rule_in_op_rules) {
    const std::set<std::string> documented = readme_functions(TAPEGRAD_SOURCE_DIR "/README.md");
    BOOST_TEST(documented.size() >= 41u);
    const std::string without_rule = testing::missing_names(documented, rule_names());
    BOOST_TEST(without_rule.empty(), "functions of README.md's op tables without a rule in tests/op_rules.hpp: "
                                         << without_rule);
    const std::string undocumented = testing::missing_names(rule_names(), documented);
    BOOST_TEST(undocumented.empty(), "rules of tests/op_rules.hpp whose function README.md's op tables lack: "
                                         << undocumented);
}

// Fault control: a function documented in the op tables without a rule is named; the same name
// outside the op section, or in a row's later cells, is not a function of the tables.
BOOST_AUTO_TEST_CASE(a_documented_function_without_a_rule_is_found) {
    const std::filesystem::path readme =
        std::filesystem::temp_directory_path() / fmt::format("readme_{}.md", ::getpid());
    std::ofstream(readme) << "### Engine\n| `set_threads(n)` | x |\n### Ops (`ops/`)\n| `exp(A)` | `frobnicate(A)` "
                             "|\n| `frobnicate(A)`, `neg(A)` | y |\n| `sum(X, axis)` (op `sum_axis`) | z |\n### Checker\n"
                             "| `gadget(A)` | w |\n";
    const std::set<std::string> documented = readme_functions(readme.string());
    std::filesystem::remove(readme);
    BOOST_TEST(fmt::format("{}", fmt::join(documented, " ")) == "exp frobnicate neg sum_axis");
    BOOST_TEST(testing::missing_names(documented, rule_names()) == "frobnicate");
}
