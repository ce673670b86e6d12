#!/usr/bin/env python3
"""Markdown tables and the goal checks (the engine-aware strategies against
peak_ewma) from engine-fleet-bench's JSON.

    python3 bench/engine_fleet_table.py bench/results/engine-fleet-*.json

Several files (runs at different loads, renderings or numbers of proxies)
are merged. A row is identified by workload, render, proxies, load and
strategy; files written before `render` and `proxies` existed count as
`chat` and 1.
"""
import json
import sys

WORKLOADS = {"prefix": 0, "no_prefix": 1, "multi_turn": 2}
RENDERS = {"chat": 0, "turns": 1, "history": 2}


def render(r):
    return r.get("render", "chat")


def proxies(r):
    """The number of proxies; one proxy given a shared store anyway
    (`--redis`) shows as `1+store`."""
    p = r.get("proxies", 1)
    return f"{p}+store" if p == 1 and r.get("shared_store") else str(p)


def setup(r):
    """What a strategy is compared within: all but the strategy."""
    return (r["workload"], render(r), proxies(r), r["load"])


def setup_order(key):
    w, rd, p, load = key
    return (WORKLOADS.get(w, len(WORKLOADS)), w, RENDERS.get(rd, len(RENDERS)), rd, int(p.split("+")[0]), p, load)


def main(srcs):
    rows = []
    for src in srcs:
        with open(src) as f:
            rows += json.load(f)["rows"]
    # Stable: strategies keep the order they were run in.
    rows.sort(key=lambda r: setup_order(setup(r)))
    print(
        "| workload | render | proxies | load | strategy | TTFT p50 (ms) | TTFT p99 (ms) "
        "| e2e p50 (ms) | e2e p99 (ms) | throughput (req/s) | prefix-cache hits | errors |"
    )
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['workload']} | {render(r)} | {proxies(r)} | {r['load']:.0%} | {r['strategy']} "
            f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {r['e2e_p50_ms']:.0f} "
            f"| {r['e2e_p99_ms']:.0f} | {r['throughput_rps']:.3f} | {r['prefix_hit_rate']:.1%} "
            f"| {r['errors']} |"
        )

    print()
    setups = sorted({setup(r) for r in rows}, key=setup_order)
    for key in setups:
        same = [r for r in rows if setup(r) == key]
        base = next((r for r in same if r["strategy"] == "peak_ewma"), None)
        if not base:
            continue
        w, rd, p, load = key
        for r in same:
            if not r["strategy"].startswith("engine_aware"):
                continue
            p99 = r["ttft_p99_ms"] / base["ttft_p99_ms"] - 1
            thr = r["throughput_rps"] / base["throughput_rps"] - 1
            e2e = r["e2e_p99_ms"] / base["e2e_p99_ms"] - 1
            print(
                f"- {w} {rd} {p} {'proxy' if p.startswith('1') else 'proxies'} {load:.0%} "
                f"{r['strategy']} vs peak_ewma: TTFT p99 {p99:+.0%}, "
                f"throughput {thr:+.1%}, e2e p99 {e2e:+.0%}, prefix-cache hits "
                f"{r['prefix_hit_rate']:.0%} vs {base['prefix_hit_rate']:.0%}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
