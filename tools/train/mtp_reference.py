#!/usr/bin/env python3
"""PyTorch reference of the default model's MTP logits (the fixture of tests/test_mtp_ref.c).

Loads models/default.gguf's own weights (Q8_0 dequantized exactly as floe holds them: fp16 block
scale x int8 code, exact in float32; F32 tensors as they are) into the model code the default
model was trained with: HF transformers' Qwen3_5MoeForCausalLM (the trunk) and train.py's MTP
module (HF's own Qwen3_5MoeDecoderLayer as its block), float32, eager attention and experts, on
the CPU. Nothing of floe is needed to run it.

GGUF -> HF (the inverse of `floe convert` for qwen35moe): zero-centred norms are stored as 1 + w
(HF holds w: w = stored - 1, exact for stored values in [0.5, 2]); ssm_a = -exp(A_log), so
A_log = log(-ssm_a) (float rounding ~1e-7 relative); conv1d [C][K] -> [C, 1, K]; stacked experts
gate [X][F][E] and up -> gate_up_proj [X, 2F, E] (gate rows first), down [X][E][F]. Every HF
parameter must be matched and of the right shape (strict load): a wrong mapping fails loudly.

For each prompt of T tokens (ids from tests/fixtures/default_model/golden.json, cut to --max-len):
  trunk   h_0..h_{T-1} = the final-normed hidden states; x_T = argmax of the trunk's logits at T-1;
  MTP     rows t = 0..T-1 read (x_{t+1}, h_t) at position t (x_T the trunk's greedy token), as
          floe's prefill + first draft feed them; row T-1's argmax is the first draft d_1;
  chain   row T + j - 1 (j = 1..--chain) reads (d_j, g) where g is the MTP's own normed output at
          the previous row (SGLang / vLLM chaining), at position T + j - 1; its argmax is d_{j+1}.
The attention of the MTP block is causal over these rows (one forward over all of them gives the
same rows as a cache, and appending a row never changes an earlier one).

Output (--out): mtp_ref.json: per prompt the ids, x_T, the drafts, and per MTP row the top-8 ids
and logits, the top-1/top-2 margin, and the logits of a fixed comb of ids (every 509th) so that
the tail of the distribution is checked too.

Usage: python3 tools/train/mtp_reference.py --gguf models/default.gguf \
           --prompts tests/fixtures/default_model/golden.json --out DIR
"""
import argparse
import json
import math
import os
import struct
import sys
import time

T0 = time.time()


def log(m):
    print(f"[{time.time() - T0:6.1f}s] {m}", flush=True)


# ---------------------------------------------------------------------------------------------
# GGUF reader (only what the default model uses: F32, F16, BF16, Q8_0)

GGUF_F32, GGUF_F16, GGUF_Q8_0, GGUF_BF16 = 0, 1, 8, 30


class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def u(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)[0]
        self.o += struct.calcsize("<" + fmt)
        return v

    def s(self):
        n = self.u("Q")
        v = bytes(self.b[self.o:self.o + n]).decode("utf-8", "replace")
        self.o += n
        return v

    def val(self, t):
        scal = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
        if t in scal:
            return self.u(scal[t])
        if t == 8:
            return self.s()
        if t == 9:
            et, n = self.u("I"), self.u("Q")
            return [self.val(et) for _ in range(n)]
        raise ValueError(f"gguf: unknown value type {t}")


