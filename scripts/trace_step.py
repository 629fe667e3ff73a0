#!/usr/bin/env python3
"""The in-graph cost of each kernel of a decode step, from a launch trace.

    FLOE_CUDA_TRACE=/tmp/t.txt floe bench -m MODEL --device cuda -p 0 -n 64 -r 1
    python3 scripts/trace_step.py /tmp/t.txt [NAMES]

The trace (pdl.cuh, cuda_rt_trace_dump) holds, per launch, the global timer when the kernel's
first block passed its wait on the previous kernel, and the launch's grid and block. In a chain
of dependent kernels the next kernel's time minus this one's is what this kernel adds to the
step as the CUDA graph runs it (programmatic dependent launch on). The script takes the session
with the most launches, finds the step's period (the launch pattern repeats every step), puts the
step's first kernel after the position of the largest cost, and prints the median over the steps of
each position's cost, then the costs summed by launch shape. That position is only a rotation
point: in a decode step of the 35B-A3B shape it is the output head's matmul (~79 us, 286 MB), and
the gap between two steps (the pick's copy, the host, the next graph's start) is counted to the
argmax's position that follows it.

NAMES (optional): a kernels35l-style log ("name|(x, y, z)|ns" a line, in launch order, of the
same model without the graph); positions are labelled by matching their grids in order.
"""
import statistics
import sys


def sessions(path):
    cur, out = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                if cur:
                    out.append(cur)
                cur = []
                continue
            p = line.split()
            if len(p) == 6:
                cur.append((int(p[1]), (int(p[2]), int(p[3]), int(p[4])), int(p[5])))
    if cur:
        out.append(cur)
    return out


def period(sig, lo=4, hi=4000):
    n = len(sig)
    tail = sig[n // 5:]
    for p in range(lo, min(hi, len(tail) // 3)):
        m = len(tail) - p
        same = sum(1 for i in range(m) if tail[i] == tail[i + p])
        if same >= 0.98 * m:
            return p
    return None


def names_of(path):
    out = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("|")
            if len(p) >= 2 and p[1].startswith("("):
                g = tuple(int(v) for v in p[1].strip("()").split(","))
                out.append((p[0].strip()[:48], g))
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ss = sessions(sys.argv[1])
    if not ss:
        print("no launches in the trace")
        return 1
    ev = max(ss, key=len)
    sig = [(g, b) for _, g, b in ev]
    P = period(sig)
    if not P:
        print(f"{len(ev)} launches: no repeating step found")
        return 1
    t = [x[0] for x in ev]
    d = [t[i + 1] - t[i] for i in range(len(t) - 1)]
    start = len(d) // 5
    start -= start % P
    cols = [[] for _ in range(P)]
    for i in range(start, len(d)):
        cols[(i - start) % P].append(d[i])
    med = [statistics.median(c) / 1000.0 for c in cols]
    gap = max(range(P), key=lambda p: med[p])  # the largest position, taken as the step's last
    order = [(gap + 1 + k) % P for k in range(P)]
    steps = len(cols[0])
    body = sum(med[p] for p in order[:-1])
    print(f"{len(ev)} launches, {P} a step, {steps} steps; the step (first kernel's entry to the last one's) "
          f"{body:.1f} us + the largest position {med[gap]:.1f} us")
    labels, gridnames = {}, {}
    if len(sys.argv) > 2:
        nm = names_of(sys.argv[2])
        for n, g in nm:
            gridnames.setdefault(g, set()).add(n.split("(")[0].replace("void ", "").replace("<unnamed>::", ""))
        j = 0
        for k, p in enumerate(order):
            g = sig[start + p][0]
            for jj in range(j, len(nm)):
                if nm[jj][1] == g:
                    labels[k] = nm[jj][0]
                    j = jj + 1
                    break
    print("pos  grid              block    us (median)  name")
    for k, p in enumerate(order):
        g, b = sig[start + p]
        print(f"{k:4d} {str(g):17s} {b:5d} {med[p]:10.2f}  {labels.get(k, '')}")
    agg = {}
    for k, p in enumerate(order[:-1]):
        a = agg.setdefault(sig[start + p], [0, 0.0])
        a[0] += 1
        a[1] += med[p]
    print("\nby launch shape (the last kernel excluded): count a step, us a step, us each, the kernels of that grid")
    for s, (c, u) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        nmk = " / ".join(sorted(gridnames.get(s[0], [])))
        print(f"{str(s[0]):17s} {s[1]:5d} {c:4d} {u:9.1f} {u / c:7.2f}  {nmk[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
