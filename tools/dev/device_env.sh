# Sourced first by the scripts that run on the GPU machine (tools/dev/device_*.sh,
# tools/dev/profile_*.sh): the shell moves to the repository root, $OUT (default
# /tmp/qattn_out) exists, $BUILD names the carried build (default build-gpu),
# and the libraries carried in .deps/ are on the loader's path.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT=${OUT:-/tmp/qattn_out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
