#!/usr/bin/env python3
"""The opening, slice by slice, from the crowd's --answers-tsv file (deploy/bench/burst.sh).

Usage: opening.py ANSWERS_TSV [SLICE_MS=25] [UNTIL_MS=400]

Each line of the file is `sent_ms<TAB>latency_ms<TAB>kind` (sent measured from the
opening). Per slice of send time: the answers sent in it, how many were `reserved` and
their latency (p50 and max), and the latency of every answer sent in it (p50 and max).
A slice where every kind is slow points at the machine or the edge's loop; one where
only `reserved` is slow points behind the edge (the hop, stockd, Redis).
"""
import sys
from collections import Counter, defaultdict


def pct(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    slice_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 25.0
    until_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 400.0
    kinds = defaultdict(Counter)
    reserved = defaultdict(list)
    every = defaultdict(list)
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split("\t")
            if len(parts) != 3:
                sys.exit(f"{path}:{n}: expected 3 tab-separated fields, got {len(parts)}")
            sent, latency, kind = float(parts[0]), float(parts[1]), parts[2].strip()
            if sent >= until_ms:
                continue
            i = int(sent // slice_ms)
            kinds[i][kind] += 1
            every[i].append(latency)
            if kind == "reserved":
                reserved[i].append(latency)
    print(f"{'sent ms':>8} {'answers':>7} {'reserved':>8} {'res p50':>8} {'res max':>8} "
          f"{'all p50':>8} {'all max':>8}  kinds")
    for i in sorted(kinds):
        r, a = reserved[i], every[i]
        others = ", ".join(f"{k} {v}" for k, v in kinds[i].most_common() if k != "reserved")
        print(f"{i * slice_ms:8.0f} {len(a):7d} {len(r):8d} {pct(r, 0.5):8.1f} "
              f"{max(r, default=0):8.1f} {pct(a, 0.5):8.1f} {max(a):8.1f}  {others}")


if __name__ == "__main__":
    main()
