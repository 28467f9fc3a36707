"""Runs the spec's Python reference program and examples/seed_walkthrough, and checks that they
print the same labels in the same order and the same values to 1e-12; the finite-difference
error lines differ by design (double differences there, 50-digit differences here), so for those
the walkthrough's value must be at most 1e-20.

usage: compare_walkthrough.py SEED_WALKTHROUGH_BINARY SPEC_REFERENCE_PY
"""
import re
import subprocess
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
LABEL = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
FD_LABELS = {"QKV_finite_difference_max_error", "shared_X_finite_difference_max_error"}


def run(command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()


def main():
    ours = run([sys.argv[1]])
    reference = run([sys.executable, sys.argv[2]])
    if len(ours) != len(reference):
        sys.exit(f"line count differs: {len(ours)} vs {len(reference)}")
    for mine, theirs in zip(ours, reference):
        labels = LABEL.findall(re.sub(NUMBER, " ", mine))
        if labels != LABEL.findall(re.sub(NUMBER, " ", theirs)):
            sys.exit(f"labels differ:\n  tapegrad:  {mine}\n  reference: {theirs}")
        values = [float(x) for x in NUMBER.findall(mine)]
        expected = [float(x) for x in NUMBER.findall(theirs)]
        if labels and labels[0] in FD_LABELS:
            if not all(v <= 1e-20 for v in values):
                sys.exit(f"50-digit finite-difference error above 1e-20: {mine}")
            continue
        if len(values) != len(expected) or any(abs(v - e) > 1e-12 for v, e in zip(values, expected)):
            sys.exit(f"values differ:\n  tapegrad:  {mine}\n  reference: {theirs}")
    print(f"{len(ours)} lines agree with the spec's reference program")


if __name__ == "__main__":
    main()
