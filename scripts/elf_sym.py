#!/usr/bin/env python3
"""Names the functions of "bt: OBJECT OFFSET SYMBOL" lines (a test's watchdog stack, read on stdin)
from each object's ELF symbol table (.symtab, else .dynsym): static functions included, no debug
information needed. Prints "OFFSET FUNCTION+DELTA OBJECT" per frame."""
import struct
import sys


def symbols(path):
    with open(path, 'rb') as f:
        d = f.read()
    if d[:4] != b'\x7fELF' or d[4] != 2:
        return []
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum = struct.unpack_from('<HH', d, 0x3a)
    secs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for want in (2, 11):  # SHT_SYMTAB, then SHT_DYNSYM
        for s in secs:
            if s[1] != want:
                continue
            strtab = secs[s[6]]
            for i in range(s[5] // 24):
                name, info, _, _, value, size = struct.unpack_from('<IBBHQQ', d, s[4] + i * 24)
                if info & 0xf != 2 or not value:  # STT_FUNC
                    continue
                end = d.index(b'\0', strtab[4] + name)
                out.append((value, size, d[strtab[4] + name:end].decode(errors='replace')))
        if out:
            break
    out.sort()
    return out


cache = {}
for line in sys.stdin:
    p = line.split()
    if len(p) < 3 or p[0] != 'bt:':
        continue
    obj, off = p[1], int(p[2], 16)
    if obj not in cache:
        try:
            cache[obj] = symbols(obj)
        except OSError:
            cache[obj] = []
    best = None
    for v, sz, n in cache[obj]:
        if v <= off and (off < v + max(sz, 1) or best is None or v > best[0]):
            best = (v, n)
        if v > off:
            break
    name = '%s+0x%x' % (best[1], off - best[0]) if best else (p[3] if len(p) > 3 else '?')
    print('0x%x %s %s' % (off, name, obj))
