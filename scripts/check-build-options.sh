#!/usr/bin/env bash
# Configures tapegrad with every on/off combination of TAPEGRAD_BUILD_TESTS, _EXAMPLES, _TOOLS and
# _BENCHMARKS, then with TAPEGRAD_WITH_MPI on and off (on needs Open MPI and Boost.MPI installed),
# and checks that each one generates, and that the targets which need another option's target are
# present exactly when it is (test_cli needs the tool). Every target compiles the same way in every
# combination, so together with the full build (all ON) this shows that each combination builds.
# The 18 configurations reconfigure one build tree, each giving every option explicitly, the way a
# user switches options in an existing tree: the compiler checks and the packages found are cached
# after the first (9 s for a fresh tree, 2-5 s for a reconfiguration), and a target left over from
# the previous combination would be caught.
set -euo pipefail
source_dir="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
build="$work/tree"
rm -rf "$build"
failures=0
for tests in ON OFF; do
  for examples in ON OFF; do
    for tools in ON OFF; do
      for benchmarks in ON OFF; do
        name="tests-${tests}_examples-${examples}_tools-${tools}_benchmarks-${benchmarks}"
        if ! cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTAPEGRAD_BUILD_TESTS=$tests \
             -DTAPEGRAD_BUILD_EXAMPLES=$examples -DTAPEGRAD_BUILD_TOOLS=$tools \
             -DTAPEGRAD_BUILD_BENCHMARKS=$benchmarks >"$work/$name.log" 2>&1; then
          echo "FAILED to configure: $name (see $work/$name.log)"; failures=$((failures + 1)); continue
        fi
        targets="$(cmake --build "$build" --target help)"
        has() { grep -q -- "\.\.\. $1\$" <<<"$targets"; }
        expect() {  # expect TARGET ON|OFF
          if { [ "$2" = ON ] && ! has "$1"; } || { [ "$2" = OFF ] && has "$1"; }; then
            echo "FAILED: $name: target $1 should be $([ "$2" = ON ] && echo present || echo absent)"
            failures=$((failures + 1))
          fi
        }
        expect test_tape "$tests"
        expect seed_walkthrough "$examples"
        expect tapegrad-attention "$tools"
        expect bench_attention "$benchmarks"
        if [ "$tests" = ON ] && [ "$tools" = ON ]; then expect test_cli ON; else expect test_cli OFF; fi
        echo "ok: $name"
      done
    done
  done
done
# MPI on and off (TAPEGRAD_WITH_MPI, everything else ON): the MPI tests exist only with it, the
# tool and the training example either way (they run in one process without MPI).
for mpi in ON OFF; do
  name="mpi-${mpi}"
  if ! cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTAPEGRAD_BUILD_TESTS=ON \
       -DTAPEGRAD_BUILD_EXAMPLES=ON -DTAPEGRAD_BUILD_TOOLS=ON -DTAPEGRAD_BUILD_BENCHMARKS=ON \
       -DTAPEGRAD_WITH_MPI=$mpi >"$work/$name.log" 2>&1; then
    echo "FAILED to configure: $name (see $work/$name.log)"; failures=$((failures + 1)); continue
  fi
  targets="$(cmake --build "$build" --target help)"
  has() { grep -q -- "\.\.\. $1\$" <<<"$targets"; }
  for target in tapegrad-check train_retrieval test_gradcheck; do
    has "$target" || { echo "FAILED: $name: target $target should be present"; failures=$((failures + 1)); }
  done
  if [ "$mpi" = ON ] && ! has test_distributed_check; then
    echo "FAILED: $name: target test_distributed_check should be present"; failures=$((failures + 1))
  fi
  if [ "$mpi" = OFF ] && has test_distributed_check; then
    echo "FAILED: $name: target test_distributed_check should be absent"; failures=$((failures + 1))
  fi
  echo "ok: $name"
done
echo "$((18 - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
