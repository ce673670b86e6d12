#!/bin/bash
# router-healthcheck: the image's HEALTHCHECK. Finds the router program that
# runs in this container and checks it the way its own probes do:
#
#   router-proxy          GET /_custom_router/health on its port (--port,
#                         CUSTOM_ROUTER_PORT, 3000); 503 while draining fails
#   router-control-plane  grpc.health.v1.Health/Check on its --listen port
#                         (default 50051), spoken with curl over HTTP/2
#   routerctl up          the proxy it runs (--port, default 3000)
#   anything else         nothing to check: healthy
#
# Usage: router-healthcheck [PID]
#   With no PID, the first process in the container whose program is one of
#   the three (PID 1 is tini; `sh -c '... exec router-...'` is fine too).
#   A PID checks that process instead (for trying it outside a container).
# Exit 0 healthy, 1 unhealthy (Docker's HEALTHCHECK contract).
set -uo pipefail

TIMEOUT=${ROUTER_HEALTHCHECK_TIMEOUT:-3}

# Prints the PID of the first router process.
find_router() {
    local dir pid arg0
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        [[ $pid == "$$" ]] && continue
        arg0=$(tr '\0' '\n' <"$dir/cmdline" 2>/dev/null | head -n 1) || continue
        case ${arg0##*/} in
        router-proxy | router-control-plane | routerctl)
            echo "$pid"
            return 0
            ;;
        esac
    done
    return 1
}

pid=${1:-}
if [[ -z $pid ]]; then
    pid=$(find_router) || {
        echo "router-healthcheck: no router process found: nothing to check"
        exit 0
    }
fi

argv=()
{ mapfile -d '' -t argv <"/proc/$pid/cmdline"; } 2>/dev/null
if ((${#argv[@]} == 0)); then
    echo "router-healthcheck: process $pid is gone"
    exit 1
fi
prog=${argv[0]##*/}

# The value of --NAME (as `--NAME VALUE` or `--NAME=VALUE`), if given.
opt() {
    local name=$1 i
    for ((i = 1; i < ${#argv[@]}; i++)); do
        case ${argv[i]} in
        "--$name") echo "${argv[i + 1]:-}"; return 0 ;;
        "--$name="*) echo "${argv[i]#*=}"; return 0 ;;
        esac
    done
    return 1
}

# True when --NAME appears.
has_opt() {
    local name=$1 a
    for a in "${argv[@]:1}"; do
        [[ $a == "--$name" || $a == "--$name="* ]] && return 0
    done
    return 1
}

# A variable from the checked process's environment (else our own).
proc_env() {
    local name=$1 line
    while IFS= read -r -d '' line; do
        if [[ $line == "$name="* ]]; then
            echo "${line#*=}"
            return 0
        fi
    done <"/proc/$pid/environ" 2>/dev/null
    [[ -n ${!name:-} ]] && echo "${!name}"
}

# A listen address as a host to dial: wildcards become loopback.
dial_host() {
    case $1 in
    "" | 0.0.0.0 | "[::]" | "::") echo 127.0.0.1 ;;
    \[*) echo "$1" ;;
    *:*) echo "[$1]" ;;
    *) echo "$1" ;;
    esac
}

check_proxy() {
    local port=$1 host=$2
    curl -fsS --max-time "$TIMEOUT" -o /dev/null \
        "http://$host:$port/_custom_router/health" || {
        echo "router-healthcheck: router-proxy on $host:$port is not healthy"
        return 1
    }
}

check_control_plane() {
    local listen scheme=http http2=--http2-prior-knowledge insecure=() answer
    listen=$(opt listen) || listen=0.0.0.0:50051
    if has_opt tls-cert; then
        # Our own loopback: the certificate names the service, not 127.0.0.1.
        scheme=https http2=--http2 insecure=(--insecure)
    fi
    local port=${listen##*:} host
    host=$(dial_host "${listen%:*}")
    # HealthCheckRequest{service: ""} is an empty message: a 5-byte gRPC frame
    # (not compressed, length 0). SERVING is HealthCheckResponse{status: 1}:
    # frame 00 00000002, then field 1 varint 1 (08 01).
    answer=$(printf '\0\0\0\0\0' |
        curl -sS --max-time "$TIMEOUT" "$http2" "${insecure[@]}" -X POST \
            -H 'content-type: application/grpc' -H 'te: trailers' \
            --data-binary @- --output - \
            "$scheme://$host:$port/grpc.health.v1.Health/Check" |
        od -An -v -tx1 | tr -d ' \n')
    if [[ $answer != 00000000020801 ]]; then
        echo "router-healthcheck: router-control-plane on $host:$port is not SERVING (answer: ${answer:-none})"
        return 1
    fi
}

case $prog in
router-proxy)
    port=$(opt port) || port=$(proc_env CUSTOM_ROUTER_PORT) || port=3000
    bind=$(opt bind) || bind=$(proc_env CUSTOM_ROUTER_BIND) || bind=0.0.0.0
    check_proxy "${port:-3000}" "$(dial_host "$bind")" || exit 1
    ;;
router-control-plane)
    check_control_plane || exit 1
    ;;
routerctl)
    if [[ ${argv[*]:1} =~ (^|[[:space:]])up($|[[:space:]]) ]]; then
        port=$(opt port) || port=3000
        check_proxy "$port" 127.0.0.1 || exit 1
    fi
    ;;
esac
exit 0
