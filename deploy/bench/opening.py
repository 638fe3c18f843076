#!/usr/bin/env python3
"""The opening, slice by slice, from the crowd's --answers-tsv file (deploy/bench/burst.sh).

Usage: opening.py ANSWERS_TSV [SLICE_MS=25] [UNTIL_MS=400]

Each line of the file is `sent_ms<TAB>latency_ms<TAB>kind` (sent measured from the
opening). Per slice of send time: the answers sent in it, how many were `reserved` and
their latency (p50 and max), and the latency of every answer sent in it (p50 and max).
A slice where every kind is slow points at the machine or the edge's loop; one where
only `reserved` is slow points behind the edge (the hop, stockd, Redis).

Then the `reserved` answers split in two by send time: those sent before the sell-out
(until 50 ms before the first `sold_out` answer) and those of the sell-out (from then on,
when home shards run dry and buyers wait for rebalancing rounds), each with its count,
p50, p99 and max, over the whole file: which of the two sets the run's p99.
"""
import sys
from collections import Counter, defaultdict


# The sell-out starts this long before the first sold_out answer: the last units of the
# first item to sell out were being reserved (and moved between shards) just before it.
SELL_OUT_MARGIN_MS = 50.0


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
    all_reserved = []
    first_sold_out = None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split("\t")
            if len(parts) != 3:
                sys.exit(f"{path}:{n}: expected 3 tab-separated fields, got {len(parts)}")
            sent, latency, kind = float(parts[0]), float(parts[1]), parts[2].strip()
            if kind == "reserved":
                all_reserved.append((sent, latency))
            elif kind == "sold_out" and first_sold_out is None:
                first_sold_out = sent
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
    if first_sold_out is None:
        print("reserved by phase: no sold_out answer, no sell-out to split at")
        return
    edge = first_sold_out - SELL_OUT_MARGIN_MS
    print(f"reserved by phase (the sell-out from {edge:.0f} ms, "
          f"{SELL_OUT_MARGIN_MS:.0f} ms before the first sold_out):")
    for name, xs in (("before the sell-out", [l for s, l in all_reserved if s < edge]),
                     ("the sell-out", [l for s, l in all_reserved if s >= edge])):
        print(f"  {name:<20} n={len(xs):5d}  p50={pct(xs, 0.5):7.1f}  p99={pct(xs, 0.99):7.1f}"
              f"  max={max(xs, default=0):7.1f} ms")


if __name__ == "__main__":
    main()
