#!/usr/bin/env python3
"""Golden fixtures for floe's model tests, made with HF transformers (the reference implementation).

Builds tiny random models of the three architectures floe runs (Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE),
saves each as an HF directory (config.json + model.safetensors) and records, for a few prompts of
random token ids:
  - greedy continuation of N_GEN tokens (model.generate, do_sample=False, KV/recurrent cache: HF's
    decode path);
  - the float32 logits of EVERY position of prompt+continuation, from ONE full forward pass over the
    whole sequence (HF's prefill path: chunked DeltaNet, chunk 64, so the long prompt crosses chunks);
  - HF's own consistency: max |logit(full forward) - logit(generate's decode step)|, and whether the
    argmax of the full-forward logits reproduces the generated tokens;
  - the hidden states of one prompt after every layer (HF output_hidden_states), to debug layer by layer.

Everything runs in float32 on the CPU (no TF32 anywhere), attn_implementation="eager", experts
implementation "eager", fixed seeds. 1-D parameters (all norm weights, A_log, dt_bias) are perturbed
so that the zero-centred `1+w` norm convention is actually exercised. The hybrid models' weights are
rounded to bfloat16-representable values and saved as BF16 (halves the fixture size, exercises the
BF16 loading path, and HF computed on exactly those values in float32); qwen3moe is saved as F32.

Output: OUT/models/<name>/{config.json, model.safetensors, logits.bin, hidden.bin, meta.json}
  logits.bin: little-endian float32; prompt p's block starts at meta.prompts[p].logits_offset
              (in floats) and is [n_tokens][vocab] where n_tokens = len(tokens) + len(greedy).
  hidden.bin: float32 [n_hidden_states][n_tokens][hidden] for meta.hidden.prompt_index (prompt only).

Usage: python3 make_fixtures.py --out DIR [--only NAME[,NAME]] [--from-dir NAME=HFDIR]
                                 [--prompt-lens 1,17,80] [--n-gen 64] [--no-hidden]
  --from-dir: instead of building a random model, load an existing HF directory (e.g. weights
  dequantized from a quantized GGUF) and record the same references for it.
"""
import argparse
import json
import os
import sys
import time
import traceback

import torch

VOCAB = 512
N_GEN = 64
PROMPT_LENS = [1, 17, 80]   # 80 > 64: HF's chunked DeltaNet covers two chunks (144 with the continuation)
ARGS = None                 # parsed command line (main)
HIDDEN_PROMPT = 1           # index of the prompt whose per-layer hidden states are saved
INIT_RANGE = 0.08           # larger than HF's 0.02 so logits and router choices are decisive


def common_cfg():
    return dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                initializer_range=INIT_RANGE, hidden_act="silu", attention_bias=False,
                pad_token_id=None, bos_token_id=None, eos_token_id=None)


