#!/usr/bin/env bash
# The wrk + nginx-backend yardstick: an independent view of the proxy's
# cost, with tools that are not ours on both ends.
#
#   bench/wrk-yardstick.sh [SECONDS] [ROUNDS]
#
# - backend: nginx answering a canned ~300-byte chat completion itself
#   (`return 200 '{...}'`), one worker;
# - nginx:   nginx as a reverse proxy to that backend (keep-alive upstream);
# - router:  target/release/router-proxy (sidecar mode) with that backend.
# wrk -t1 -c32 POSTs /v1/chat/completions through each proxy in turn, for
# SECONDS (default 10) per run, ROUNDS times (default 3, interleaved). CPU
# per request is the proxy's own utime+stime (/proc/PID/stat, all of its
# processes) over the counted run, divided by the requests wrk completed.
# Prints one line per run and the medians, router against nginx.
#
# Build first: cargo build --release -p router-proxy
# Needs: nginx, wrk (apt-get install -y nginx wrk).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
rounds="${2:-3}"
target_dir="${CARGO_TARGET_DIR:-target}"
bin="${ROUTER_BIN:-$target_dir/release/router-proxy}"
backend_port="${YS_BACKEND_PORT:-39701}"
nginx_port="${YS_NGINX_PORT:-39702}"
router_port="${YS_ROUTER_PORT:-39703}"
for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y nginx wrk)" >&2; exit 2; }
done
[ -x "$bin" ] || { echo "missing: $bin (cargo build --release -p router-proxy)" >&2; exit 2; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

answer='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}'

# One nginx config per role; both run in the foreground under this script.
nginx_conf() { # NAME WORKERS SERVER_BLOCK
  mkdir -p "$tmp/$1"
  cat > "$tmp/$1/nginx.conf" <<EOF
worker_processes $2;
daemon off;
pid $tmp/$1/nginx.pid;
error_log $tmp/$1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/$1/body;
  proxy_temp_path $tmp/$1/proxy;
  fastcgi_temp_path $tmp/$1/fastcgi;
  uwsgi_temp_path $tmp/$1/uwsgi;
  scgi_temp_path $tmp/$1/scgi;
  keepalive_requests 1000000;
  $3
}
EOF
}
nginx_conf backend 1 "server { listen 127.0.0.1:$backend_port; location / { default_type application/json; return 200 '$answer'; } }"
nginx_conf proxy 2 "upstream be { server 127.0.0.1:$backend_port; keepalive 64; }
  server { listen 127.0.0.1:$nginx_port; location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"

nginx -c "$tmp/backend/nginx.conf" -e "$tmp/backend/error.log" & pids+=($!)
nginx -c "$tmp/proxy/nginx.conf" -e "$tmp/proxy/error.log" & pids+=($!)
nginx_pid=$!
CUSTOM_ROUTER_PORT=$router_port CUSTOM_ROUTER_BIND=127.0.0.1 RUST_LOG=warn \
  CUSTOM_ROUTER_ADMIN_TOKEN=yardstick "$bin" >/dev/null 2>"$tmp/router.log" & pids+=($!)
router_pid=$!

wait_up() { # URL
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "not up: $1" >&2; exit 1
}
wait_up "http://127.0.0.1:$backend_port/"
wait_up "http://127.0.0.1:$nginx_port/"
wait_up "http://127.0.0.1:$router_port/_custom_router/health"
curl -sf -X POST "http://127.0.0.1:$router_port/_custom_router/set-backends" \
  -H 'content-type: application/json' -H 'authorization: Bearer yardstick' \
  -d "{\"backends\":[\"127.0.0.1:$backend_port\"]}" >/dev/null

cat > "$tmp/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
EOF

# utime+stime, in clock ticks, of a process and its children processes
# (nginx's master and workers).
cpu_ticks() { # PID
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    [ -r "/proc/$p/stat" ] || continue
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}

ticks=$(getconf CLK_TCK)
run() { # NAME PORT PID -> prints "rps us_per_request"
  local out c0 c1 n
  wrk -t1 -c32 -d1s -s "$tmp/post.lua" "http://127.0.0.1:$2/v1/chat/completions" >/dev/null # warm-up
  c0=$(cpu_ticks "$3")
  out=$(wrk -t1 -c32 -d"${secs}s" -s "$tmp/post.lua" "http://127.0.0.1:$2/v1/chat/completions")
  c1=$(cpu_ticks "$3")
  if echo "$out" | grep -q "Non-2xx"; then echo "$1: non-2xx answers" >&2; echo "$out" >&2; exit 1; fi
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  awk -v n="$n" -v s="$secs" -v c=$((c1 - c0)) -v t="$ticks" \
    'BEGIN { printf "%.0f %.1f\n", n / s, c / t * 1e6 / n }'
}

printf "%-6s %-7s %10s %12s\n" round target "req/s" "cpu us/req"
: > "$tmp/results"
for r in $(seq 1 "$rounds"); do
  for t in nginx router; do
    if [ "$t" = nginx ]; then res=$(run nginx "$nginx_port" "$nginx_pid"); else res=$(run router "$router_port" "$router_pid"); fi
    echo "$t $res" >> "$tmp/results"
    printf "%-6s %-7s %10s %12s\n" "$r" "$t" $res
  done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for t in nginx router; do
  rps=$(awk -v t=$t '$1 == t {print $2}' "$tmp/results" | median)
  cpu=$(awk -v t=$t '$1 == t {print $3}' "$tmp/results" | median)
  echo "$t $rps $cpu" >> "$tmp/medians"
done
awk '{rps[$1]=$2; cpu[$1]=$3} END {
  printf "medians: router %.0f req/s, %.1f us CPU/req; nginx %.0f req/s, %.1f us CPU/req\n", rps["router"], cpu["router"], rps["nginx"], cpu["nginx"]
  printf "router/nginx: throughput %.3fx, CPU per request %.2fx\n", rps["router"] / rps["nginx"], cpu["router"] / cpu["nginx"]
}' "$tmp/medians"
