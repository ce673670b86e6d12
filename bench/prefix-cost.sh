#!/usr/bin/env bash
# What longest-prefix affinity adds per request (issue 31), counted by
# callgrind: each part of the work (parse the prompt's text out of the
# body, hash it into a chain, match on 4 full endpoint indexes + pick +
# record) run at two request counts; the difference over the extra
# requests is the cost per request, set-up excluded. Then the resident
# memory of one full index. Build first:
#   cargo build --release -p router-bench --bin prefix-cost
#   bench/prefix-cost.sh [PROMPT_KIB...]   (default: 10 128)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-target}/release/prefix-cost"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() {
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" "$@" >/dev/null 2>&1
  grep -E '^(summary|totals):' "$out/cg" | head -1 | awk '{print $2}'
}
echo "| prompt | part | instructions per request |"
echo "|---|---|---:|"
kibs=("$@"); [ ${#kibs[@]} -gt 0 ] || kibs=(10 128)
for kib in "${kibs[@]}"; do
  for part in parse chain score all; do
    low=$(count --part "$part" --requests 200 --prompt-kib "$kib")
    high=$(count --part "$part" --requests 1200 --prompt-kib "$kib")
    echo "| ${kib} KiB | $part | $(( (high - low) / 1000 )) |"
  done
done
"$bin" --memory
