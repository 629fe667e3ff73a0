#!/usr/bin/env python3
"""Median and spread (min-max) per configuration of bench/stream.sh output lines (stdin or files).
   python3 bench/stream_summary.py runs.jsonl"""
import json, statistics, sys, fileinput
rows = {}
for line in fileinput.input():
    line = line.strip()
    if not line.startswith('{'):
        continue
    try:
        j = json.loads(line)
    except ValueError:
        print('unparsed:', line[:200]); continue
    r = j.get('result')
    if not isinstance(r, dict):
        print('FAILED run:', j.get('config'), line[:300]); continue
    rows.setdefault(j['config'], []).append((j, r))
keys = [('decode_tok_s', 'tok/s', 1, '%.2f'), ('bytes_read_per_token', 'MB/tok', 1e-6, '%.0f'),
        ('read_gb_s', 'GB/s', 1, '%.2f'), ('expert_hit_rate', 'hit', 1, '%.3f'),
        ('prefetch_precision', 'prec', 1, '%.2f'), ('io_wait_ms_per_token', 'wait ms', 1, '%.0f'),
        ('serial_ms_per_token', 'serial ms', 1, '%.0f'), ('disk_busy_ms_per_token', 'busy ms', 1, '%.0f'),
        ('disk_gb_s', 'disk GB/s', 1, '%.2f'), ('io_roofline_frac', 'roofline', 1, '%.2f'),
        ('compute_ms_per_token', 'compute ms', 1, '%.0f'), ('bound_frac', 'bound frac', 1, '%.2f'),
        ('total_ms', 'ms/tok', 1, '%.0f'), ('gap_slow_reads_ms', 'gap:slow-reads ms', 1, '%.0f'),
        ('gap_idle_ms', 'gap:disk-idle ms', 1, '%.0f'), ('peak_rss_bytes', 'RSS GiB', 1 / 2**30, '%.2f')]
for cfg, runs in rows.items():
    for _, r in runs:  # where the time beyond the roofline went (ms/token)
        tot = r['decode_ms_per_token']['total']
        if r.get('io_ms_per_token') is not None:
            r['gap_slow_reads_ms'] = r['disk_busy_ms_per_token'] - r['io_ms_per_token']
            r['gap_idle_ms'] = tot - r['disk_busy_ms_per_token'] - r['serial_ms_per_token']
        r['total_ms'] = tot
    parts = ['config "%s" (%d runs, load %s):' % (cfg, len(runs), ','.join('%.1f' % j['load'] for j, _ in runs))]
    for k, name, sc, fmt in keys:
        v = [r[k] * sc for _, r in runs if r.get(k) is not None]
        if not v:
            continue
        parts.append('%s %s [%s-%s]' % (name, fmt % statistics.median(v), fmt % min(v), fmt % max(v)))
    print(' '.join(parts))
