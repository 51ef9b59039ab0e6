#!/usr/bin/env bash
# Reproduces the K-interval paper's ablations: tools/reproduce.sh kinterval with the
# same options (--scale small|full, --tokens N, --deadline EPOCH_S, --gpus LIST,
# --no-data, --one-pass). See docs/reproducing.md.
exec "$(dirname "${BASH_SOURCE[0]}")/reproduce.sh" kinterval "$@"
