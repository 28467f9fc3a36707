"""Runs the spec's Python reference program and examples/seed_walkthrough, and checks that they
print the same labels in the same order and the same values to 1e-12; the finite-difference
error lines differ by design (double differences there, 50-digit differences here), so for those
the walkthrough's value must be at most 1e-20. The walkthrough's line of its own, the
certification of the shared-X gradient (printed when it is built with certified gradients), is
taken out before the comparison and held on its own: every derivative and every branch of X
certified, the relative bound at most 1e-40, both times printed.

usage: compare_walkthrough.py SEED_WALKTHROUGH_BINARY SPEC_REFERENCE_PY [--certified]
(--certified: the walkthrough was built with certified gradients, so its line must be there)
"""
import re
import subprocess
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
LABEL = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
FD_LABELS = {"QKV_finite_difference_max_error", "shared_X_finite_difference_max_error"}
CERTIFIED = re.compile(r"^shared_X_certified (\d+) of (\d+), branches_certified (\d+) of (\d+), relative_bound (\S+), "
                       r"certify_ms (\S+), finite_differences_ms (\S+)$")


def check_certified(line):
    match = CERTIFIED.match(line)
    if not match:
        sys.exit(f"malformed certification line: {line}")
    certified, total, bound = int(match[1]), int(match[2]), float(match[5])
    if total != 16 or certified != total or not bound <= 1e-40:
        sys.exit(f"the shared-X gradient is not certified to 1e-40 relative: {line}")
    # X (2x2) feeds Q, K and V: three branches of four elements, each certified on its own.
    branches_certified, branches = int(match[3]), int(match[4])
    if branches != 12 or branches_certified != branches:
        sys.exit(f"not every branch of X certified: {line}")
    # A bound of exactly 0 would claim the enclosures are points: the graph's softmax and 1/sqrt(2)
    # are irrational, so 50-digit intervals around them have width.
    if not bound > 0:
        sys.exit(f"a certified bound of 0 is not what 50-digit intervals give here: {line}")
    # Both times in milliseconds: 16 elements checked or certified at 50 digits take far more than
    # a microsecond (one 50-digit operation alone takes tens of nanoseconds).
    if not all(float(ms) >= 1e-3 for ms in (match[6], match[7])):
        sys.exit(f"a time below a microsecond is not in milliseconds: {line}")


def run(command):
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()


def main():
    ours = run([sys.argv[1]])
    certified_lines = [line for line in ours if line.startswith("shared_X_certified")]
    for line in certified_lines:
        check_certified(line)
    if "--certified" in sys.argv[3:] and len(certified_lines) != 1:
        sys.exit(f"expected one shared_X_certified line, found {len(certified_lines)}")
    ours = [line for line in ours if not line.startswith("shared_X_certified")]
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
