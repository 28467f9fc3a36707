#!/usr/bin/env python3
"""Self-test of scripts/mutate's mutant generation (no build, no test run): short C++ snippets written
to a temporary directory, and the mutants each kind makes of them, the expected ones and none of the
obviously wrong ones. Standard library only:

    python3 scripts/test_mutate.py        (or: python3 -m unittest scripts/test_mutate.py -v)
"""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mutate")
_loader = importlib.machinery.SourceFileLoader("mutate", SCRIPT)
_spec = importlib.util.spec_from_loader("mutate", _loader)
mutate = importlib.util.module_from_spec(_spec)
_loader.exec_module(mutate)

OLD_KINDS = ("arithmetic", "comparison", "logical", "constant", "statement", "branch")


class Snippets(unittest.TestCase):
    """Each test writes its files under a fresh directory (the repository root for include lookup)."""

    def setUp(self):
        self.directory = tempfile.TemporaryDirectory(prefix="test-mutate-")
        self.root = self.directory.name

    def tearDown(self):
        self.directory.cleanup()

    def write(self, name, text):
        path = os.path.join(self.root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))
        return path

    def mutants(self, text, kind, name="main.cpp"):
        path = self.write(name, text)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        found = mutate.generate(source, (kind,), path, self.root)
        self.assertTrue(all(m.kind == kind for m in found))
        return source, found

    def changes(self, source, found):
        """Each mutant as (the text it replaces, its replacement, the line it is on once applied)."""
        result = []
        for m in found:
            applied = m.apply(source)
            start = applied.rfind("\n", 0, m.start) + 1
            end = applied.find("\n", m.start + len(m.new))
            result.append((m.old, m.new, applied[start:end if end >= 0 else len(applied)].strip()))
        return result

    # ---- identifier ------------------------------------------------------------------------------

    def test_identifier_swaps_a_use_for_a_name_of_the_same_type_declared_before_it(self):
        source, found = self.mutants("""
            double f(std::size_t a, std::size_t b, double x) {
                const std::size_t c = a + 1;
                int i = 0;
                std::size_t d = c;
                return x * double(a + b + d) + i;
            }
        """, "identifier")
        lines = self.changes(source, found)
        self.assertIn(("a", "b", "const std::size_t c = b + 1;"), lines)
        self.assertNotIn("c", [new for old, new, line in lines if line.startswith("const std::size_t c =")],
                         "c is not visible in its own initializer")
        returned = sorted((old, new) for old, new, line in lines if line.startswith("return"))
        self.assertEqual(returned, [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("d", "b"), ("d", "c")],
                         "at most 2 a use, the nearest declared first")
        for old, new, _ in lines:  # never across types: x is the only double, i the only int
            self.assertNotIn(old, ("x", "i"))
            self.assertNotIn(new, ("x", "i"))

    def test_identifier_leaves_declarations_and_members_of_other_types_alone(self):
        source, found = self.mutants("""
            struct Dims {
                std::size_t Tq, Tk;
                double scale;
            };
            std::size_t g(const Dims& dims, std::size_t n) {
                std::size_t m = n;
                return dims.Tq * 2 + dims.Tk + std::size_t(dims.scale) + m;
            }
        """, "identifier")
        declared = {source.index("dims,"), source.index("n) {"), source.index("m = n")}
        self.assertFalse(declared & {m.start for m in found}, "a declaration is never swapped")
        members = sorted((m.old, m.new) for m in found if source[m.start - 1] == ".")
        self.assertEqual(members, [("Tk", "Tq"), ("Tq", "Tk")], "Tq <-> Tk only; scale is a double")
        uses = [(m.old, m.new) for m in found if source[m.start - 1] != "."]
        self.assertEqual(uses, [("m", "n")])  # `m = n`'s n is before m exists; `+ m` -> n

    def test_identifier_leaves_a_declaration_it_does_not_parse_alone(self):
        source, found = self.mutants("""
            int s(int a, int b) {
                std::size_t c = a, d = b;
                auto less = [](const Box& x, const Box& y) { return x.v < y.v; };
                if (b) {
                    auto a = 5;
                    Box<int> b = {};
                    std::size_t e = 1, c = 2;
                    return a + b.v;
                }
                return a + b;
            }
        """, "identifier")
        self.assertNotIn(source.index("a = 5"), [m.start for m in found], "`auto a` declares, it does not use")
        for declared in ("d = b", "x, const", "y) {", "c = 2"):
            self.assertNotIn(source.index(declared), [m.start for m in found])
        self.assertIn("auto less = [](const Box& x, const Box& y) { return y.v < y.v; };",
                      [line for *_, line in self.changes(source, found)])
        self.assertNotIn(source.index("b = {}"), [m.start for m in found], "`Box<int> b` declares")
        self.assertIn("return b + b;", [line for *_, line in self.changes(source, found)])

    def test_identifier_respects_lambda_captures(self):
        source, found = self.mutants("""
            int h(int a, int b) {
                auto one = [a]() { return a; };
                auto all = [&]() { return a; };
                return one() + all();
            }
        """, "identifier")
        lines = [line for *_, line in self.changes(source, found)]
        self.assertEqual(lines, ["auto all = [&]() { return b; };"], "b is not captured by [a]")

    def test_identifier_respects_constness_and_loop_headers(self):
        source, found = self.mutants("""
            int h(int a, int b) {
                const int k = 1;
                int m = 0;
                m = a;
                for (int j = 0; j < b; ++j) m += j;
                std::vector<int> out;
                const std::vector<int> in{1};
                out.push_back(in[0]);
                return m + k;
            }
        """, "identifier")
        lines = self.changes(source, found)
        written = [line for old, new, line in lines if line.endswith("= a;") and not line.startswith("m =")]
        self.assertEqual(written, ["a = a;", "b = a;"], "an assigned name is never swapped for a const one")
        self.assertEqual([line for *_, line in lines if "push_back" in line], ["out.push_back(out[0]);"],
                         "nor one whose member is used")
        header = source.index("for (")
        inside = [m for m in found if header < m.start < source.index(")", header) and m.old == "j"]
        self.assertEqual(inside, [], "a loop's own variable in its header is left alone")
        self.assertNotIn("[a, b]", "".join(m.apply(source) for m in found))

    # ---- argument --------------------------------------------------------------------------------

    def test_argument_drops_a_last_argument_that_has_a_default(self):
        self.write("lib/more.hpp", """
            #pragma once
            int deeper(int x, int y = 0);
        """)
        self.write("lib/api.hpp", """
            #pragma once
            #include "lib/more.hpp"
            int scaled(int x, int factor = 2);
            int plain(int x, int y);
            int free_only(int x, int y = 0);
            struct Tape {
                int leaf(int v, const char* label = "");
                int mark(int v, int w);
            };
            struct Other {
                int mark(int v, int w = 0);
            };
        """)
        source, found = self.mutants("""
            #include "lib/api.hpp"
            #include <algorithm>
            static int local(int a, int b = 0) { return a + b; }
            int run(Tape& tape) {
                int u = scaled(1, 3) + plain(1, 2) + local(4, 5) + deeper(6, 7);
                u += tape.leaf(u, "x") + std::max(u, 2) + tape.mark(u, 1) + thing().free_only(u, 1);
                return u + scaled(2);
            }
        """, "argument")
        lines = self.changes(source, found)
        self.assertEqual([(old, new) for old, new, _ in lines],
                         [(", 3", ""), (", 5", ""), (", 7", ""), (', "x"', "")])
        self.assertIn("int u = scaled(1) + plain(1, 2) + local(4, 5) + deeper(6, 7);", [line for *_, line in lines])
        self.assertIn("u += tape.leaf(u) + std::max(u, 2) + tape.mark(u, 1) + thing().free_only(u, 1);",
                      [line for *_, line in lines])

    # ---- search ----------------------------------------------------------------------------------

    def test_search_narrows_find_and_the_predicates_to_the_first_element(self):
        source, found = self.mutants("""
            #include <algorithm>
            bool s(const std::vector<int>& v, std::vector<int>::iterator it) {
                // std::find(v.begin(), v.end(), 9) in a comment is not code
                const char* text = "std::find(v.begin(), v.end(), 9)";
                return std::find(v.begin(), v.end(), 3) != v.end() &&
                       std::any_of(v.begin(), v.end(), [](int x) { return x > 0; }) &&
                       std::find(it++, v.end(), 4) != v.end() && text;
            }
        """, "search")
        lines = self.changes(source, found)
        self.assertEqual([(old, new) for old, new, _ in lines], [
            ("v.end()", "(v.begin() == v.end() ? v.end() : std::next(v.begin()))"),
            ("v.end()", "(v.begin() == v.end() ? v.end() : std::next(v.begin()))"),
        ])
        self.assertEqual(lines[0][2], "return std::find(v.begin(), (v.begin() == v.end() ? v.end() : "
                                      "std::next(v.begin())), 3) != v.end() &&")

    # ---- loop ------------------------------------------------------------------------------------

    def test_loop_runs_a_counting_loop_once(self):
        source, found = self.mutants("""
            int l(int n, std::size_t first) {
                int total = 0;
                for (std::size_t k = first; k < n; ++k) total += 1;
                for (int k = n; k > 0; --k) total += 2;
                for (int k = 0; k < n && total < 9; ++k) total += 3;
                for (int k = 0; k != n; ++k) total += 4;
                return total;
            }
        """, "loop")
        self.assertEqual([(m.old, m.new) for m in found], [("k < n", "k < n && k < 1 + (first)")])

    # ---- initializer -----------------------------------------------------------------------------

    def test_initializer_drops_each_designator_and_a_typed_list_s_last_element(self):
        source, found = self.mutants("""
            struct Settings { int a = 0, b = 0, c = 0; };
            struct Point { int x, y, z; };
            int i() {
                Settings s{.a = 1, .b = 2, .c = 3};
                Settings one{.a = 1};
                Point p{1, 2, 3};
                std::vector<int> v{1, 2};
                auto q = std::pair<int, int>{1, 2};
                auto w = std::Made{1, 2};
                const char* text = "Point{1, 2}";
                return s.a + one.a + p.x + v[0] + q.first + Point{4, 5}.x + text[0];
            }
        """, "initializer")
        lines = [line for *_, line in self.changes(source, found)]
        self.assertEqual(lines, [
            "Settings s{.b = 2, .c = 3};",
            "Settings s{.a = 1, .c = 3};",
            "Settings s{.a = 1, .b = 2};",
            "Settings one{};",
            "Point p{1, 2};",
            "return s.a + one.a + p.x + v[0] + q.first + Point{4}.x + text[0];",
        ])
        for line in lines:
            for bad in (",,", "{,", ", }", ",}", "{ ,"):
                self.assertNotIn(bad, line)

    # ---- all kinds together ----------------------------------------------------------------------

    def test_ids_follow_file_order_and_the_old_kinds_alone_are_as_before(self):
        text = """
            int f(int a, int b) {
                if (a < b) a = b + 1;
                return std::max(a, b);
            }
        """
        path = self.write("all.cpp", text)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        everything = mutate.generate(source, mutate.KINDS, path, self.root)
        self.assertEqual([m.id for m in everything], list(range(1, len(everything) + 1)))
        self.assertEqual([m.start for m in everything], sorted(m.start for m in everything))
        old = mutate.generate(source, OLD_KINDS, path, self.root)
        self.assertEqual([m.id for m in old], list(range(1, len(old) + 1)))
        self.assertEqual([(m.kind, m.start, m.new) for m in old],
                         [(m.kind, m.start, m.new) for m in everything if m.kind in OLD_KINDS])
        self.assertEqual([(m.id, m.describe()) for m in mutate.generate(source)],
                         [(m.id, m.describe()) for m in mutate.generate(source, mutate.KINDS)])

    def test_the_command_line_lists_the_kinds_asked_for_and_refuses_unknown_ones(self):
        path = self.write("cli.cpp", """
            int f(int a, int b) { return a + b; }
        """)
        listed = subprocess.run([sys.executable, SCRIPT, path, "--list", "--kinds", "identifier"],
                                capture_output=True, text=True)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(listed.stdout.splitlines(), ["#1 line 2: identifier: 'a' -> 'b'",
                                                      "#2 line 2: identifier: 'b' -> 'a'"])
        self.assertIn("2 of 2 mutants (identifier 2)", listed.stderr)
        wrong = subprocess.run([sys.executable, SCRIPT, path, "--list", "--kinds", "identifier,swap"],
                               capture_output=True, text=True)
        self.assertNotEqual(wrong.returncode, 0)
        self.assertIn("unknown kind swap", wrong.stderr)


if __name__ == "__main__":
    unittest.main()
