// The docs' coverage of the library's ops. docs/ops.md and docs/tape-file.md's op table are
// generated from the ops' declarations (tools/op_docs.cpp; op_docs_are_current holds the committed
// files to it), so no op needs a hand-written row: here, every op struct of LibraryOps (ops/all.hpp)
// has its section in docs/ops.md and its row in docs/tape-file.md's table (a stale file names the op
// that lacks one), and every op struct declared under ops/ (a struct whose first member is its
// `name`) is in LibraryOps, so an op left out of the list is named too. And the rules of
// tests/op_rules.hpp are exactly the public functions docs/ops.md gives (each `Var<T> name(`
// declaration of a header) and the ops' names (sum(X, axis) is op sum_axis). Fault controls: a name
// no op has is found missing from both docs, an op struct in a header of a scratch folder is found
// missing from the list, and a documented function without a rule is named.
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

// docs/ops.md has a section "## name" for the op.
bool ops_reference_has_section(const std::string& path, std::string_view op) {
    std::ifstream file(path);
    if (!file) throw std::runtime_error("cannot read " + path);
    for (std::string line; std::getline(file, line);)
        if (line == fmt::format("## {}", op)) return true;
    return false;
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

// The public functions docs/ops.md declares (`Var<T> name(` at the start of a line of its code blocks),
// and the ops it names in its sections ("## name").
std::set<std::string> documented_functions(const std::string& path) {
    std::ifstream file(path);
    if (!file) throw std::runtime_error("cannot read " + path);
    static const std::regex function(R"re(^Var<T> ([a-z0-9_]+)\()re"), section(R"re(^## ([a-z0-9_]+)$)re");
    std::set<std::string> names;
    for (std::string line; std::getline(file, line);) {
        std::smatch m;
        if (std::regex_search(line, m, function) || std::regex_search(line, m, section)) names.insert(m[1].str());
    }
    return names;
}

std::set<std::string> rule_names() {
    return {testing::rules::Rules::names.begin(), testing::rules::Rules::names.end()};
}

const std::string ops_reference = TAPEGRAD_SOURCE_DIR "/docs/ops.md";

}  // namespace

BOOST_AUTO_TEST_CASE(every_library_op_has_its_section_in_the_reference_and_its_row_in_the_tape_file_docs) {
    const std::vector<std::string> tape_file = first_cells(TAPEGRAD_SOURCE_DIR "/docs/tape-file.md");
    BOOST_TEST(LibraryOps::size >= 44u);  // the list the checks below walk is the library's
    for (const std::string_view op : LibraryOps::names) {
        BOOST_TEST(ops_reference_has_section(ops_reference, op), "op '" << op << "' has no section in docs/ops.md");
        BOOST_TEST(tape_file_has_row(tape_file, op), "op '" << op << "' has no row in docs/tape-file.md");
    }
}

BOOST_AUTO_TEST_CASE(an_op_without_rows_is_found_missing) {
    const std::vector<std::string> tape_file = first_cells(TAPEGRAD_SOURCE_DIR "/docs/tape-file.md");
    BOOST_TEST(!ops_reference_has_section(ops_reference, "no_such_op"));
    BOOST_TEST(!tape_file_has_row(tape_file, "no_such_op"));
    BOOST_TEST(!ops_reference_has_section(ops_reference, "sum_ax"));  // a prefix of a name is not the name
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
// public function through its rule: every function docs/ops.md declares and every op has one, and
// every rule is a documented function or op.
BOOST_AUTO_TEST_CASE(every_public_function_of_the_reference_has_a_rule_in_op_rules) {
    const std::set<std::string> documented = documented_functions(ops_reference);
    BOOST_TEST(documented.size() >= 46u);
    const std::string without_rule = testing::missing_names(documented, rule_names());
    BOOST_TEST(without_rule.empty(), "functions and ops of docs/ops.md without a rule in tests/op_rules.hpp: "
                                         << without_rule);
    const std::string undocumented = testing::missing_names(rule_names(), documented);
    BOOST_TEST(undocumented.empty(), "rules of tests/op_rules.hpp whose function docs/ops.md lacks: " << undocumented);
}

// Fault control: a function declared in the reference without a rule is named; a declaration not at
// the start of a line (a call in prose), or a heading of another level, is not one.
BOOST_AUTO_TEST_CASE(a_documented_function_without_a_rule_is_found) {
    const std::filesystem::path reference =
        std::filesystem::temp_directory_path() / fmt::format("ops_{}.md", ::getpid());
    std::ofstream(reference) << "## exp\n```cpp\nVar<T> exp(const Var<T>& A)\nVar<T> frobnicate(const Var<T>& A,\n"
                                "                  int n)\n```\n## sum_axis\ncalls `Var<T> gadget(A)`\n### widget\n";
    const std::set<std::string> documented = documented_functions(reference.string());
    std::filesystem::remove(reference);
    BOOST_TEST(fmt::format("{}", fmt::join(documented, " ")) == "exp frobnicate sum_axis");
    BOOST_TEST(testing::missing_names(documented, rule_names()) == "frobnicate");
}
