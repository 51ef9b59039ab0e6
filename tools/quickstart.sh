#!/usr/bin/env bash
# Fresh Debian machine -> a tiny GPT trained on the CPU in a few minutes.
# Installs what is missing, builds, prepares data/cache/quickstart, trains.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
data/prepare.sh quickstart
build/qattn train configs/quickstart.json "$@"
