#!/usr/bin/env python3
"""Golden references for the shipped default model: HF transformers on the DEQUANTIZED shipped weights.

Input (--dir): what `test_default_model --make-refs` writes on the CPU machine:
  config.json, tokenizer.json, prompts.json, heldout_eval_u16.bin (from train.py), and
  q8_compact.safetensors: every HF tensor as floe's GGUF holds it -- a Q8_0 tensor as its int8 codes
  (I8, the HF shape) plus "<name>.__scale" (F32 [rows, cols/32], the fp16 block scales widened), any
  other tensor as F32 values. Dequantized value = scale * code, exact in float32 (fp16 scale x int8
  code needs <= 18 significant bits), i.e. the very values floe multiplies with.

Output (--out): golden.json -- for each held-out prompt: the prompt ids (and whether the HF
tokenizer reproduces them), HF's greedy 64-token continuation through its KV/recurrent cache (the
decode path), and from ONE full forward over prompt + continuation (the prefill path) the top-5 ids
and logits and the top-2 margin at every position; plus the held-out perplexity of the quantized
weights (float32, TF32 off, same windows as train.py's BF16 figure).

All HF computation: float32, attn_implementation="eager", experts implementation "eager"; the
greedy references on the CPU like tools/reference/make_fixtures.py, the perplexity on the GPU.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

T0 = time.time()


def log(m):
    print(f"[{time.time() - T0:6.1f}s] {m}", flush=True)


def pin_eager(model):
    for fn, arg in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        f = getattr(model, fn, None)
        if f is not None:
            try:
                f(arg)
            except Exception as e:  # noqa: BLE001
                log(f"note: {fn}({arg}) failed: {e}")
    return (getattr(model.config, "_attn_implementation", None), getattr(model.config, "_experts_implementation", None))


def build_deq_dir(src, dst):
    from safetensors.torch import load_file, save_file
    sd = load_file(os.path.join(src, "q8_compact.safetensors"))
    out = {}
    n_q = 0
    for name, t in sd.items():
        if name.endswith(".__scale"):
            continue
        if t.dtype == torch.int8:
            sc = sd[name + ".__scale"].float()
            cols = t.shape[-1]
            q = t.reshape(-1, cols // 32, 32).float()
            w = (q * sc.reshape(-1, cols // 32, 1)).reshape(t.shape)
            n_q += 1
        else:
            w = t.float()
        out[name] = w.contiguous()
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cj = json.load(f)
    cj["dtype"] = cj["torch_dtype"] = "float32"
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
    log(f"dequantized dir: {len(out)} tensors, {n_q} from Q8_0")
    return n_q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--seq", type=int, default=513, help="tokens per held-out window (train.py: --seq + 1)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    import transformers as tf
    res = dict(transformers=tf.__version__, torch=torch.__version__, dtype="float32", prompts=[])
    deq = "/tmp/deq_q8"
    res["n_q8_tensors"] = build_deq_dir(a.dir, deq)
    model = tf.Qwen3_5MoeForCausalLM.from_pretrained(deq, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    res["implementation"] = list(pin_eager(model))
    log(f"loaded {type(model).__name__}, impl {res['implementation']}")
    with open(os.path.join(a.dir, "prompts.json")) as f:
        prompts = json.load(f)
    tok = None
    try:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.dir, "tokenizer.json"))
    except Exception as e:  # noqa: BLE001
        log(f"tokenizer: {e}")
    V = model.config.vocab_size
    with torch.no_grad():
        for p in prompts:
            toks = list(p["ids"])
            rec = dict(text=p["text"], tokens=toks)
            if tok is not None:
                rec["hf_tokenizer_same_ids"] = tok.encode(p["text"], add_special_tokens=False).ids == toks
            # greedy through the cache (HF's decode path)
            out = model(torch.tensor([toks]), use_cache=True)
            pkv, last = out.past_key_values, out.logits[0, -1].float()
            gen, steps = [], []
            for _ in range(a.n_gen):
                steps.append(last)
                t = int(torch.argmax(last))
                gen.append(t)
                out = model(torch.tensor([[t]]), past_key_values=pkv, use_cache=True)
                pkv, last = out.past_key_values, out.logits[0, -1].float()
            step_logits = torch.stack(steps)
            # one full forward over prompt + continuation (the prefill path)
            full = model(torch.tensor([toks + gen]), use_cache=False).logits[0].float()
            T = len(toks)
            top = torch.topk(full, a.top, dim=-1)
            margin = top.values[:, 0] - top.values[:, 1]
            pred = full[T - 1:T - 1 + len(gen)].argmax(-1).tolist()
            rec.update(greedy=gen,
                       top_ids=top.indices.tolist(),
                       top_vals=[[float(v) for v in row] for row in top.values],
                       margin=[float(m) for m in margin],
                       hf_full_vs_decode_max_abs=float((full[T - 1:T - 1 + len(gen)] - step_logits).abs().max()),
                       hf_full_argmax_matches_greedy=sum(int(x == y) for x, y in zip(pred, gen)),
                       min_top2_margin_gen=float(margin[T - 1:T - 1 + len(gen)].min()),
                       logit_absmax=float(full.abs().max()))
            if tok is not None:
                rec["completion"] = tok.decode(gen, skip_special_tokens=False)
            res["prompts"].append(rec)
            log(f"prompt T={T}: full-vs-decode {rec['hf_full_vs_decode_max_abs']:.3g}, argmax==greedy "
                f"{rec['hf_full_argmax_matches_greedy']}/{len(gen)}, min margin {rec['min_top2_margin_gen']:.3g}, "
                f"|logit|max {rec['logit_absmax']:.3g}")
            if "completion" in rec:
                log("  " + json.dumps(p["text"] + rec["completion"]))
        with open(os.path.join(a.out, "golden.json"), "w") as f:
            json.dump(res, f)
        # held-out perplexity of the quantized weights (GPU, float32)
        try:
            import numpy as np
            ev = np.fromfile(os.path.join(a.dir, "heldout_eval_u16.bin"), dtype=np.uint16)
            seq = a.seq
            ev = torch.from_numpy(ev.astype(np.int64).reshape(-1, seq))
            dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model.to(dev)
            nll, cnt = 0.0, 0
            for i in range(0, ev.shape[0], 16):
                s = ev[i:i + 16].to(dev)
                lg = model(s[:, :-1], use_cache=False).logits.float()
                nll += float(-torch.log_softmax(lg, -1).gather(-1, s[:, 1:, None]).sum())
                cnt += s[:, 1:].numel()
            res["heldout"] = dict(tokens=cnt, ppl_q8_0=math.exp(nll / cnt), nll=nll / cnt, device=str(dev))
            log(f"held-out ppl (Q8_0 dequantized, f32): {res['heldout']}")
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            res["heldout_error"] = str(e)
    res["seconds"] = time.time() - T0
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(res, f)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
