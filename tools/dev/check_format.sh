#!/usr/bin/env bash
# The format check, run by CTest as the test `format` (tools/test.sh, CI): the
# C++ and CUDA files under FORMATTED must be what clang-format-14 makes of them
# with the repository's .clang-format. Prints each place that differs and fails.
# FORMATTED lists what has been formatted so far; to add a file or folder,
# format it (clang-format-14 -i FILE) and list it here.
# Exits 77 (CTest: skipped) where clang-format-14 is not installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
FORMATTED=(
  kernels/attention
  tests/gpu/attention_harness.cpp
  tests/gpu/attention_harness.hpp
  tests/gpu/gpu_test_util.hpp
  tests/gpu/test_attention.cpp
  tests/gpu/test_attention_kinterval.cpp
  tests/gpu/test_attention_phases.cpp
  tests/gpu/test_attention_sage.cpp
  tools/dev
)
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
if ! command -v "$CLANG_FORMAT" > /dev/null; then
  echo "SKIP: $CLANG_FORMAT is not installed (Debian: apt-get install clang-format-14)"
  exit 77
fi
mapfile -t files < <(find "${FORMATTED[@]}" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \
  -o -name '*.cu' -o -name '*.cuh' \) | sort)
if ! "$CLANG_FORMAT" --dry-run --Werror "${files[@]}"; then
  echo "format: the files above differ from $CLANG_FORMAT's output; run: $CLANG_FORMAT -i FILE" >&2
  exit 1
fi
echo "format: ${#files[@]} files as $CLANG_FORMAT formats them"