def gguf_open(path):
    """Returns (metadata dict, {name: (type, dims (ne order), absolute offset)}, bytes)."""
    with open(path, "rb") as f:
        b = f.read()
    r = Reader(b)
    if bytes(b[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.o = 4
    ver, nt, nkv = r.u("I"), r.u("Q"), r.u("Q")
    if ver not in (2, 3):
        raise ValueError(f"{path}: GGUF version {ver}")
    meta = {}
    for _ in range(nkv):
        k = r.s()
        meta[k] = r.val(r.u("I"))
    infos = []
    for _ in range(nt):
        name = r.s()
        nd = r.u("I")
        dims = [r.u("Q") for _ in range(nd)]
        infos.append((name, r.u("I"), dims, r.u("Q")))
    align = int(meta.get("general.alignment", 32))
    base = (r.o + align - 1) // align * align
    return meta, {n: (t, d, base + o) for n, t, d, o in infos}, b


def gguf_tensor(gg, name):
    """The tensor as float32, torch shape = reversed ne."""
    import torch
    _, tens, b = gg
    if name not in tens:
        raise KeyError(f"GGUF has no tensor {name}")
    t, dims, off = tens[name]
    n = math.prod(dims)
    shape = list(reversed(dims))
    if t == GGUF_F32:
        x = torch.frombuffer(bytearray(b[off:off + 4 * n]), dtype=torch.float32)
    elif t == GGUF_F16:
        x = torch.frombuffer(bytearray(b[off:off + 2 * n]), dtype=torch.float16).float()
    elif t == GGUF_BF16:
        x = torch.frombuffer(bytearray(b[off:off + 2 * n]), dtype=torch.bfloat16).float()
    elif t == GGUF_Q8_0:
        if dims[0] % 32:
            raise ValueError(f"{name}: Q8_0 row of {dims[0]}")
        nb = n // 32
        raw = torch.frombuffer(bytearray(b[off:off + 34 * nb]), dtype=torch.uint8).reshape(nb, 34)
        d = raw[:, :2].contiguous().view(torch.float16).float()
        q = raw[:, 2:].contiguous().view(torch.int8).float()
        x = (q * d).reshape(-1)  # fp16 x int8: exact in float32
    else:
        raise ValueError(f"{name}: GGUF type {t} not handled")
    return x.reshape(shape).clone()


# ---------------------------------------------------------------------------------------------
# GGUF -> HF names

ZC_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
            "self_attn.k_norm.weight")
DIRECT = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
}


def layer_tensor(gg, l, sfx):
    """HF per-layer suffix of layer l (l = n_layer: the MTP block) -> float32 tensor."""
    import torch
    names = gg[1]
    pre = f"blk.{l}."
    if sfx in ZC_NORMS:
        g = "attn_norm.weight" if sfx.startswith("input") else None
        if sfx.startswith("post"):
            g = "post_attention_norm.weight" if pre + "post_attention_norm.weight" in names else "ffn_norm.weight"
        if "q_norm" in sfx:
            g = "attn_q_norm.weight"
        if "k_norm" in sfx:
            g = "attn_k_norm.weight"
        return gguf_tensor(gg, pre + g) - 1.0
    if sfx == "linear_attn.A_log":
        return torch.log(-gguf_tensor(gg, pre + "ssm_a"))
    if sfx in DIRECT:
        return gguf_tensor(gg, pre + DIRECT[sfx])
    if sfx == "mlp.experts.gate_up_proj":
        return torch.cat([gguf_tensor(gg, pre + "ffn_gate_exps.weight"), gguf_tensor(gg, pre + "ffn_up_exps.weight")], 1)
    if sfx == "mlp.experts.down_proj":
        return gguf_tensor(gg, pre + "ffn_down_exps.weight")
    if sfx.startswith("mlp.experts.") and sfx.endswith("_proj.weight"):  # per-expert layout
        e, w = sfx[len("mlp.experts."):].split(".", 1)
        return gguf_tensor(gg, pre + {"gate_proj.weight": "ffn_gate_exps.weight", "up_proj.weight": "ffn_up_exps.weight",
                                      "down_proj.weight": "ffn_down_exps.weight"}[w])[int(e)]
    raise KeyError(f"layer {l}: no GGUF mapping for {sfx}")


