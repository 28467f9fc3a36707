#!/usr/bin/env python3
"""Writes the two large saved tapes the loader's speed and memory figures are measured on
(docs/performance.md, "Loading saved tapes"): DIR/declares_2_holds_N.json, a leaf declaring shape [2]
that holds N values (refused: too many values), and DIR/valid_N.json, a leaf of shape [N] summed (a
valid tape). N = 10,000,000 by default, about 90 MB each. Usage:
    scripts/large-tape-files.py DIR [N]
then, for each file:  /usr/bin/time -v build/tools/tapegrad-check --tape FILE
(the 'Maximum resident set size' and 'Elapsed' lines are the figures)."""
import os
import sys


def write_tape(path, declared, count):
    # values as save_tape writes them (hexadecimal floating point: 3 is "1.8p+1")
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        f.write('{"format": "tapegrad-tape", "version": 1, "scalar": "float64", "output": 1, "nodes": [\n')
        f.write('{"node":"leaf","label":"X","shape":[%d],"values":[' % declared)
        chunk = ",".join(['"1.8p+1"'] * 100000)
        written = 0
        while written < count:
            n = min(100000, count - written)
            f.write(("," if written else "") + (chunk if n == 100000 else ",".join(['"1.8p+1"'] * n)))
            written += n
        f.write(']},\n{"node":"op","op":"sum","inputs":[0],"shape":[]}\n]}\n')
    os.replace(tmp, path)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    directory = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) == 3 else 10_000_000
    os.makedirs(directory, exist_ok=True)
    write_tape(os.path.join(directory, "declares_2_holds_%d.json" % count), 2, count)
    write_tape(os.path.join(directory, "valid_%d.json" % count), count, count)


main()
