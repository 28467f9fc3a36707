#!/usr/bin/env bash
# Fuzzes the readers of files with libFuzzer (+ ASan/UBSan) for the given number of seconds, the
# three at once (default 60): the .npy reader from the seed files in fuzz/corpus, the saved-tape loader from those
# in fuzz/tape_corpus (valid tapes) and tests/data/tape_files (the valid spec tape and the malformed
# corpus), the safetensors reader from fuzz/safetensors_corpus; new inputs each finds go to
# <build>/fuzz-corpus-<target>, and a crashing input to
# <build>/crash-*. Fails (exit 1) on a crash, a leak or a sanitizer report.
# Needs clang++ with libFuzzer (Debian: clang-14 libclang-rt-14-dev).
#   fuzz/run.sh [seconds]               configures and builds build-fuzz (the library and the target)
#   fuzz/run.sh seconds BUILD_DIR       uses a tree already configured with Clang and
#                                       -DTAPEGRAD_BUILD_FUZZ=ON (.ci/run: its sanitizer tree)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
build="${2:-}"
if [ -z "$build" ]; then
  build=build-fuzz
  cxx="$(command -v clang++-14 || command -v clang++ || true)"
  if [ -z "$cxx" ]; then echo "fuzz/run.sh: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; fi
  cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTAPEGRAD_BUILD_FUZZ=ON \
    -DTAPEGRAD_BUILD_TESTS=OFF -DTAPEGRAD_BUILD_EXAMPLES=OFF -DTAPEGRAD_BUILD_TOOLS=OFF >/dev/null
fi
cmake --build "$build" --target fuzz_npy fuzz_tape_file fuzz_safetensors -j"$(nproc)"
run() {  # run TARGET MAX_LEN SEED_DIR...
  local target="$1" max_len="$2"
  shift 2
  mkdir -p "$build/fuzz-corpus-$target"
  "$build/fuzz/$target" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/" "$build/fuzz-corpus-$target" "$@"
}
# The three fuzz at once, each a process of its own (libFuzzer runs one thread), so that all the
# cores work: on two cores each gets two thirds of one for the given seconds. Each one's output goes
# to <build>/fuzz-<target>.log, printed whole when it fails, its final statistics when it passes.
pids=() targets=()
start() {  # start TARGET MAX_LEN SEED_DIR...
  run "$@" >"$build/fuzz-$1.log" 2>&1 &
  pids+=($!) targets+=("$1")
}
start fuzz_npy 4096 fuzz/corpus
# Saved tapes are text: a longer limit, so the seed tapes (a few kB) fit whole.
start fuzz_tape_file 16384 fuzz/tape_corpus tests/data/tape_files
start fuzz_safetensors 4096 fuzz/safetensors_corpus
status=0
for i in "${!pids[@]}"; do
  log="$build/fuzz-${targets[$i]}.log"
  if wait "${pids[$i]}"; then
    echo "fuzz/run.sh: ${targets[$i]} passed"
    grep '^stat::' "$log" || true
  else
    status=1
    echo "fuzz/run.sh: ${targets[$i]} FAILED; its output:"
    cat "$log"
  fi
done
exit "$status"
