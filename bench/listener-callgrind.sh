#!/usr/bin/env bash
# Instructions per request of router-proxy (sidecar mode) by what the
# client speaks to its listener: HTTP/1.1 (the baseline), h2c with prior
# knowledge, TLS with ALPN http/1.1 and TLS with ALPN h2. Counted by
# callgrind as bench/callgrind.sh does; the client is h2load (Debian's
# nghttp2-client) for all four, one request at a time per connection
# (-m 1), so that only the protocol differs. The backend is count-load's
# (--serve-only), one for the whole run.
#   bench/listener-callgrind.sh [OUT_DIR] [REQUESTS] [CONNECTIONS]
# Needs valgrind, h2load, openssl, curl. Build first:
#   cargo build --release -p router-proxy -p router-bench --bin router-proxy --bin count-load
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/router-listener-callgrind}"
requests="${2:-20000}"
conns="${3:-8}"
target_dir="${CARGO_TARGET_DIR:-target}"
if [ -z "${BENCH_BACKEND:-}" ]; then
  mkdir -p "$out"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -keyout "$out/tls.key" -out "$out/tls.crt" 2>/dev/null
  printf '%s' '{"model":"bench","messages":[{"role":"user","content":"hi"}]}' >"$out/body.json"
  exec "$target_dir/release/count-load" --serve-only \
    --between "$0 $out $requests $conns"
fi
port=39617
for mode in h1 h2c tls-h1 tls-h2; do
  port=$((port + 1))
  dir="$out/$mode"
  rm -rf "$dir" && mkdir -p "$dir"
  tls_env=()
  scheme=http
  case $mode in tls-*)
    tls_env=(CUSTOM_ROUTER_TLS_CERT_FILE="$out/tls.crt" CUSTOM_ROUTER_TLS_KEY_FILE="$out/tls.key")
    scheme=https ;;
  esac
  proto=()
  case $mode in h1 | tls-h1) proto=(--h1) ;; esac
  url="$scheme://127.0.0.1:$port"
  env CUSTOM_ROUTER_PORT=$port CUSTOM_ROUTER_BIND=127.0.0.1 RUST_LOG=warn "${tls_env[@]}" \
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/callgrind.out.%p" \
    "$target_dir/release/router-proxy" >/dev/null 2>"$dir/valgrind.log" &
  vg=$!
  trap 'kill -TERM $vg 2>/dev/null || true' EXIT
  for _ in $(seq 600); do
    curl -skf "$url/_custom_router/health" >/dev/null && break
    sleep 0.1
  done
  curl -skf -X POST -H 'content-type: application/json' \
    -d "{\"backends\":[\"$BENCH_BACKEND\"]}" "$url/_custom_router/set-backends" >/dev/null
  load() {
    h2load -n "$1" -c "$conns" -m 1 "${proto[@]}" -d "$out/body.json" \
      -H 'content-type: application/json' "$url/v1/chat/completions"
  }
  load 2000 >"$dir/warmup.txt"
  callgrind_control -z $vg >/dev/null
  sleep 0.5
  load "$requests" >"$dir/load.txt"
  callgrind_control -d $vg >/dev/null
  sleep 0.5
  kill -TERM $vg
  wait $vg || true
  trap - EXIT
  total=0
  writer=0
  for f in "$dir"/callgrind.out.*.1-*; do
    ir=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
    total=$((total + ir))
    if grep -qE 'router_route_log::(writer::write_lines|.*::write_json)' "$f"; then
      writer=$((writer + ir))
    fi
  done
  ok=$(grep -oE 'status codes: [0-9]+ 2xx' "$dir/load.txt" | awk '{print $3}')
  echo "$mode: $ok of $requests answered 2xx; request path $(((total - writer) / requests)) instructions per request, all threads $((total / requests))"
done
