#!/usr/bin/env bash
# Installs what is missing, builds (CUDA too when nvcc exists) and runs every
# test. GPU tests report "skipped" on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