def load_into(module, get, what):
    """Fills every parameter / buffer of module's state dict through get(name) (shape-checked)."""
    sd = module.state_dict()
    params = dict(module.named_parameters())
    new, missing = {}, []
    for k, v in sd.items():
        try:
            t = get(k)
        except KeyError as e:
            if k not in params:  # a buffer (rotary tables): the module's own value
                new[k] = v
                continue
            missing.append(str(e))
            continue
        if t.numel() != v.numel():
            raise ValueError(f"{what} {k}: GGUF gives {tuple(t.shape)}, the model wants {tuple(v.shape)}")
        if tuple(t.shape) != tuple(v.shape):
            if t.dim() > 1 and v.dim() > 1 and "conv1d" not in k and "shared_expert_gate" not in k:
                raise ValueError(f"{what} {k}: GGUF gives {tuple(t.shape)}, the model wants {tuple(v.shape)}")
            t = t.reshape(v.shape)
        new[k] = t.to(v.dtype)
    if missing:
        raise SystemExit(f"{what}: {len(missing)} parameters without a GGUF source:\n  " + "\n  ".join(missing))
    module.load_state_dict(new, strict=True)
    return len(new)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="models/default.gguf")
    ap.add_argument("--prompts", default="tests/fixtures/default_model/golden.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=40)
    ap.add_argument("--chain", type=int, default=3, help="chained draft rows after the first draft")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--comb", type=int, default=509, help="also record the logits of every COMB-th id")
    a = ap.parse_args()

    import torch
    torch.set_num_threads(max(1, min(16, os.cpu_count() or 1)))
    torch.backends.cuda.matmul.allow_tf32 = False
    import transformers as tf
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train  # the default model's own model code (dims, MTP module, impl switches)

    gg = gguf_open(a.gguf)
    meta = gg[0]
    arch = meta["general.architecture"]
    n_layer = int(meta[f"{arch}.block_count"]) - int(meta.get(f"{arch}.nextn_predict_layers", 0))
    log(f"{a.gguf}: {arch}, {len(gg[1])} tensors, {n_layer} trunk layers")
    dims = train.model_dims()
    eot = int(meta.get("tokenizer.ggml.eos_token_id", 8183))
    dims.update(eos_token_id=eot, pad_token_id=eot, bos_token_id=None)
    if dims["num_hidden_layers"] != n_layer:
        raise SystemExit(f"train.py's dims have {dims['num_hidden_layers']} layers, the GGUF {n_layer}")
    cfg = tf.Qwen3_5MoeTextConfig(**dims)
    try:
        model = tf.Qwen3_5MoeForCausalLM._from_config(cfg, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001
        log(f"note: _from_config(eager) -> {type(e).__name__}: {e}")
        model = tf.Qwen3_5MoeForCausalLM._from_config(cfg)
    model.float()
    impl = train.set_impl(model, attn="eager", experts="eager")
    cfg = model.config
    full_idx = cfg.layer_types.index("full_attention")
    mtp = train.build_mtp_class()(cfg, full_idx).float()

    def trunk_get(k):
        if k == "model.embed_tokens.weight":
            return gguf_tensor(gg, "token_embd.weight")
        if k == "lm_head.weight":
            return gguf_tensor(gg, "output.weight")
        if k == "model.norm.weight":
            return gguf_tensor(gg, "output_norm.weight") - 1.0
        if k.startswith("model.layers."):
            l, sfx = k[len("model.layers."):].split(".", 1)
            return layer_tensor(gg, int(l), sfx)
        raise KeyError(f"trunk: no GGUF mapping for {k}")

    def mtp_get(k):
        pre = f"blk.{n_layer}.nextn."
        if k == "fc.weight":
            return gguf_tensor(gg, pre + "eh_proj.weight")
        for hf, g in (("pre_fc_norm_embedding.weight", "enorm.weight"), ("pre_fc_norm_hidden.weight", "hnorm.weight"),
                      ("norm.weight", "shared_head_norm.weight")):
            if k == hf:
                return gguf_tensor(gg, pre + g) - 1.0
        if k.startswith("layers.0."):
            return layer_tensor(gg, n_layer, k[len("layers.0."):])
        raise KeyError(f"mtp: no GGUF mapping for {k}")

    n1 = load_into(model, trunk_get, "trunk")
    n2 = load_into(mtp, mtp_get, "mtp")
    model.eval()
    mtp.eval()
    log(f"loaded {n1} trunk + {n2} MTP tensors from the GGUF; implementation {impl}")

    # the rotary tables and the causal mask of the trunk's full-attention layer (as train.py's Runner)
    ctx = {}

    def pre_hook(module, args, kwargs):
        ctx["pe"], ctx["mask"] = kwargs.get("position_embeddings"), kwargs.get("attention_mask")

    model.model.layers[full_idx].register_forward_pre_hook(pre_hook, with_kwargs=True)

    with open(a.prompts) as f:
        src = json.load(f)
    gold = src["prompts"][:a.n_prompts]
    prompts = [list(p["tokens"])[:a.max_len] for p in gold]
    trunk_err = append_err = 0.0
    res = dict(torch=torch.__version__, transformers=tf.__version__, dtype="float32", implementation=list(impl),
               gguf=os.path.basename(a.gguf), top=a.top, comb=a.comb, chain=a.chain, prompts=[])
    V = cfg.vocab_size
    comb = list(range(0, V, a.comb))
    with torch.no_grad():
        for toks in prompts:
            T, C = len(toks), a.chain
            # the trunk over T + C tokens: rows < T are the prompt's (causal), the rest only
            # provide rotary tables and a mask long enough for the chained MTP rows
            x = torch.tensor([toks + [0] * (C + 1)])
            ctx.clear()
            out = model.model(input_ids=x, use_cache=False)
            h = out.last_hidden_state[:, :T]
            tl = model.lm_head(h)[0, T - 1]
            xT = int(torch.argmax(tl))
            L = x.shape[1]
            if ctx.get("pe") is None:  # the layer got its rotary tables positionally: recompute them
                pos = torch.arange(L).view(1, 1, -1).expand(3, 1, -1)
                ctx["pe"] = model.model.rotary_emb(out.last_hidden_state, pos)
            cos, sin = ctx["pe"]
            mask = ctx.get("mask")
            if mask is None or not hasattr(mask, "dim") or mask.dim() != 4:
                log(f"note: the layer's mask is {type(mask).__name__}: an additive causal mask of our own")
                mask = torch.full((L, L), float("-inf")).triu(1)[None, None]
            # the GGUF -> HF load against HF's own golden logits (same prompt prefix, causal)
            full = model.lm_head(h)[0]
            for pos in range(T):
                ids = gold[len(res["prompts"])]["top_ids"][pos]
                ref = torch.tensor(gold[len(res["prompts"])]["top_vals"][pos])
                trunk_err = max(trunk_err, float((full[pos, ids] - ref).abs().max()))
            emb_ids = toks[1:] + [xT]
            hin = h[0]
            rows_logits = None
            drafts = []
            for j in range(C + 1):
                n = T + j
                pe = (cos[:, :n], sin[:, :n]) if cos.dim() == 3 else (cos[..., :n, :], sin[..., :n, :])
                emb = model.model.embed_tokens(torch.tensor([emb_ids]))
                g = mtp(emb, hin[None], pe, mask[:, :, :n, :n])
                lg = model.lm_head(g)[0]
                if rows_logits is not None:  # appending a row must not change the earlier ones
                    append_err = max(append_err, float((lg[:-1] - rows_logits).abs().max()))
                rows_logits = lg
                dj = int(torch.argmax(lg[-1]))
                drafts.append(dj)
                emb_ids = emb_ids + [dj]
                hin = torch.cat([hin, g[0, -1:]], 0)
            top = torch.topk(rows_logits, a.top, dim=-1)
            rec = dict(tokens=toks, next=xT, drafts=drafts[:C + 1], n_rows=T + C,
                       top_ids=top.indices.tolist(), top_vals=[[float(v) for v in r] for r in top.values],
                       margin=[float(r[0] - r[1]) for r in top.values],
                       comb_vals=[[float(v) for v in r] for r in rows_logits[:, comb]],
                       logit_absmax=float(rows_logits.abs().max()))
            res["prompts"].append(rec)
            log(f"prompt T={T}: x_T {xT}, drafts {drafts}, rows {T + C}, min margin {min(rec['margin']):.3g}, "
                f"|logit|max {rec['logit_absmax']:.3g}")
    res["trunk_vs_golden_max_abs"] = trunk_err
    res["rows_change_on_append_max_abs"] = append_err
    log(f"MTP rows recomputed with one more row appended: max |diff| {append_err:.3g} (causal: ~0)")
    log(f"trunk logits vs golden.json (HF on the same values, earlier run): max |diff| {trunk_err:.3g}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "mtp_ref.json"), "w") as f:
        json.dump(res, f)
    log(f"wrote {os.path.join(a.out, 'mtp_ref.json')}")
    if trunk_err > 5e-3:
        log("the trunk does not reproduce golden.json: the GGUF -> HF mapping is wrong")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
