#!/usr/bin/env bash
# Minimizes fuzz/corpus/<target> after a run, to at most MAX_FILES inputs
# (default 300): libFuzzer records which coverage edges each input of the
# seeds and the corpus reaches (a merge's control file, edges without hit
# counts), then the inputs are picked greedily, each time the one that
# adds the most edges not yet reached (the seeds count as reached, and are
# not repeated), until nothing is added or MAX_FILES are picked. Prints
# the share of edges kept.
#
#   fuzz/cmin.sh <target>          (after `cargo +nightly fuzz build`)
#
# FUZZ_BIN overrides where the built target is looked for. Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$1
max_files=${MAX_FILES:-300}
bin=${FUZZ_BIN:-${CARGO_TARGET_DIR:-fuzz/libfuzzer/target}/x86_64-unknown-linux-gnu/release/$target}
corpus=fuzz/corpus/$target
seeds=fuzz/seeds/$target
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$corpus" "$work/merged" "$work/kept"
"$bin" -merge=1 -use_counters=0 -merge_control_file="$work/control" \
  "$work/merged" "$seeds" "$corpus" > "$work/merge.log" 2>&1 \
  || { cat "$work/merge.log"; exit 1; }
python3 - "$work/control" "$seeds/" "$max_files" > "$work/picked" <<'PY'
import os, sys
control, seeds, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = open(control).read().split("\n")
count = int(lines[0])
files = lines[2 : 2 + count]
features = {}
for line in lines[2 + count :]:
    if line.startswith("FT "):
        parts = line.split()
        features[int(parts[1])] = set(map(int, parts[2:]))
every = set().union(*features.values()) if features else set()
reached = set()
for i, f in enumerate(files):
    if f.startswith(seeds):
        reached |= features.pop(i, set())
picked = []
while len(picked) < cap and features:
    best = max(features, key=lambda i: (len(features[i] - reached), -os.path.getsize(files[i])))
    if not features[best] - reached:
        break
    reached |= features.pop(best)
    picked.append(files[best])
print(f"{len(picked)} inputs kept; with the seeds they reach {len(reached)} of {len(every)} edges", file=sys.stderr)
print("\n".join(picked))
PY
while read -r f; do
  [ -n "$f" ] && cp "$f" "$work/kept/$(sha1sum < "$f" | cut -d' ' -f1)"
done < "$work/picked"
rm -rf "$corpus"
mkdir -p "$corpus"
cp "$work/kept"/* "$corpus"/ 2>/dev/null || true
echo "$target: $(ls "$corpus" | wc -l) files, $(cat "$corpus"/* 2>/dev/null | wc -c) bytes"
