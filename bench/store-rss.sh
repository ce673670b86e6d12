#!/usr/bin/env bash
# What a stored Idempotency-Key answer costs in RSS, seen from outside
# (issue #22): the router (sidecar mode) in front of an nginx that answers
# a canned ~300-byte JSON itself; wrk sends plain requests (warm-up), then
# SECONDS of requests with a fresh Idempotency-Key each, which fill the
# in-process store to its 10,000 keys. Prints (RSS after - RSS before) /
# stored keys (at most 10,000).
#
#   bench/store-rss.sh [BIN] [SECONDS]     # BIN: target/release/router-proxy
#
# Needs: nginx, wrk, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-${CARGO_TARGET_DIR:-target}/release/router-proxy}"
secs="${2:-20}"
backend_port="${SR_BACKEND_PORT:-39811}"
router_port="${SR_ROUTER_PORT:-39812}"
tmp=$(mktemp -d)
answer='{"id":"chatcmpl-bench-0001","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is a fixed answer from the benchmark backend."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}'
cat > "$tmp/nginx.conf" <<EOC
worker_processes 1; daemon off; pid $tmp/nginx.pid; error_log $tmp/error.log warn;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy;
  fastcgi_temp_path $tmp/f; uwsgi_temp_path $tmp/u; scgi_temp_path $tmp/s; keepalive_requests 1000000;
  server { listen 127.0.0.1:$backend_port; location / { default_type application/json; return 200 '$answer'; } } }
EOC
cat > "$tmp/plain.lua" <<'EOL'
wrk.method = "POST"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hi"}]}'
wrk.headers["Content-Type"] = "application/json"
EOL
cat > "$tmp/keyed.lua" <<'EOL'
counter = 0
math.randomseed(os.time())
local tag = tostring(math.random(1, 1e9))
request = function()
  counter = counter + 1
  local body = '{"model":"bench","messages":[{"role":"user","content":"hi"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"]="application/json", ["Idempotency-Key"]="k-" .. tag .. "-" .. counter}, body)
end
EOL
nginx -c "$tmp/nginx.conf" -e "$tmp/error.log" & np=$!
CUSTOM_ROUTER_PORT=$router_port CUSTOM_ROUTER_BIND=127.0.0.1 RUST_LOG=warn "$bin" >/dev/null 2>"$tmp/router.log" & rp=$!
trap 'kill $np $rp 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$router_port/_custom_router/health" && break; sleep 0.1; done
curl -sf -X POST "http://127.0.0.1:$router_port/_custom_router/set-backends" -d "{\"backends\":[\"127.0.0.1:$backend_port\"]}" >/dev/null
rss() { awk '/VmRSS/ {print $2}' "/proc/$rp/status"; }
wrk -t1 -c16 -d5s -s "$tmp/plain.lua" "http://127.0.0.1:$router_port/v1/chat/completions" >/dev/null
r1=$(rss)
wrk -t1 -c16 -d"${secs}s" -s "$tmp/keyed.lua" "http://127.0.0.1:$router_port/v1/chat/completions" >/dev/null
sleep 1
r2=$(rss)
stored=$(curl -s "http://127.0.0.1:$router_port/metrics" | awk '/router_idempotency_events_total\{event="store"\}/ {print $2}')
kept=$(( stored < 10000 ? stored : 10000 ))
echo "RSS ${r1} kB after plain warm-up, ${r2} kB after ${stored} keyed requests; $(( (r2 - r1) * 1024 / kept )) B per stored key"
