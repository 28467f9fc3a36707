#!/usr/bin/env python3
"""Lists the longest functions of C++ files (lines from the signature to the closing brace).

Used for the structure figures in ARCHITECTURE.md and closing notes:
    scripts/function-lengths.py autodiff/tape.hpp check/gradcheck.hpp
A function is a line that ends an argument list with '{' (not a control statement, lambda or
class); its length runs from its signature's first line to the matching closing brace.
"""
import re
import sys

CONTROL = re.compile(r"^\s*(\}\s*)?(if|for|while|switch|catch|else|do|try)\b")
SIGNATURE_END = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(->\s*[^{]+)?\{\s*(//.*)?$")


def functions(lines):
    found = []
    for start, line in enumerate(lines):
        if not SIGNATURE_END.search(line) or CONTROL.match(line) or re.search(r"\[[&=]?[\w&, ]*\]\s*\(", line):
            continue
        first = start
        while first > 0 and lines[first - 1].rstrip().endswith((",", "(")) and not lines[first - 1].strip().startswith("//"):
            first -= 1
        depth = 0
        for end in range(start, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            if depth <= 0:
                break
        name = re.search(r"([~\w:]+)\s*\(", lines[first])
        found.append((end - first + 1, name.group(1) if name else "?", first + 1))
    return found


for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    ranked = sorted(functions(lines), reverse=True)[:3]
    total = len(lines) - 1
    print(f"{path}: {total} lines; longest: " + ", ".join(f"{name} {n} (line {at})" for n, name, at in ranked))
