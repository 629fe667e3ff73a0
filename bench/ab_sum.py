#!/usr/bin/env python3
"""Summarise bench/ab_rounds.sh output: per case and configuration, mean GB/s and % of membw, and
the mean and per-round difference in % points against the first label (A unless --ref L); rounds
share one membw figure, so per-round differences are the evidence, not the means."""
import collections, sys
args = sys.argv[1:]
ref = None
if '--ref' in args:
    i = args.index('--ref'); ref = args[i + 1]; del args[i:i + 2]
d = collections.defaultdict(dict)
labels = []
for l in open(args[0]):
    f = l.split()
    if l.startswith('#') or len(f) != 8: continue
    r, s, t, sh, th, g, p, us = f
    if s not in labels: labels.append(s)
    d[(t, sh, th)].setdefault(s, {})[int(r)] = (float(g), float(p))
ref = ref or labels[0]
for k in sorted(d, key=lambda k: (k[0], k[2], k[1])):
    A = d[k].get(ref, {})
    out = [' '.join(k), '%s %.1f%%' % (ref, sum(v[1] for v in A.values()) / max(1, len(A)))]
    for s in labels:
        if s == ref or s not in d[k]: continue
        B = d[k][s]
        rs = sorted(set(A) & set(B))
        diffs = [B[r][1] - A[r][1] for r in rs]
        out.append('| %s %.1f%% %+.1f [%s]' % (s, sum(v[1] for v in B.values()) / len(B), sum(diffs) / max(1, len(diffs)),
                                            ' '.join('%+.1f' % x for x in diffs)))
    print(*out)
