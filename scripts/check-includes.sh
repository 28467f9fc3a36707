#!/usr/bin/env bash
# Checks that includes between the library's folders run one way only (ARCHITECTURE.md):
#   autodiff/ includes only autodiff/;  io/ only autodiff/ and io/ (io/tape_file.cpp, the loader of
#   saved tapes compiled in the library, also ops/: it records each loaded node through its op's
#   public function);  check/ only autodiff/, io/, check/;
#   ops/ only autodiff/ and ops/;  models/ only autodiff/, ops/ and models/ (never check/ or io/);
#   src/ (the compiled kernels) only autodiff/ and src/.
# Prints each include that breaks a rule; exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
allowed() {  # allowed FOLDER -> regex of the folders its project includes may name
  case "$1" in
    autodiff) echo '^autodiff/' ;;
    io) echo '^(autodiff|io)/' ;;
    check) echo '^(autodiff|io|check)/' ;;
    ops) echo '^(autodiff|ops)/' ;;
    models) echo '^(autodiff|ops|models)/' ;;
    src) echo '^(autodiff|src)/' ;;
  esac
}
broken=0
for folder in autodiff io check ops models src; do
  rule="$(allowed "$folder")"
  while IFS= read -r line; do
    file="${line%%:*}"
    target="$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$line")"
    file_rule="$rule"
    if [ "$file" = io/tape_file.cpp ]; then file_rule='^(autodiff|io|ops)/'; fi
    if ! grep -Eq "$file_rule" <<<"$target"; then
      echo "$file includes $target: $folder/ may include only ${rule}"
      broken=1
    fi
  done < <(grep -rn '#include "' "$folder" --include='*.hpp' --include='*.cpp' || true)
done
if [ "$broken" -eq 0 ]; then echo "includes run one way: autodiff <- io <- check; autodiff <- ops <- models; autodiff <- src"; fi
exit "$broken"
