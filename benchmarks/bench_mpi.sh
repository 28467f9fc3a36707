#!/usr/bin/env bash
# Distributed check and data-parallel training: one process against `mpirun -np 2`, one thread
# each, alternating, REPEATS times each; prints every run, then best and median.
#   1. tapegrad-check --model multihead -T 16 -D 32 -H 4 (full check), with each rank's share and
#      time (--loads), and whether the reports are identical (the time taken aside);
#   2. train_retrieval STEPS steps (global batch 64) and its steps/s.
# Usage: benchmarks/bench_mpi.sh BUILD_DIR [REPEATS=3] [STEPS=200]
#   MPI_FLAGS adds mpirun options to every run, e.g. on a machine shared with other work
#   MPI_FLAGS="--bind-to none --mca mpi_yield_when_idle 1" (Open MPI binds each rank to one core
#   and spins while it waits, by default).
# The check's CPU lines are each rank's process CPU time while taking its share: on a shared
# machine they show the split of the work, which the wall clock (time spent waiting for a core
# included) does not.
# Build first, the documented way: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release &&
#   cmake --build build --target tapegrad-check train_retrieval
set -euo pipefail
build="${1:?usage: bench_mpi.sh BUILD_DIR [REPEATS] [STEPS]}"
repeats="${2:-3}"
steps="${3:-200}"
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out="$(mktemp -d)"
now() { date +%s.%N; }
stats() {  # stats NAME ORDER VALUES...: best (first after sort ORDER: -g times, -gr rates) and median
  local name="$1" order="$2"; shift 2
  printf '%s\n' "$@" | sort "$order" | awk -v n="$name" '{v[NR]=$1} END {m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2;
    printf "%-28s best %8.3f  median %8.3f  (%d runs)\n", n, v[1], m, NR}'
}
check=("$build/tools/tapegrad-check" --model multihead -T 16 -D 32 -H 4 --threads 1 --quiet --loads)
declare -a check1 check2 cpu1 cpu2 train1 train2
for ((r = 1; r <= repeats; r++)); do
  for np in 1 2; do
    start=$(now)
    mpirun ${MPI_FLAGS:-} --oversubscribe -np $np "${check[@]}" >"$out/report$np.txt" 2>"$out/loads$np.txt" || true
    seconds=$(echo "$(now) - $start" | bc -l)
    cpu=$(sed -n 's/.*CPU: mean [0-9.]* s, slowest \([0-9.]*\) s.*/\1/p' "$out/loads$np.txt")
    if [ $np = 1 ]; then check1+=("$seconds"); cpu1+=("$cpu"); else check2+=("$seconds"); cpu2+=("$cpu"); fi
    echo "check   np=$np run $r: $seconds s"; sed 's/^/        /' "$out/loads$np.txt"
  done
  # The reports must be the same text but for the seconds.
  if diff <(sed 's/; [0-9.]* s$//' "$out/report1.txt") <(sed 's/; [0-9.]* s$//' "$out/report2.txt") >/dev/null; then
    echo "        reports identical: yes"
  else
    echo "        reports identical: NO"; diff "$out/report1.txt" "$out/report2.txt" || true
  fi
  for np in 1 2; do
    start=$(now)
    mpirun ${MPI_FLAGS:-} --oversubscribe -np $np "$build/examples/train_retrieval" "$steps" composed 1 >"$out/train$np.txt" 2>&1 || true
    seconds=$(echo "$(now) - $start" | bc -l)
    rate=$(sed -n 's/.* \([0-9.]*\) steps\/s$/\1/p' "$out/train$np.txt")
    if [ $np = 1 ]; then train1+=("$rate"); else train2+=("$rate"); fi
    echo "train   np=$np run $r: $rate steps/s (training loop), $seconds s in all"
  done
done
head -1 "$out/report1.txt"
stats "check, 1 process (s)" -g "${check1[@]}"
stats "check, mpirun -np 2 (s)" -g "${check2[@]}"
stats "check CPU, 1 process (s)" -g "${cpu1[@]}"
stats "check CPU, slowest rank (s)" -g "${cpu2[@]}"
stats "train, 1 process (steps/s)" -gr "${train1[@]}"
stats "train, mpirun -np 2 (steps/s)" -gr "${train2[@]}"
