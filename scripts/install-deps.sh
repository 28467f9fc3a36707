#!/usr/bin/env bash
# Installs what tapegrad needs to build and test on Debian (bookworm or later), from Debian's
# packages only. Uses sudo when not run as root.
set -euo pipefail
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  g++ cmake make libboost-dev libboost-test-dev libboost-program-options-dev libfmt-dev libeigen3-dev \
  fortunes gnuplot-nox >/dev/null
# fortunes: the char-LM's corpus (examples/train_charlm, its CTest runs); gnuplot-nox: its curve
# picture (optional at run time).
