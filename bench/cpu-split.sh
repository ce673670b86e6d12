#!/usr/bin/env bash
# User and kernel CPU per request of a proxy binary (router-proxy by
# default, or bench's hyper-floor), under count-load's closed loop:
# /proc/PID/stat before and after the counted requests.
#   bench/cpu-split.sh [BIN] [REQUESTS] [CONCURRENCY]
# Build first: cargo build --release -p router-proxy -p router-bench
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir="${CARGO_TARGET_DIR:-target}"
bin="${1:-$target_dir/release/router-proxy}"
requests="${2:-200000}"
concurrency="${3:-32}"
port="${CPU_PORT:-39611}"
tmp=$(mktemp -d)
CUSTOM_ROUTER_PORT=$port CUSTOM_ROUTER_BIND=127.0.0.1 RUST_LOG=warn "$bin" >/dev/null 2>"$tmp/stderr" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$target_dir/release/count-load" --target "127.0.0.1:$port" --wait-ready 10 --warmup 10000 \
  --requests "$requests" --concurrency "$concurrency" \
  --between "cut -d' ' -f14,15 /proc/$pid/stat > $tmp/before" \
  --after "cut -d' ' -f14,15 /proc/$pid/stat > $tmp/after" > "$tmp/load"
read -r u0 s0 < "$tmp/before"
read -r u1 s1 < "$tmp/after"
ticks=$(getconf CLK_TCK)
secs=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' "$tmp/load")
awk -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v n="$requests" -v t="$ticks" -v secs="$secs" 'BEGIN {
  us = 1e6 / t / n
  printf "user %.1f us  kernel %.1f us  total %.1f us per request  (%.0f req/s)\n", u * us, s * us, (u + s) * us, n / secs
}'
