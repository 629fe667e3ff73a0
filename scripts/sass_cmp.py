#!/usr/bin/env python3
"""Compares the machine code of every kernel in two sets of CUDA cubins: a change that only moves
kernels between files (or touches host code) must leave every kernel's code as it was.

    scripts/sass_cmp.py OLD.cubin[,OLD2.cubin...] NEW.cubin[,NEW2.cubin...]

scripts/sass_cmp.sh makes the cubins of two revisions with the build's nvcc flags. A kernel is
keyed by its mangled name with the anonymous namespace's per-file tag removed (moving a kernel to
another file changes only that tag) and compared by the bytes of its .text section. Prints the
kernels only one side has and those whose bytes differ; exit 0 when both sides hold the same
kernels with the same bytes."""
import re
import struct
import sys

TAG = re.compile(rb'\d+_GLOBAL__N__[0-9a-f]+_\w+?_cu_[0-9a-f]+(?:_\d+)?')


def texts(path):
    with open(path, 'rb') as f:
        d = f.read()
    if d[:4] != b'\x7fELF' or d[4] != 2:
        sys.exit(f'{path}: not a 64-bit ELF cubin')
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    secs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    names = secs[shstrndx][4]
    out = {}
    for s in secs:
        nm = d[names + s[0]:d.index(b'\0', names + s[0])]
        if nm.startswith(b'.text.'):
            out[TAG.sub(b'ANON', nm[6:])] = d[s[4]:s[4] + s[5]]
    return out


def side(paths):
    out = {}
    for p in paths.split(','):
        out.update(texts(p))
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    a, b = side(sys.argv[1]), side(sys.argv[2])
    bad = 0
    for n in sorted(set(a) | set(b)):
        if n not in b:
            print('only in the first:', n.decode()); bad += 1
        elif n not in a:
            print('only in the second:', n.decode()); bad += 1
        elif a[n] != b[n]:
            print('code differs:', n.decode(), f'({len(a[n])} / {len(b[n])} bytes)'); bad += 1
    print(f'{len(a)} / {len(b)} kernels, {bad} differences')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
