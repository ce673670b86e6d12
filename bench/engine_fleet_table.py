#!/usr/bin/env python3
"""Markdown tables and the issue-18 goal checks from engine-fleet-bench's
JSON.

    python3 bench/engine_fleet_table.py bench/results/engine-fleet-*.json

Several files (runs of the same setup at different loads) are merged.
"""
import json
import sys


def main(srcs):
    rows = []
    for src in srcs:
        with open(src) as f:
            rows += json.load(f)["rows"]
    order = {"prefix": 0, "no_prefix": 1}
    rows.sort(key=lambda r: (order.get(r["workload"], 2), r["load"]))
    print(
        "| workload | load | strategy | TTFT p50 (ms) | TTFT p99 (ms) | e2e p50 (ms) | e2e p99 (ms) "
        "| throughput (req/s) | prefix-cache hits | errors |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['workload']} | {r['load']:.0%} | {r['strategy']} | {r['ttft_p50_ms']:.0f} "
            f"| {r['ttft_p99_ms']:.0f} | {r['e2e_p50_ms']:.0f} | {r['e2e_p99_ms']:.0f} "
            f"| {r['throughput_rps']:.3f} | {r['prefix_hit_rate']:.1%} | {r['errors']} |"
        )

    def row(w, load, s):
        return next(
            (r for r in rows if r["workload"] == w and r["load"] == load and r["strategy"] == s),
            None,
        )

    print()
    for w in ("prefix", "no_prefix"):
        for load in sorted(set(r["load"] for r in rows)):
            base = row(w, load, "peak_ewma")
            if not base:
                continue
            for s in ("engine_aware", "engine_aware_prefix"):
                r = row(w, load, s)
                if not r:
                    continue
                p99 = r["ttft_p99_ms"] / base["ttft_p99_ms"] - 1
                thr = r["throughput_rps"] / base["throughput_rps"] - 1
                print(
                    f"- {w} {load:.0%} {s} vs peak_ewma: TTFT p99 {p99:+.0%}, "
                    f"throughput {thr:+.1%}, e2e p99 "
                    f"{r['e2e_p99_ms'] / base['e2e_p99_ms'] - 1:+.0%}"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
