#!/usr/bin/env bash
# Checks that includes between the library's folders run one way only (ARCHITECTURE.md):
#   autodiff/ includes only autodiff/;  io/ only autodiff/ and io/;  check/ only autodiff/, io/, check/;
#   ops/ only autodiff/ and ops/;  models/ only autodiff/, io/ (checkpoints), ops/ and models/ (never check/);
#   src/cpu/ (the compiled kernels, whose tables serve autodiff/cpu.hpp and ops/fast/kernels.hpp) only
#   autodiff/, ops/ and src/cpu/.
# The other compiled sources follow the rule of the area whose headers they implement: src/autodiff/
# autodiff's, src/check/ check's, src/io/ io's and its own private headers (src/io/tape_document.hpp,
# never installed); src/instances/ ops' and models' (the ops' instances and attention's, and the
# registry of ops, which holds every op of LibraryOps); src/models/ models'.
# Prints each include that breaks a rule; exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
allowed() {  # allowed FOLDER -> regex of the folders its project includes may name
  case "$1" in
    autodiff | src/autodiff) echo '^autodiff/' ;;
    io) echo '^(autodiff|io)/' ;;
    src/io) echo '^(autodiff|io|src/io)/' ;;
    check | src/check) echo '^(autodiff|io|check)/' ;;
    ops) echo '^(autodiff|ops)/' ;;
    src/instances) echo '^(autodiff|ops|models)/' ;;
    models | src/models) echo '^(autodiff|io|ops|models)/' ;;
    src/cpu) echo '^(autodiff|ops|src/cpu)/' ;;
  esac
}
broken=0
for folder in autodiff io check ops models src/cpu src/autodiff src/check src/io src/instances src/models; do
  rule="$(allowed "$folder")"
  while IFS= read -r line; do
    file="${line%%:*}"
    target="$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")"
    if ! grep -Eq "$rule" <<<"$target"; then
      echo "$file includes $target: $folder may include only ${rule}"
      broken=1
    fi
  done < <(grep -rn '#include "' "$folder" --include='*.hpp' --include='*.cpp' || true)
done
if [ "$broken" -eq 0 ]; then
  echo "includes run one way: autodiff <- io <- check; autodiff <- ops <- models (<- io); autodiff, ops <- src/cpu"
fi
exit "$broken"