def make_config(name, dv):
    import transformers as tf
    c = common_cfg()
    if name == "qwen3moe":
        c.update(num_hidden_layers=4, head_dim=16, intermediate_size=96, moe_intermediate_size=16,
                 num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1,
                 mlp_only_layers=[],
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        return tf.Qwen3MoeConfig(**c), tf.Qwen3MoeForCausalLM, False
    hybrid = dict(num_hidden_layers=6, head_dim=32,
                  layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
                  linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=dv,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  moe_intermediate_size=16, shared_expert_intermediate_size=32,
                  num_experts=8, num_experts_per_tok=2,
                  partial_rotary_factor=0.25,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                   "partial_rotary_factor": 0.25})
    c.update(hybrid)
    if name == "qwen3next":
        c.update(intermediate_size=96, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        return tf.Qwen3NextConfig(**c), tf.Qwen3NextForCausalLM, True
    if name == "qwen35moe":
        c["rope_parameters"].update(mrope_section=[2, 1, 1], mrope_interleaved=True)
        return tf.Qwen3_5MoeTextConfig(**c), tf.Qwen3_5MoeForCausalLM, True
    raise ValueError(name)


def pin_eager(model):
    """attn eager + experts eager; returns what the config says afterwards."""
    for fn, arg in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        f = getattr(model, fn, None)
        if f is not None:
            try:
                f(arg)
            except Exception as e:  # noqa: BLE001
                print(f"  note: {fn}({arg}) failed: {e}")
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_experts_implementation", "eager") != "eager":
            try:
                cfg._experts_implementation = "eager"
            except Exception as e:  # noqa: BLE001
                print(f"  note: cannot set _experts_implementation: {e}")
    got = (getattr(model.config, "_attn_implementation", None),
           getattr(model.config, "_experts_implementation", None))
    print(f"  attn/experts implementation: {got}")
    return got


def build_model(name, dv, seed):
    cfg, cls, hybrid = make_config(name, dv)
    torch.manual_seed(seed)
    model = None
    for kw in (dict(attn_implementation="eager", experts_implementation="eager"),
               dict(attn_implementation="eager"), {}):
        try:
            model = cls._from_config(cfg, **kw)
            break
        except Exception as e:  # noqa: BLE001  (older/newer kwargs)
            print(f"  note: _from_config({kw}) -> {type(e).__name__}: {e}")
    model = model.to(torch.float32).eval()
    # Randomise every 1-D parameter (norm weights, A_log, dt_bias): the zero-centred norms are
    # initialised to 0, the gated norm to 1, so a plain init would not tell w from 1+w.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.15 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if hybrid:  # bf16-representable values, saved as BF16 losslessly
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model, cfg, hybrid


def prompt_tokens(idx, n):
    g = torch.Generator().manual_seed(1000 + idx)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def greedy(model, toks):
    N_GEN = ARGS.n_gen
    ids = torch.tensor([toks])
    try:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=N_GEN, min_new_tokens=N_GEN, use_cache=True,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        gen = out.sequences[0, len(toks):].tolist()
        step_logits = torch.stack([l[0].float() for l in out.logits])  # [N_GEN, V]
        return gen, step_logits, "generate"
    except Exception:  # noqa: BLE001  (manual loop with the model's own cache)
        traceback.print_exc()
        out = model(ids, use_cache=True)
        pkv, gen, steps = out.past_key_values, [], []
        last = out.logits[0, -1].float()
        for _ in range(N_GEN):
            steps.append(last)
            t = int(torch.argmax(last))
            gen.append(t)
            out = model(torch.tensor([[t]]), past_key_values=pkv, use_cache=True)
            pkv, last = out.past_key_values, out.logits[0, -1].float()
        return gen, torch.stack(steps), "manual-loop"


def run_one(name, outdir, seed, from_dir=None):
    import transformers as tf
    t0 = time.time()
    dv_used = None
    if from_dir:
        model = tf.AutoModelForCausalLM.from_pretrained(from_dir, dtype=torch.float32,
                                                        attn_implementation="eager")
        model.eval()
        hybrid = False
    else:
        model = None
        for dv in (24, 16):  # dv != dk catches transposed state layouts; fall back if HF refuses
            try:
                model, cfg, hybrid = build_model(name, dv, seed)
                dv_used = dv
                with torch.no_grad():
                    model(torch.tensor([[1, 2, 3]]))
                break
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                model = None
        if model is None:
            raise RuntimeError(f"{name}: could not build")
    impl = pin_eager(model)
    d = os.path.join(outdir, "models", name)
    os.makedirs(d, exist_ok=True)

    meta = dict(name=name, arch_class=type(model).__name__, transformers=tf.__version__,
                torch=torch.__version__, device="cpu", dtype_compute="float32",
                implementation=list(impl), seed=seed, vocab=VOCAB, n_gen=ARGS.n_gen,
                linear_value_head_dim=dv_used, prompts=[], from_dir=from_dir)
    logits_f = open(os.path.join(d, "logits.bin"), "wb")
    off = 0
    with torch.no_grad():
        for pi, n in enumerate(ARGS.prompt_lens):
            toks = prompt_tokens(PROMPT_LENS.index(n) if n in PROMPT_LENS else pi, n)
            gen, step_logits, how = greedy(model, toks)
            seq = torch.tensor([toks + gen])
            want_hidden = (pi == HIDDEN_PROMPT) and not ARGS.no_hidden
            out = model(seq, use_cache=False, output_hidden_states=want_hidden)
            full = out.logits[0].float().contiguous()           # [T+N_GEN, V]
            T = len(toks)
            N_GEN = len(gen)
            pred = torch.argmax(full[T - 1:T - 1 + N_GEN], dim=-1).tolist()
            top2 = torch.topk(full, 2, dim=-1).values
            margin = (top2[:, 0] - top2[:, 1])
            cons = float((full[T - 1:T - 1 + N_GEN] - step_logits).abs().max())
            rec = dict(tokens=toks, greedy=gen, greedy_how=how, n_tokens=T + len(gen),
                       logits_offset=off,
                       hf_full_vs_decode_max_abs=cons,
                       hf_full_argmax_matches_greedy=sum(int(a == b) for a, b in zip(pred, gen)),
                       min_top2_margin_gen=float(margin[T - 1:T - 1 + N_GEN].min()),
                       min_top2_margin_all=float(margin.min()),
                       logit_absmax=float(full.abs().max()), logit_std=float(full.std()))
            meta["prompts"].append(rec)
            logits_f.write(full.numpy().astype("<f4").tobytes())
            off += full.numel()
            print(f"  prompt {pi}: T={T} gen via {how}; full-vs-decode max|d|={cons:.3g}; "
                  f"argmax==greedy {rec['hf_full_argmax_matches_greedy']}/{N_GEN}; "
                  f"min margin {rec['min_top2_margin_gen']:.3g}; |logit|max {rec['logit_absmax']:.3g}")
            if want_hidden:
                hs = out.hidden_states
                arr = torch.stack([h[0, :T].float() for h in hs]).contiguous()  # prompt positions only
                with open(os.path.join(d, "hidden.bin"), "wb") as f:
                    f.write(arr.numpy().astype("<f4").tobytes())
                meta["hidden"] = dict(prompt_index=pi, n_states=len(hs), n_tokens=T,
                                      hidden=int(arr.shape[-1]),
                                      note="HF output_hidden_states: [0]=embeddings, [i]=after layer i "
                                           "(the last may already be final-normed, HF version dependent)")
    logits_f.close()

    if not from_dir:
        save = model.to(torch.bfloat16) if hybrid else model
        save.save_pretrained(d, safe_serialization=True)
        meta["saved_dtype"] = "bfloat16" if hybrid else "float32"
    try:
        from safetensors import safe_open
        names = {}
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                with safe_open(os.path.join(d, fn), "pt") as f:
                    for k in f.keys():
                        t = f.get_slice(k)
                        names[k] = [str(t.get_dtype()), list(t.get_shape())]
        meta["tensors"] = names
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"  {name}: done in {time.time() - t0:.1f}s; files: {sorted(os.listdir(d))}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="qwen3moe,qwen3next,qwen35moe")
    ap.add_argument("--from-dir", action="append", default=[], help="NAME=HFDIR")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--prompt-lens", default=",".join(map(str, PROMPT_LENS)),
                    help="prompt lengths (a length of PROMPT_LENS keeps its fixed token ids)")
    ap.add_argument("--n-gen", type=int, default=N_GEN)
    ap.add_argument("--no-hidden", action="store_true", help="do not write hidden.bin")
    a = ap.parse_args()
    a.prompt_lens = [int(x) for x in a.prompt_lens.split(",") if x]
    global ARGS
    ARGS = a
    torch.set_default_dtype(torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    import transformers as tf
    print(f"transformers {tf.__version__}, torch {torch.__version__}")
    jobs = [(n, None) for n in a.only.split(",") if n]
    if a.from_dir:
        jobs = [tuple(s.split("=", 1)) for s in a.from_dir]
    failed = []
    for i, (name, src) in enumerate(jobs):
        print(f"== {name}")
        try:
            run_one(name, a.out, a.seed + 17 * i, src)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed.append(name)
    print("FAILED: " + ",".join(failed) if failed else "ALL OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
