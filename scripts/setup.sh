#!/usr/bin/env bash
# The README's first command: installs the dependencies, builds everything in ./build, and runs
# the main example (the specification's walkthrough).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
./build/examples/seed_walkthrough
