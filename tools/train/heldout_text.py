#!/usr/bin/env python3
"""Held-out text for the default model, from the Python files of the machine this runs on.

train.py holds out a file when int(sha256(text)[:8], 16) % 50 == 0, with the text filtered and
normalised as below, and never trains on such a file. The rule depends only on the content, so
any *.py file that passes it here was not trained on, whichever machine it comes from, even where
the machine's files differ from the training machine's. The files are joined with a blank line
(plain text: `floe perplexity` does not parse control tokens, so train.py's <|endoftext|>
separator is not used). Prints the file list on stderr.

usage: heldout_text.py OUT.txt [ROOT ...]   (default roots: /usr/lib/python3*, /usr/lib/python3/dist-packages)
"""
import glob
import hashlib
import os
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    roots = sys.argv[2:] or sorted(glob.glob("/usr/lib/python3*"))
    docs = {}
    for r in roots:
        for dp, _, fn in os.walk(r):
            for f in fn:
                if not f.endswith(".py"):
                    continue
                try:
                    b = open(os.path.join(dp, f), "rb").read()
                    t = b.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                # train.py's filter: 64..100000 bytes, no NUL, lines <= 1000 characters, CRLF -> LF
                if not 64 <= len(b) <= 100000 or "\0" in t:
                    continue
                t = t.replace("\r\n", "\n")
                if any(len(l) > 1000 for l in t.split("\n")):
                    continue
                h = hashlib.sha256(t.encode("utf-8")).hexdigest()
                if int(h[:8], 16) % 50 == 0:
                    docs.setdefault(h, (os.path.join(dp, f), t))
    with open(sys.argv[1], "w", encoding="utf-8") as o:
        for i, h in enumerate(sorted(docs)):
            p, t = docs[h]
            print(h[:12], len(t.encode("utf-8")), p, file=sys.stderr)
            o.write(("\n\n" if i else "") + t)
    print(f"{len(docs)} held-out files", file=sys.stderr)


if __name__ == "__main__":
    main()
