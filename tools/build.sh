#!/usr/bin/env bash
# Configures and builds qattn into build/ (the CUDA backend too when nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
