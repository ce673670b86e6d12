#!/usr/bin/env python3
"""Issue 31's table: engine-fleet-bench result files (one per workload,
rendering, proxy count and seed, each with peak_ewma and
engine_aware_prefix rows) summarised per configuration: TTFT p99 per seed
and over all seeds' samples pooled, p50 pooled, prefix-cache hits, and the
change against peak_ewma.

    python3 bench/prefix_affinity_table.py FILE.json...
"""
import json
import sys
from collections import defaultdict


def pct(sorted_samples, p):
    n = len(sorted_samples)
    rank = max(1, min(n, int(-(-p * n // 100))))
    return sorted_samples[rank - 1]


def main(paths):
    runs = defaultdict(lambda: defaultdict(list))
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        seed = data.get("seed", 1)
        for row in data["rows"]:
            key = (row["workload"], row.get("render", "chat"), row.get("proxies", 1))
            runs[key][row["strategy"]].append((seed, row))
    print("| workload | render | proxies | strategy | TTFT p99 per seed (ms) | TTFT p99 pooled (ms) | TTFT p50 pooled (ms) | prefix-cache hits | errors |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|")
    changes = []
    for key in sorted(runs):
        pooled = {}
        for strategy in ("peak_ewma", "engine_aware_prefix"):
            rows = sorted(runs[key].get(strategy, []), key=lambda r: r[0])
            if not rows:
                continue
            samples = sorted(s for _, r in rows for s in r["ttft_ms"])
            per_seed = ", ".join(f"{r['ttft_p99_ms']:.0f}" for _, r in rows)
            hits = sum(r["prefix_hit_rate"] for _, r in rows) / len(rows)
            errors = sum(r["errors"] for _, r in rows)
            pooled[strategy] = (pct(samples, 99), [r["ttft_p99_ms"] for _, r in rows])
            print(f"| {key[0]} | {key[1]} | {key[2]} | {strategy} | {per_seed} | {pct(samples, 99):.0f} | {pct(samples, 50):.0f} | {100 * hits:.1f}% | {errors} |")
        if len(pooled) == 2:
            (b, bs), (a, as_) = pooled["peak_ewma"], pooled["engine_aware_prefix"]
            seeds = ", ".join(f"{100 * (x - y) / y:+.0f}%" for x, y in zip(as_, bs))
            changes.append(f"- {key[0]} / {key[1]} / {key[2]} proxies: TTFT p99 pooled {100 * (a - b) / b:+.0f}% (per seed {seeds})")
    print()
    print("engine_aware_prefix against peak_ewma:")
    print()
    print("\n".join(changes))


if __name__ == "__main__":
    main(sys.argv[1:])
