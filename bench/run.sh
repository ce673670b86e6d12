#!/usr/bin/env bash
# Builds the router and the benchmark (release) and runs the benchmark.
# All arguments go to proxy-bench; see `bench/run.sh --help`.
#   bench/run.sh                 # defaults: 1000 req/s, 10 s, 2 s warmup, 32 connections
#   bench/run.sh --rounds 3      # three interleaved rounds, medians reported
#   bench/run.sh --json          # one JSON object on stdout
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p router-proxy -p router-bench
target_dir="${CARGO_TARGET_DIR:-target}"
# proxy-bench finds router-proxy next to itself unless --router-bin is given.
exec "$target_dir/release/proxy-bench" "$@"
