#!/usr/bin/env bash
# Fuzzes the .npy reader with libFuzzer (+ ASan/UBSan) for the given number of seconds (default 60),
# starting from the seed files in fuzz/corpus; new inputs it finds go to <build>/fuzz-corpus, and a
# crashing input to <build>/crash-*. Fails (exit 1) on a crash, a leak or a sanitizer report.
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
cmake --build "$build" --target fuzz_npy -j"$(nproc)"
mkdir -p "$build/fuzz-corpus"
"$build/fuzz/fuzz_npy" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$build/" "$build/fuzz-corpus" fuzz/corpus
