#!/usr/bin/env python3
"""Per-stage latency of a run from two Prometheus scrapes (before, after) of a daemon.

  hist-diff.py BEFORE AFTER METRIC [LABEL_SUBSTRING]

Prints, for the histogram METRIC (series whose labels contain LABEL_SUBSTRING), the number of
observations between the scrapes, their mean, and p50/p90/p99 as bucket upper edges (an
observation in (0.005, 0.01] reads as 10 ms). A METRIC not named `*_seconds` (a size) is
printed as is, without a unit. Used by deploy/bench/burst.sh to split the
crowd's `reserved` latency into the stages the edge and stockd measure.
"""
import re
import sys


def load(path, metric, label):
    buckets, total, count = {}, 0.0, 0.0
    pat = re.compile(r'^(\w+)(\{[^}]*\})?\s+(\S+)$')
    for line in open(path):
        m = pat.match(line.strip())
        if not m or not m.group(1).startswith(metric):
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if label and label not in labels:
            continue
        if name == metric + "_bucket":
            le = re.search(r'le="([^"]+)"', labels).group(1)
            le = float("inf") if le == "+Inf" else float(le)
            buckets[le] = buckets.get(le, 0.0) + value
        elif name == metric + "_sum":
            total += value
        elif name == metric + "_count":
            count += value
    return buckets, total, count


def main():
    before, after, metric = sys.argv[1], sys.argv[2], sys.argv[3]
    label = sys.argv[4] if len(sys.argv) > 4 else ""
    b0, s0, c0 = load(before, metric, label)
    b1, s1, c1 = load(after, metric, label)
    n = c1 - c0
    if n <= 0:
        print(f"{metric}{{{label}}}: no observations")
        return
    edges = sorted(b1)
    cum = [(e, b1[e] - b0.get(e, 0.0)) for e in edges]

    scale, unit = (1000, " ms") if metric.endswith("_seconds") else (1, "")

    def q(p):
        for e, c in cum:
            if c >= p * n:
                return "inf" if e == float("inf") else f"<= {e * scale:g}{unit}"
        return "?"

    print(f"{metric}{{{label}}}: n={n:.0f} mean={(s1 - s0) / n * scale:.2f}{unit} "
          f"p50 {q(0.5)}, p90 {q(0.9)}, p99 {q(0.99)}")


if __name__ == "__main__":
    main()
