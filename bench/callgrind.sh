#!/usr/bin/env bash
# Instructions per request of router-proxy (sidecar mode), counted by
# callgrind: start the release router under valgrind, send a warmup, zero
# the counters, send --requests benchmark requests (count-load), dump, stop.
#   bench/callgrind.sh [OUT_DIR] [REQUESTS] [CONCURRENCY]
# Prints the instructions per request; the profile is OUT_DIR/callgrind.out.*
# (read it with callgrind_annotate). Build first:
#   cargo build --release -p router-proxy -p router-bench
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/router-callgrind}"
requests="${2:-20000}"
concurrency="${3:-8}"
port="${CG_PORT:-39517}"
target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$out"
rm -f "$out"/callgrind.out.*
CUSTOM_ROUTER_PORT=$port CUSTOM_ROUTER_BIND=127.0.0.1 RUST_LOG=warn \
  valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out.%p" \
  "${CG_BIN:-$target_dir/release/router-proxy}" >/dev/null 2>"$out/valgrind.log" &
vg=$!
trap 'kill -TERM $vg 2>/dev/null || true' EXIT
"$target_dir/release/count-load" --target "127.0.0.1:$port" --wait-ready 60 --warmup 2000 \
  --requests "$requests" --concurrency "$concurrency" \
  --between "callgrind_control -z $vg >/dev/null" \
  --after "callgrind_control -d $vg >/dev/null" | tee "$out/load.txt"
kill -TERM $vg
wait $vg || true
trap - EXIT
# The dump taken after the counted requests (suffix .1) holds them alone.
dump=$(ls "$out"/callgrind.out.*.1 2>/dev/null | head -1)
ir=$(grep -E '^(summary|totals):' "$dump" | head -1 | awk '{print $2}')
echo "instructions: $ir over $requests requests = $((ir / requests)) per request ($dump)"
