#!/usr/bin/env python3
"""TTFT distributions from engine-fleet-bench's JSON: one panel per
workload, render, number of proxies and load, one line (empirical CDF) per
strategy.

    python3 bench/plot_engine_fleet.py bench/results/engine-fleet-*.json docs/engine-aware-ttft.png

Several files (runs at different loads, renderings or numbers of proxies)
are merged; files written before `render` and `proxies` existed count as
`chat` and 1.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WORKLOADS = {"prefix": 0, "no_prefix": 1, "multi_turn": 2}
RENDERS = {"chat": 0, "turns": 1, "history": 2}


def panel_row(r):
    """A row of panels: workload, render, proxies (loads go across)."""
    return (r["workload"], r.get("render", "chat"), r.get("proxies", 1))


def row_order(key):
    w, rd, p = key
    return (WORKLOADS.get(w, len(WORKLOADS)), w, RENDERS.get(rd, len(RENDERS)), rd, p)


def main(srcs, dst):
    rows = []
    for src in srcs:
        with open(src) as f:
            data = json.load(f)
        rows += data["rows"]
    panel_rows = sorted({panel_row(r) for r in rows}, key=row_order)
    loads = sorted(set(r["load"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plt.subplots(
        len(panel_rows), len(loads), figsize=(5 * len(loads), 4 * len(panel_rows)), squeeze=False
    )
    for i, key in enumerate(panel_rows):
        w, rd, p = key
        for j, load in enumerate(loads):
            ax = axes[i][j]
            for s in strategies:
                row = next(
                    (
                        r
                        for r in rows
                        if panel_row(r) == key and r["load"] == load and r["strategy"] == s
                    ),
                    None,
                )
                if not row or not row["ttft_ms"]:
                    continue
                xs = sorted(row["ttft_ms"])
                n = len(xs)
                ys = [(k + 1) / n for k in range(n)]
                ax.step(xs, ys, where="post", label=f"{s} (p99 {row['ttft_p99_ms']:.0f} ms)")
            ax.set_xscale("log")
            ax.set_title(f"{w}, {rd}, {p} {'proxy' if p == 1 else 'proxies'}, {load:.0%} load")
            ax.set_xlabel("TTFT (ms, model time, log scale)")
            ax.set_ylabel("fraction of requests")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"TTFT by strategy: {data['engines']} simulated engines, "
        f"{data['requests']} req/run, seed {data['seed']}"
    )
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1:-1], sys.argv[-1])
