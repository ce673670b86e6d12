#!/usr/bin/env bash
# Instructions per request of router-proxy (sidecar mode), counted by
# callgrind: start the release router under valgrind, send a warmup, zero
# the counters, send --requests benchmark requests (count-load), dump, stop.
#   bench/callgrind.sh [OUT_DIR] [REQUESTS] [CONCURRENCY]
# Prints the instructions per request, all threads together and on the
# request path alone (every thread but the route-log writer's); the
# profiles are OUT_DIR/callgrind.out.*, one per thread (read them with
# callgrind_annotate). CG_LOAD_ARGS adds count-load flags (`--anthropic`:
# the same request from an Anthropic Messages client). Build first:
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
  valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/callgrind.out.%p" \
  "${CG_BIN:-$target_dir/release/router-proxy}" >/dev/null 2>"$out/valgrind.log" &
vg=$!
trap 'kill -TERM $vg 2>/dev/null || true' EXIT
"$target_dir/release/count-load" --target "127.0.0.1:$port" --wait-ready 60 --warmup 2000 \
  --requests "$requests" --concurrency "$concurrency" ${CG_LOAD_ARGS:-} \
  --between "callgrind_control -z $vg >/dev/null" \
  --after "callgrind_control -d $vg >/dev/null" | tee "$out/load.txt"
kill -TERM $vg
wait $vg || true
trap - EXIT
# The dump taken after the counted requests (part 1) holds them alone, one
# file per thread. The route-log writer thread formats the log lines off the
# request path: counted apart.
total=0
writer=0
for f in "$out"/callgrind.out.*.1-*; do
  ir=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
  total=$((total + ir))
  # (write_lines may be inlined into the thread's closure: write_json too
  # runs on that thread only.)
  if grep -qE 'router_route_log::(writer::write_lines|.*::write_json)' "$f"; then
    writer=$((writer + ir))
  fi
done
echo "instructions: $total over $requests requests = $((total / requests)) per request, all threads"
echo "request path (all but the route-log writer): $(((total - writer) / requests)) per request; route-log writer: $((writer / requests))"
