#!/usr/bin/env python3
"""Compiles every C++ block of the README, extracted from it, so that the manual's code cannot drift
from the library (CTest: readme_code_blocks_compile).

Each ```cpp block must follow a marker line `<!-- readme-block: KIND [PRELUDE] -->`:
  program  statements: the block's leading #include/#define lines go to the top, its leading
           `using namespace` lines after the prelude, and the rest into `int main() { ... }`;
  file     a whole file (or file-scope code): compiled as it stands after its leading # lines;
  PRELUDE  tests/readme/PRELUDE.hpp, what the block assumes from the text around it (a recorded
           tape, the data it names): its part above the line `// ---- in main ----` at file scope,
           the part below at the start of main (program blocks only).
A block without a marker, an unknown kind or prelude, or a block that does not compile fails.

usage: compile_blocks.py README OUTPUT_DIR COMPILER [COMPILER FLAGS...]
"""
import pathlib
import re
import subprocess
import sys

MARKER = re.compile(r"<!--\s*readme-block:\s*(\w+)(?:\s+([\w-]+))?\s*-->")
MAIN_SPLIT = "// ---- in main ----"


def blocks(readme):
    """(line number, kind, prelude, code) for each ```cpp block; errors for unmarked ones."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    found, errors = [], []
    k = 0
    while k < len(lines):
        if lines[k].strip() != "```cpp":
            k += 1
            continue
        start = k
        end = next(j for j in range(k + 1, len(lines)) if lines[j].strip() == "```")
        marker = MARKER.fullmatch(lines[start - 1].strip()) if start > 0 else None
        if marker is None:
            errors.append(f"README.md:{start + 1}: a ```cpp block without a <!-- readme-block: KIND --> line before it")
        else:
            found.append((start + 1, marker.group(1), marker.group(2), lines[start + 1:end]))
        k = end + 1
    return found, errors


def prelude_parts(name):
    if name is None:
        return "", ""
    path = pathlib.Path(__file__).with_name(f"{name}.hpp")
    text = path.read_text(encoding="utf-8")
    top, _, body = text.partition(MAIN_SPLIT)
    return top, body


def leading(code, predicate):
    """The block's first lines that satisfy predicate (blank lines between them too), and the rest."""
    k = 0
    while k < len(code) and (predicate(code[k].strip()) or not code[k].strip()):
        k += 1
    return code[:k], code[k:]


def translation_unit(kind, prelude, code):
    top, body = prelude_parts(prelude)
    directives, rest = leading(code, lambda s: s.startswith("#"))
    if kind == "file":
        return "\n".join(directives + [top] + rest) + "\n"
    if kind == "program":
        usings, statements = leading(rest, lambda s: s.startswith("using namespace"))
        return "\n".join(directives + [top] + usings + ["int main() {", body] + statements + ["}"]) + "\n"
    raise ValueError(f"unknown kind '{kind}' (program or file)")


def main():
    readme, out_dir, compiler, flags = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
    out_dir.mkdir(parents=True, exist_ok=True)
    found, errors = blocks(readme)
    compiled = 0
    for line, kind, prelude, code in found:
        try:
            source = translation_unit(kind, prelude, code)
        except (ValueError, FileNotFoundError) as e:
            errors.append(f"README.md:{line}: {e}")
            continue
        path = out_dir / f"readme_block_line_{line}.cpp"
        path.write_text(source, encoding="utf-8")
        result = subprocess.run([compiler, "-std=c++20", "-fsyntax-only", *flags, str(path)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            errors.append(f"README.md:{line}: the block ({kind}) does not compile ({path}):\n{result.stderr[-4000:]}")
        else:
            compiled += 1
    for e in errors:
        print(e)
    print(f"README: {len(found)} C++ blocks, {compiled} compiled, {len(errors)} faults")
    print(f"{compiled} passed, {len(errors)} failed")
    return 0 if not errors and found else 1


if __name__ == "__main__":
    sys.exit(main())
