#!/usr/bin/env python3
"""Load generator for bench/parallel.sh: N concurrent streamed /v1/completions requests against a
running `floe serve`, timing every token as it arrives (standard library only).

  parallel_client.py PORT throughput N MAX_TOKENS   aggregate decode tok/s of N streams
  parallel_client.py PORT ttft BACKGROUND MAX_TOKENS PROMPT_WORDS
                                                    TTFT of a new request while BACKGROUND decode

Aggregate decode tok/s: tokens that arrived after every stream had its first token, over the time
from that moment to the moment the first stream finished (the window in which all N decode
together, so prefill and the ragged end do not count). Prints one JSON object."""
import http.client
import json
import sys
import threading
import time

PROMPTS = ["def parse(line):", "class Node:", "import numpy as np\n", "for i in range(10):",
           "# sort a list\n", "async def fetch(url):", "SELECT * FROM", "if __name__ == '__main__':"]


def stream(port, prompt, max_tokens, seed, out, started=None):
    """Runs one streamed completion; out gets the arrival time of each token chunk."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    # greedy: a synthetic model's logits are nearly flat, so temperature sampling would keep
    # almost the whole 248K vocabulary as candidates (~50 ms a token of sorting), which measures
    # the sampler, not the batched forward pass
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": seed,
                       "stream": True})
    t0 = time.time()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit("HTTP %d: %s" % (r.status, r.read()[:300]))
    times = []
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        ch = ev.get("choices") or [{}]
        # one chunk a token; the last may only carry finish_reason (empty text): not a token
        if ch[0].get("text") is not None and (ch[0].get("finish_reason") is None or ch[0]["text"]):
            times.append(time.time())
            if started is not None and len(times) == 1:
                started.set()
    c.close()
    out.update(t0=t0, times=times)


def throughput(port, n, max_tokens):
    res = [dict() for _ in range(n)]
    th = [threading.Thread(target=stream, args=(port, PROMPTS[i % len(PROMPTS)], max_tokens, 100 + i, res[i]))
          for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    start = max(r["times"][0] for r in res)  # every stream decoding from here
    end = min(r["times"][-1] for r in res)   # until the first one ends
    toks = sum(sum(1 for x in r["times"] if start < x <= end) for r in res)
    return {"streams": n, "max_tokens": max_tokens, "window_s": round(end - start, 3),
            "tokens_in_window": toks, "aggregate_tok_s": round(toks / (end - start), 2) if end > start else None,
            "per_stream_tok_s": [round((len(r["times"]) - 1) / (r["times"][-1] - r["times"][0]), 2) for r in res]}


def ttft(port, n_bg, max_tokens, words):
    prompt = "# " + " ".join("word%d" % i for i in range(words)) + "\ndef main():"
    alone = {}
    stream(port, prompt, 2, 7, alone)  # TTFT without load (a cold slot; the server keeps 4 slots)
    res = [dict() for _ in range(n_bg)]
    evs = [threading.Event() for _ in range(n_bg)]
    th = [threading.Thread(target=stream, args=(port, PROMPTS[i], max_tokens, 200 + i, res[i], evs[i]))
          for i in range(n_bg)]
    for t in th:
        t.start()
    for e in evs:
        e.wait()
    time.sleep(0.5)  # well into their decode
    new = {}
    stream(port, prompt.replace("main", "main2"), 2, 8, new)  # not a cached prefix: a full prefill
    for t in th:
        t.join()
    # the background streams' longest gap between tokens while the new prompt was evaluated
    gap = max((b - a) for r in res for a, b in zip(r["times"], r["times"][1:]) if a >= new["t0"] - 1)
    return {"background": n_bg, "prompt_words": words,
            "ttft_alone_s": round(alone["times"][0] - alone["t0"], 3),
            "ttft_under_load_s": round(new["times"][0] - new["t0"], 3),
            "background_max_gap_s": round(gap, 3)}


if __name__ == "__main__":
    port, mode = int(sys.argv[1]), sys.argv[2]
    if mode == "throughput":
        print(json.dumps(throughput(port, int(sys.argv[3]), int(sys.argv[4]))))
    else:
        print(json.dumps(ttft(port, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
