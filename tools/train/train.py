#!/usr/bin/env python3
"""Train floe's embedded default model: a small Qwen3.5-MoE coder with one MTP module.

One run on the GPU machine does everything (tools/train/README.md says how to re-run):
  1. corpus    Python source files found on the machine (stdlib + installed packages), de-duplicated by
               content hash, ordered by hash, 2 % of FILES held out (hash-based, deterministic);
  2. tokenizer byte-level BPE (tokenizers library): Qwen3.5's pre-tokenizer regex as a Split
               pre-tokenizer + ByteLevel, ~8k vocabulary, ChatML / thinking / tool-call added tokens;
  3. model     HF transformers' Qwen3_5MoeForCausalLM (qwen3_5_moe_text: GatedDeltaNet + gated full
               attention 3:1, MoE with a shared expert) plus ONE MTP module (MTP below) that reuses HF's
               Qwen3_5MoeDecoderLayer as a full-attention layer and shares embed_tokens / lm_head;
  4. training  loss = next-token CE + MTP_WEIGHT * MTP CE (token t+2) + router_aux_loss_coef * HF's
               load-balancing loss over every router (trunk + MTP); bf16 autocast; stops on a
               wall-clock deadline (--budget) with time left to export and evaluate;
  5. export    HF directory (config.json, model.safetensors in BF16 incl. mtp.*, tokenizer.json,
               tokenizer_config.json with a ChatML template) -- written BEFORE the evaluation;
  6. eval      held-out perplexity (the BF16 weights, float32 compute), MTP top-1 agreement with the
               main model's next-next token, expert-routing statistics, sample completions -> stats.json.

Usage: python3 train.py --out DIR [--budget SECONDS] [--steps N] [--seed S]
"""
import argparse
import hashlib
import json
import math
import os
import site
import sys
import sysconfig
import time
import traceback

T0 = time.time()
LOG = []


def log(msg):
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


# ----------------------------------------------------------------------------------------------
# constants

# Qwen3.5's pre-tokenizer regex, byte for byte the one floe recognises (src/tok/tokenizer.c
# JSON_RE_QWEN35; floe writes tokenizer.ggml.pre = "qwen35" for this architecture). It is Qwen2's
# regex with combining marks (\p{M}) added to the letter runs.
PRE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
             r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]                  # special: true
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB = 8192
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

MAX_FILE_BYTES = 100_000
MIN_FILE_BYTES = 64
HELDOUT_MOD = 50            # int(sha256[:8], 16) % 50 == 0  ->  held out (2 % of files)


def model_dims():
    """The architecture (qwen3_5_moe_text). Nk == Nv for the DeltaNet heads, so no value-head
    reordering happens anywhere (floe convert keeps HF's row order: the quantized references are
    then a plain per-row round trip)."""
    return dict(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=8,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=4, linear_num_value_heads=4,
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=64,
        shared_expert_intermediate_size=256,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        initializer_range=0.02, hidden_act="silu", attention_bias=False, attention_dropout=0.0,
        router_aux_loss_coef=0.01, output_router_logits=False, use_cache=True,
        partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [4, 2, 2], "mrope_interleaved": True},
    )


MTP_WEIGHT = 0.3


# ----------------------------------------------------------------------------------------------
# 1. corpus

def source_roots():
    roots = set()
    paths = sysconfig.get_paths()
    for k in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(k):
            roots.add(paths[k])
    try:
        roots.update(site.getsitepackages())
    except Exception:  # noqa: BLE001
        pass
    for p in sys.path:
        if p and os.path.isdir(p):
            roots.add(p)
    out = sorted({os.path.realpath(r) for r in roots if os.path.isdir(r)})
    # drop roots nested in another root (their files are walked anyway)
    keep = []
    for r in out:
        if not any(r != o and r.startswith(o.rstrip("/") + "/") for o in out):
            keep.append(r)
    return keep


def usable_text(raw):
    if len(raw) < MIN_FILE_BYTES or len(raw) > MAX_FILE_BYTES or b"\0" in raw:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n")
    if max((len(line) for line in text.split("\n")), default=0) > 1000:  # minified / data blobs
        return None
    return text


def build_corpus(roots, max_train_bytes):
    """-> (train_docs, heldout_docs, info); docs are (sha256 hex, text), ordered by hash."""
    seen = {}
    n_files = n_dup = n_bad = 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                p = os.path.join(dirpath, fn)
                try:
                    if os.path.islink(p) or os.path.getsize(p) > MAX_FILE_BYTES:
                        n_bad += 1
                        continue
                    with open(p, "rb") as f:
                        raw = f.read()
                except OSError:
                    n_bad += 1
                    continue
                n_files += 1
                text = usable_text(raw)
                if text is None:
                    n_bad += 1
                    continue
                h = hashlib.sha256(text.encode("utf-8")).hexdigest()
                if h in seen:
                    n_dup += 1
                    continue
                seen[h] = text
    hashes = sorted(seen)
    train, held = [], []
    tb = 0
    for h in hashes:
        if int(h[:8], 16) % HELDOUT_MOD == 0:
            held.append((h, seen[h]))
        elif tb < max_train_bytes:
            train.append((h, seen[h]))
            tb += len(seen[h].encode("utf-8"))
    info = dict(roots=roots, files_seen=n_files, unique=len(hashes), duplicates=n_dup, skipped=n_bad,
                train_files=len(train), train_bytes=tb, heldout_files=len(held),
                heldout_bytes=sum(len(t.encode("utf-8")) for _, t in held),
                unique_not_used=len(hashes) - len(train) - len(held),
                rule=f"*.py, {MIN_FILE_BYTES}..{MAX_FILE_BYTES} bytes, UTF-8, no NUL, lines <= 1000 chars, CRLF->LF; "
                     f"dedup by sha256 of the text; ordered by hash; held out: int(sha[:8],16) % {HELDOUT_MOD} == 0; "
                     f"train capped at {max_train_bytes} bytes in hash order")
    return train, held, info


# ----------------------------------------------------------------------------------------------
# 2. tokenizer

def train_tokenizer(docs, sample_bytes):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    n_added = len(SPECIAL) + len(ADDED)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - n_added, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    sample, nb = [], 0
    for _, t in docs:
        if nb >= sample_bytes:
            break
        sample.append(t)
        nb += len(t)
    tok.train_from_iterator(sample, trainer=trainer, length=len(sample))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED])
    return tok, dict(sample_docs=len(sample), sample_bytes=nb)


def encode_docs(tok, docs, eot):
    import numpy as np
    enc = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    parts = []
    n = 0
    B = 512
    for i in range(0, len(docs), B):
        texts = [t for _, t in docs[i:i + B]]
        for e in enc(texts, add_special_tokens=False):
            a = np.asarray(e.ids, dtype=np.uint16)
            parts.append(a)
            parts.append(np.asarray([eot], dtype=np.uint16))
            n += len(a) + 1
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def pick_prompts(held, n):
    """Held-out prompts: up to 8 lines ending with a `def` line (ASCII only), + a newline."""
    out = []
    for h, text in held:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            s = line.lstrip()
            if s.startswith("def ") and s.rstrip().endswith(":") and i + 1 < len(lines) and i >= 2:
                lo = max(0, i - 8)
                p = "\n".join(lines[lo:i + 1]) + "\n"
                while len(p) > 400 and "\n" in p[:-1]:
                    p = p[p.index("\n") + 1:]
                if p.isascii() and len(p.strip()) > 20:
                    out.append(dict(sha256=h, text=p))
                break
        if len(out) >= n:
            break
    return out


# ----------------------------------------------------------------------------------------------
# 3. model pieces (torch)

def fast_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                                output_final_state=False, use_qk_l2norm_in_kernel=False, **kwargs):
    """Chunked gated delta rule for TRAINING speed (same math as HF's torch fallback, written with
    triangular solves instead of a per-row loop). Recurrence per value head (S: [dk, dv]):
        S <- S * exp(g_t);  d_t = beta_t (v_t - S^T k_t);  S <- S + k_t d_t^T;  o_t = S^T q_t
    Within a chunk with cumulative log decay G_t and entry state S0:
        (I + A) d = beta*v - beta*exp(G)*K S0,  A_tj = beta_t exp(G_t - G_j) k_t.k_j  (j < t)
        O = (Q*exp(G)) S0 + (QK^T * exp(G_t - G_j), j <= t) d
        S_end = exp(G_last) S0 + (K * exp(G_last - G))^T d
    Checked against HF's function before use (main()); HF's own function is restored for eval."""
    import torch
    import torch.nn.functional as F
    out_dtype = query.dtype
    B, T, Hk, Dk = key.shape
    Hv, Dv = value.shape[-2:]
    if Hk != Hv:
        query = query.repeat_interleave(Hv // Hk, dim=2)
        key = key.repeat_interleave(Hv // Hk, dim=2)
    q, k, v = (x.transpose(1, 2).float() for x in (query, key, value))      # [B,H,T,D]
    b = beta.transpose(1, 2).float()
    gg = g.transpose(1, 2).float()                                           # [B,H,T]
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (Dk ** -0.5)
    C = chunk_size
    pad = (-T) % C
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        b, gg = F.pad(b, (0, pad)), F.pad(gg, (0, pad))
    n = (T + pad) // C
    q = q.reshape(B, Hv, n, C, Dk)
    k = k.reshape(B, Hv, n, C, Dk)
    v = v.reshape(B, Hv, n, C, Dv)
    b = b.reshape(B, Hv, n, C)
    G = gg.reshape(B, Hv, n, C).cumsum(-1)
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()        # j <= t
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)    # j < t
    diff = G.unsqueeze(-1) - G.unsqueeze(-2)                                 # [.., t, j] = G_t - G_j
    decay = torch.where(incl, diff, torch.full_like(diff, float("-inf"))).exp()
    kb = k * b.unsqueeze(-1)
    A = ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    L = A + torch.eye(C, dtype=A.dtype, device=A.device)
    U = torch.linalg.solve_triangular(L, v * b.unsqueeze(-1), upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(L, kb * G.exp().unsqueeze(-1), upper=False, unitriangular=True)
    QK = (q @ k.transpose(-1, -2)) * decay
    qg = q * G.exp().unsqueeze(-1)
    glast = G[..., -1:]                                                      # [B,H,n,1]
    kg = k * (glast - G).exp().unsqueeze(-1)
    cd = glast.exp().unsqueeze(-1)                                           # [B,H,n,1,1]
    if initial_state is None:
        S = torch.zeros(B, Hv, Dk, Dv, dtype=q.dtype, device=q.device)
    else:
        S = initial_state.to(q.dtype)
    outs = []
    for i in range(n):
        d = U[:, :, i] - W[:, :, i] @ S
        outs.append(qg[:, :, i] @ S + QK[:, :, i] @ d)
        S = S * cd[:, :, i] + kg[:, :, i].transpose(-1, -2) @ d
    o = torch.stack(outs, dim=2).reshape(B, Hv, n * C, Dv)[:, :, :T]
    o = o.transpose(1, 2).contiguous().to(out_dtype)
    return o, (S if output_final_state else None)


def naive_gated_delta_rule(query, key, value, g, beta):
    """Token-by-token recurrence (tests only)."""
    import torch
    B, T, H, Dk = key.shape
    Dv = value.shape[-1]
    q = query.float() * torch.rsqrt((query.float() ** 2).sum(-1, keepdim=True) + 1e-6) * Dk ** -0.5
    k = key.float() * torch.rsqrt((key.float() ** 2).sum(-1, keepdim=True) + 1e-6)
    S = torch.zeros(B, H, Dk, Dv, dtype=torch.float32)
    out = torch.zeros(B, T, H, Dv)
    for t in range(T):
        S = S * g[:, t].float().exp()[..., None, None]
        kv = (S * k[:, t, :, :, None]).sum(-2)
        d = (value[:, t].float() - kv) * beta[:, t].float()[..., None]
        S = S + k[:, t, :, :, None] * d[:, :, None, :]
        out[:, t] = (S * q[:, t, :, :, None]).sum(-2)
    return out, S


def aux_balance_loss(router_logits, n_experts, top_k):
    """HF's load_balancing_loss_func over the concatenation of every router's logits:
    E * sum_e f_e * P_e, f_e = top-k assignments of e per row, P_e = mean router probability."""
    import torch
    cat = torch.cat([r.float() for r in router_logits], dim=0)
    p = torch.softmax(cat, dim=-1)
    _, sel = torch.topk(p, top_k, dim=-1)
    f = torch.zeros(n_experts, device=cat.device, dtype=torch.float32)
    f = f.scatter_add(0, sel.reshape(-1), torch.ones(sel.numel(), device=cat.device)) / cat.shape[0]
    P = p.mean(0)
    return n_experts * (f * P).sum()


def routing_stats(router_inputs, router_logits, router_weights, B, T, k, E):
    """router_inputs[L]: [B*T, H] MoE input of trunk layer L; router_logits[L]: [B*T, E];
    router_weights[L]: [E, H]. Returns per-layer repeat and cross-layer prediction figures."""
    import torch
    sel = []
    for lg in router_logits:
        idx = torch.topk(torch.softmax(lg.float(), -1), k, dim=-1).indices.view(B, T, k)
        oh = torch.zeros(B, T, E, dtype=torch.bool, device=lg.device)
        oh.scatter_(2, idx, True)
        sel.append(oh)
    per_layer = []
    for L, oh in enumerate(sel):
        ov = (oh[:, :-1] & oh[:, 1:]).sum(-1).float()                       # |S_t ∩ S_t+1|
        load = oh.float().sum((0, 1)) / (B * T * k)
        per_layer.append(dict(layer=L, repeat_overlap_mean=float(ov.mean() / k),
                              repeat_all_k=float((ov == k).float().mean()),
                              repeat_at_least_half=float((ov >= k / 2).float().mean()),
                              random_baseline=k / E,
                              load_max_over_mean=float(load.max() * E), load_min_over_mean=float(load.min() * E),
                              load_cv=float(load.std() / load.mean()), dead_experts=int((load == 0).sum())))
    cross = []
    for L in range(len(sel) - 1):
        pred_logits = router_inputs[L].float() @ router_weights[L + 1].float().t()
        actual = sel[L + 1].view(B * T, E)
        rec = {}
        for m in (k, 2 * k):
            pi = torch.topk(pred_logits, m, dim=-1).indices
            ph = torch.zeros(B * T, E, dtype=torch.bool, device=pi.device)
            ph.scatter_(1, pi, True)
            hit = (ph & actual).sum(-1).float()
            rec[f"predict_{m}"] = dict(precision=float(hit.mean() / m), recall=float(hit.mean() / k),
                                       all_k_covered=float((hit == k).float().mean()))
        cross.append(dict(from_layer=L, to_layer=L + 1, **rec))
    return per_layer, cross


def build_mtp_class():
    import torch
    from torch import nn
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M

    class MTP(nn.Module):
        """Qwen3.5's MTP module (reference/qwen-models.md §2e). State-dict names under "mtp." are
        Qwen3.5's: pre_fc_norm_embedding, pre_fc_norm_hidden, fc [H, 2H], layers.0.* (a full-attention
        MoE decoder layer, HF's own class), norm. embed_tokens and lm_head are the trunk's."""

        def __init__(self, config, full_layer_idx):
            super().__init__()
            H = config.hidden_size
            self.pre_fc_norm_embedding = M.Qwen3_5MoeRMSNorm(H, eps=config.rms_norm_eps)
            self.pre_fc_norm_hidden = M.Qwen3_5MoeRMSNorm(H, eps=config.rms_norm_eps)
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.layers = nn.ModuleList([M.Qwen3_5MoeDecoderLayer(config, full_layer_idx)])
            self.norm = M.Qwen3_5MoeRMSNorm(H, eps=config.rms_norm_eps)

        def forward(self, emb_next, h, position_embeddings, attention_mask):
            """emb_next: embed(token t+1) [B,T',H]; h: trunk's final-normed hidden at t [B,T',H]."""
            u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(h)], dim=-1))
            u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=attention_mask,
                               position_ids=None, past_key_values=None, use_cache=False)
            if isinstance(u, tuple):
                u = u[0]
            return self.norm(u)

    return MTP


def init_mtp(mtp, std, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if p.ndim == 1 and ("norm" in name):
                p.zero_()                                  # zero-centred norms: 1 + w
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


# ----------------------------------------------------------------------------------------------

class Runner:
    """The trunk + MTP forward with the captured per-step context (rotary, mask, router logits)."""

    def __init__(self, model, mtp, cfg):
        self.model, self.mtp, self.cfg = model, mtp, cfg
        self.ctx = {}
        self.router_logits = []
        self.router_inputs = []
        self.keep_inputs = False
        self.full_idx = cfg.layer_types.index("full_attention")
        self.hooks = []
        self.hooks.append(model.model.layers[self.full_idx].register_forward_pre_hook(self._pre, with_kwargs=True))
        for layer in list(model.model.layers) + list(mtp.layers):
            self.hooks.append(layer.mlp.gate.register_forward_hook(self._router))

    def _pre(self, module, args, kwargs):
        self.ctx["pe"] = kwargs.get("position_embeddings")
        self.ctx["mask"] = kwargs.get("attention_mask")
        return None

    def _router(self, module, inputs, output):
        lg = output[0] if isinstance(output, (tuple, list)) else output
        self.router_logits.append(lg)
        if self.keep_inputs:
            self.router_inputs.append(inputs[0].reshape(-1, inputs[0].shape[-1]).detach())

    def forward(self, x, with_mtp=True):
        """x: [B, T] ids. Returns (logits [B,T,V], mtp_logits [B,T-1,V] or None, h)."""
        import torch
        self.router_logits, self.router_inputs = [], []
        out = self.model.model(input_ids=x, use_cache=False)
        h = out.last_hidden_state
        logits = self.model.lm_head(h)
        if not with_mtp:
            return logits, None, h
        T = x.shape[1]
        pe = self.ctx.get("pe")
        if pe is None:  # the layer got its rotary tables positionally: recompute them
            pos = torch.arange(T, device=x.device).view(1, 1, -1).expand(3, x.shape[0], -1)
            pe = self.model.model.rotary_emb(h, pos)
        cos, sin = pe
        pe = (cos[:, :T - 1], sin[:, :T - 1]) if cos.dim() == 3 else (cos[..., :T - 1, :], sin[..., :T - 1, :])
        mask = self.ctx["mask"]
        if mask is not None and hasattr(mask, "dim") and mask.dim() == 4:
            mask = mask[:, :, :T - 1, :T - 1]
        emb = self.model.model.embed_tokens(x[:, 1:])
        hm = self.mtp(emb, h[:, :-1], pe, mask)
        return logits, self.model.lm_head(hm), h


def set_impl(model, attn=None, experts=None):
    for fn, arg in (("set_attn_implementation", attn), ("set_experts_implementation", experts)):
        if arg is None:
            continue
        f = getattr(model, fn, None)
        if f is None:
            log(f"note: model has no {fn}")
            continue
        try:
            f(arg)
        except Exception as e:  # noqa: BLE001
            log(f"note: {fn}({arg}) failed: {type(e).__name__}: {e}")
    return (getattr(model.config, "_attn_implementation", None), getattr(model.config, "_experts_implementation", None))


def count_params(mod):
    return sum(p.numel() for p in mod.parameters())


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=560.0, help="wall seconds for the whole script")
    ap.add_argument("--post-reserve", type=float, default=80.0, help="seconds kept for export + eval")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (default: from the measured speed)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-train-mb", type=float, default=200.0)
    ap.add_argument("--tok-sample-mb", type=float, default=40.0)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--no-fast-gdn", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    exp_dir = os.path.join(a.out, "export")
    os.makedirs(exp_dir, exist_ok=True)
    stats = dict(args=vars(a))
    deadline_all = T0 + a.budget

    def save_stats():
        stats["log_tail"] = LOG[-400:]
        with open(os.path.join(a.out, "stats.json"), "w") as f:
            json.dump(stats, f, indent=1)

    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers as tf
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as M
    stats["versions"] = dict(torch=torch.__version__, transformers=tf.__version__, python=sys.version.split()[0],
                             gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    log(f"versions {stats['versions']}")
    dev = torch.device("cuda")

    # ---- 1. corpus
    roots = source_roots()
    log(f"roots: {roots}")
    train_docs, held_docs, cinfo = build_corpus(roots, int(a.max_train_mb * 1e6))
    stats["corpus"] = cinfo
    log(f"corpus: {json.dumps({k: v for k, v in cinfo.items() if k != 'rule'})}")
    save_stats()

    # ---- 2. tokenizer
    tok, tinfo = train_tokenizer(train_docs, int(a.tok_sample_mb * 1e6))
    V = tok.get_vocab_size(with_added_tokens=True)
    eot = tok.token_to_id("<|endoftext|>")
    tinfo.update(vocab=V, eot=eot, ids={s: tok.token_to_id(s) for s in SPECIAL + ADDED}, regex=PRE_REGEX)
    log(f"tokenizer: {tinfo}")
    if V > VOCAB:
        raise SystemExit(f"vocab {V} > {VOCAB}")
    tok.save(os.path.join(exp_dir, "tokenizer.json"))
    train_ids = encode_docs(tok, train_docs, eot)
    held_ids = encode_docs(tok, held_docs, eot)
    tinfo["train_tokens"] = int(len(train_ids))
    tinfo["heldout_tokens"] = int(len(held_ids))
    tinfo["train_bytes_per_token"] = cinfo["train_bytes"] / max(1, len(train_ids))
    tinfo["heldout_bytes_per_token"] = cinfo["heldout_bytes"] / max(1, len(held_ids))
    stats["tokenizer"] = tinfo
    log(f"tokens: train {len(train_ids)}, heldout {len(held_ids)}; bytes/token {tinfo['train_bytes_per_token']:.2f}")
    prompts = pick_prompts(held_docs, 5)
    for p in prompts:
        p["ids"] = tok.encode(p["text"], add_special_tokens=False).ids
    stats["prompts"] = prompts
    # held-out evaluation windows, evenly spread over the held-out stream (saved for the reference run)
    S = a.seq
    nwin = min(a.eval_windows, max(1, (len(held_ids) - 1) // (S + 1)))
    span = len(held_ids) - (S + 1)
    starts = [int(i * span / max(1, nwin - 1)) for i in range(nwin)] if nwin > 1 else [0]
    ev = np.stack([held_ids[s:s + S + 1] for s in starts]).astype(np.uint16)
    ev.tofile(os.path.join(exp_dir, "heldout_eval_u16.bin"))
    stats["eval_set"] = dict(windows=int(nwin), seq=S + 1, file="heldout_eval_u16.bin (uint16 [windows][seq+1])")
    del train_docs
    save_stats()

    # ---- 3. model
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)
    dims = model_dims()
    dims.update(vocab_size=VOCAB, eos_token_id=eot, pad_token_id=eot, bos_token_id=None)
    cfg = tf.Qwen3_5MoeTextConfig(**dims)
    model = None
    for kw in (dict(attn_implementation="sdpa"), {}):
        try:
            model = tf.Qwen3_5MoeForCausalLM._from_config(cfg, **kw)
            break
        except Exception as e:  # noqa: BLE001
            log(f"note: _from_config({kw}) -> {type(e).__name__}: {e}")
    cfg = model.config
    MTP = build_mtp_class()
    full_idx = cfg.layer_types.index("full_attention")
    mtp = MTP(cfg, full_idx)
    init_mtp(mtp, cfg.initializer_range, a.seed + 7)
    model.to(dev)
    mtp.to(dev)
    n_main, n_mtp = count_params(model), count_params(mtp)
    E, K = cfg.num_experts, cfg.num_experts_per_tok
    per_exp = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    n_layers_all = cfg.num_hidden_layers + 1
    active = n_main + n_mtp - (E - K) * per_exp * n_layers_all - VOCAB * cfg.hidden_size  # minus idle experts, embedding rows
    stats["params"] = dict(main=n_main, mtp=n_mtp, total=n_main + n_mtp, active_per_token_approx=active)
    log(f"params: main {n_main}, mtp {n_mtp}, total {n_main + n_mtp}")
    if n_main + n_mtp > 25_000_000:
        raise SystemExit("more than 25M parameters")
    runner = Runner(model, mtp, cfg)

    # fast GDN for training (checked against HF's function first)
    orig_gdr = M.torch_chunk_gated_delta_rule
    patched = False
    if not a.no_fast_gdn:
        try:
            g = torch.Generator(device="cpu").manual_seed(5)
            Bq, Tq, Hq, D = 2, 150, 4, 64
            qq = torch.randn(Bq, Tq, Hq, D, generator=g).to(dev)
            kk = torch.randn(Bq, Tq, Hq, D, generator=g).to(dev)
            vv = torch.randn(Bq, Tq, Hq, D, generator=g).to(dev)
            gl = (-torch.rand(Bq, Tq, Hq, generator=g) * 0.5).to(dev)
            bt = torch.rand(Bq, Tq, Hq, generator=g).to(dev)
            torch.backends.cuda.matmul.allow_tf32 = False
            r1, s1 = orig_gdr(qq, kk, vv, g=gl, beta=bt, initial_state=None, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
            r2, s2 = fast_chunk_gated_delta_rule(qq, kk, vv, g=gl, beta=bt, initial_state=None,
                                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
            d1 = float((r1 - r2).abs().max())
            d2 = float((s1 - s2).abs().max())
            log(f"fast GDN vs HF: max|d out| {d1:.3g}, max|d state| {d2:.3g} (|out|max {float(r1.abs().max()):.3g})")
            if d1 < 2e-3 and d2 < 2e-3:
                M.torch_chunk_gated_delta_rule = fast_chunk_gated_delta_rule
                for mod in model.modules():
                    if hasattr(mod, "chunk_gated_delta_rule"):
                        mod.chunk_gated_delta_rule = fast_chunk_gated_delta_rule
                patched = True
            stats["fast_gdn_check"] = dict(max_abs_out=d1, max_abs_state=d2, used=patched)
        except Exception:  # noqa: BLE001
            log("fast GDN check failed:\n" + traceback.format_exc())

    def unpatch():
        M.torch_chunk_gated_delta_rule = orig_gdr
        for mod in model.modules():
            if hasattr(mod, "chunk_gated_delta_rule") and mod.chunk_gated_delta_rule is fast_chunk_gated_delta_rule:
                mod.chunk_gated_delta_rule = orig_gdr

    # ---- 4. training
    data = torch.from_numpy(train_ids.astype(np.int32)).to(dev)
    N = data.numel()
    gen = torch.Generator(device=dev).manual_seed(a.seed + 1)
    ar = torch.arange(S + 1, device=dev)

    def batch():
        st = torch.randint(0, N - S - 1, (a.batch,), device=dev, generator=gen)
        return data[st[:, None] + ar].long()

    params = list(model.parameters()) + list(mtp.parameters())
    decay = [p for p in params if p.ndim >= 2]
    nodecay = [p for p in params if p.ndim < 2]
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except Exception:  # noqa: BLE001
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    coef = cfg.router_aux_loss_coef

    def step_loss(seq):
        x, y = seq[:, :-1], seq[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, mlog, _ = runner.forward(x)
            l_main = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            l_mtp = F.cross_entropy(mlog.float().reshape(-1, mlog.shape[-1]), seq[:, 2:].reshape(-1))
            l_aux = aux_balance_loss(runner.router_logits, E, K)
        return l_main + MTP_WEIGHT * l_mtp + coef * l_aux, l_main, l_mtp, l_aux

    # experts implementation: grouped_mm if it works and matches eager at init, else eager
    model.train()
    mtp.train()
    impl_info = {}
    probe = batch()
    chosen = "eager"
    ref_loss = None
    for impl in ("eager", "grouped_mm"):
        try:
            got = set_impl(model, experts=impl)
            torch.cuda.synchronize()
            t1 = time.time()
            for _ in range(2):
                loss, lm, lt, la = step_loss(probe)
                loss.backward()
            torch.cuda.synchronize()
            dt = (time.time() - t1) / 2
            opt.zero_grad(set_to_none=True)
            lv = float(lm)
            impl_info[impl] = dict(step_s=dt, loss=lv, config=str(got))
            log(f"experts impl {impl}: {dt * 1000:.0f} ms/step (fwd+bwd), loss {lv:.4f}")
            if impl == "eager":
                ref_loss = lv
            elif ref_loss is not None and abs(lv - ref_loss) < 0.02 and dt < impl_info["eager"]["step_s"] * 0.9:
                chosen = impl
        except Exception as e:  # noqa: BLE001
            impl_info[impl] = dict(error=f"{type(e).__name__}: {e}")
            log(f"experts impl {impl} failed: {type(e).__name__}: {e}")
            opt.zero_grad(set_to_none=True)
    set_impl(model, experts=chosen)
    stats["experts_impl"] = dict(chosen=chosen, tried=impl_info)
    log(f"training with experts impl {chosen}, fast GDN {patched}")

    train_deadline = min(deadline_all - a.post_reserve, deadline_all)
    warm = 60
    total = a.steps if a.steps > 0 else None
    hist = []
    step = 0
    tok_seen = 0
    t_train0 = time.time()
    t_meas = None
    nan_stop = False
    try:
        while True:
            now = time.time()
            if now >= train_deadline or (total is not None and step >= total):
                break
            if step == 3:
                torch.cuda.synchronize()
                t_meas = time.time()
            if step == 13 and total is None:
                torch.cuda.synchronize()
                per = (time.time() - t_meas) / 10
                total = step + int((train_deadline - time.time()) / per * 0.97)
                log(f"{per * 1000:.0f} ms/step, {a.batch * S / per:.0f} tokens/s -> {total} steps")
            tot_for_lr = total if total is not None else 10 ** 6
            if step < warm:
                lr = a.lr * (step + 1) / warm
            else:
                frac = min(1.0, (step - warm) / max(1, tot_for_lr - warm))
                lr = a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for gr in opt.param_groups:
                gr["lr"] = lr
            seq = batch()
            loss, lm, lt, la = step_loss(seq)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            tok_seen += a.batch * S
            if step % 25 == 0 or step == 1:
                vals = [float(v) for v in (loss, lm, lt, la, gn)]
                if not all(math.isfinite(v) for v in vals[:4]):
                    log(f"non-finite loss at step {step}: {vals}")
                    nan_stop = True
                    break
                el = time.time() - t_train0
                hist.append(dict(step=step, loss=vals[0], main=vals[1], mtp=vals[2], aux=vals[3], gnorm=vals[4], lr=lr,
                                 tokens=tok_seen, t=el))
                log(f"step {step}/{total} loss {vals[0]:.4f} main {vals[1]:.4f} mtp {vals[2]:.4f} aux {vals[3]:.3f} "
                    f"gn {vals[4]:.2f} lr {lr:.2e} {tok_seen / el:.0f} tok/s")
    except Exception:  # noqa: BLE001  (keep what was trained)
        log("TRAINING STOPPED BY AN ERROR:\n" + traceback.format_exc())
        stats["training_error"] = traceback.format_exc()[-2000:]
    torch.cuda.synchronize()
    t_train = time.time() - t_train0
    stats["training"] = dict(steps=step, planned_steps=total, tokens_seen=tok_seen, batch=a.batch, seq=S,
                             seconds=t_train, tokens_per_s=tok_seen / max(1e-9, t_train), peak_lr=a.lr,
                             schedule=f"linear warmup {warm} steps, cosine to 10 %", weight_decay=0.1,
                             betas=[0.9, 0.95], grad_clip=1.0, mtp_weight=MTP_WEIGHT, router_aux_loss_coef=coef,
                             autocast="bfloat16", nan_stop=nan_stop, history=hist,
                             epochs=tok_seen / max(1, N), fast_gdn=patched)
    log(f"trained {step} steps, {tok_seen} tokens in {t_train:.0f}s")
    unpatch()
    save_stats()

    # ---- 5. export (BF16 weights; the live model is rounded to them first, so every figure below
    #         is measured on exactly the shipped values)
    model.eval()
    mtp.eval()
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    try:
        from safetensors.torch import load_file, save_file
        model.to(torch.bfloat16)
        model.save_pretrained(exp_dir, safe_serialization=True)
        model.to(torch.float32)
        st_files = sorted(f for f in os.listdir(exp_dir) if f.endswith(".safetensors"))
        sd = {}
        for f in st_files:
            sd.update(load_file(os.path.join(exp_dir, f)))
            os.remove(os.path.join(exp_dir, f))
        for f in os.listdir(exp_dir):
            if f.endswith(".safetensors.index.json"):
                os.remove(os.path.join(exp_dir, f))
        per_expert = any(".mlp.experts.0.gate_proj.weight" in k for k in sd)
        msd = mtp.state_dict()
        for name, t in msd.items():
            t = t.detach().to("cpu", torch.bfloat16).contiguous()
            if per_expert and name.endswith("mlp.experts.gate_up_proj"):
                base = name[: -len("gate_up_proj")]
                I2 = t.shape[1] // 2
                for e in range(t.shape[0]):
                    sd[f"mtp.{base}{e}.gate_proj.weight"] = t[e, :I2].contiguous()
                    sd[f"mtp.{base}{e}.up_proj.weight"] = t[e, I2:].contiguous()
            elif per_expert and name.endswith("mlp.experts.down_proj"):
                base = name[: -len("down_proj")]
                for e in range(t.shape[0]):
                    sd[f"mtp.{base}{e}.down_proj.weight"] = t[e].contiguous()
            else:
                sd["mtp." + name] = t
        sd = {k: v.contiguous() for k, v in sd.items()}
        save_file(sd, os.path.join(exp_dir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(exp_dir, "config.json")) as f:
            cj = json.load(f)
        cj["mtp_num_hidden_layers"] = 1
        cj["mtp_use_dedicated_embeddings"] = False
        cj["architectures"] = ["Qwen3_5MoeForCausalLM"]
        cj["model_type"] = "qwen3_5_moe_text"
        cj["torch_dtype"] = "bfloat16"
        cj["dtype"] = "bfloat16"
        with open(os.path.join(exp_dir, "config.json"), "w") as f:
            json.dump(cj, f, indent=2)
        with open(os.path.join(exp_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_position_embeddings,
                       "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                       "unk_token": None, "add_bos_token": False, "add_prefix_space": False,
                       "clean_up_tokenization_spaces": False, "errors": "replace",
                       "chat_template": CHAT_TEMPLATE}, f, indent=2)
        with open(os.path.join(exp_dir, "generation_config.json"), "w") as f:
            json.dump({"do_sample": False, "eos_token_id": eot, "pad_token_id": eot}, f, indent=2)
        with open(os.path.join(exp_dir, "prompts.json"), "w") as f:
            json.dump(prompts, f, indent=1)
        stats["export"] = dict(files=sorted(os.listdir(exp_dir)), n_tensors=len(sd), per_expert_layout=per_expert,
                               mtp_tensors=sorted(k for k in sd if k.startswith("mtp.") and ".experts." not in k))
        log(f"exported {len(sd)} tensors to {exp_dir} ({sum(os.path.getsize(os.path.join(exp_dir, f)) for f in os.listdir(exp_dir)) / 1e6:.1f} MB)")
    except Exception:  # noqa: BLE001
        log("EXPORT FAILED:\n" + traceback.format_exc())
        model.to(torch.float32)
    save_stats()

    # ---- 6. evaluation (float32 compute on the BF16 weights; TF32 off)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    evt = torch.from_numpy(ev.astype(np.int64)).to(dev)
    try:
        with torch.no_grad():
            # export round trip: reload the directory with HF and compare logits with the live model
            try:
                rl = tf.Qwen3_5MoeForCausalLM.from_pretrained(exp_dir, dtype=torch.float32).to(dev).eval()
                xx = evt[:2, :S]
                a1 = model(input_ids=xx, use_cache=False).logits
                a2 = rl(input_ids=xx, use_cache=False).logits
                stats["export_roundtrip_max_abs_logit"] = float((a1 - a2).abs().max())
                from safetensors import safe_open
                with safe_open(os.path.join(exp_dir, "model.safetensors"), "pt") as f:
                    keys = set(f.keys())
                    mtp2 = MTP(cfg, full_idx)
                    m2 = {}
                    for name, t in mtp.state_dict().items():
                        if ("mtp." + name) in keys:
                            m2[name] = f.get_tensor("mtp." + name).float()
                        elif name.endswith("mlp.experts.gate_up_proj"):
                            base = "mtp." + name[: -len("gate_up_proj")]
                            m2[name] = torch.stack([torch.cat([f.get_tensor(f"{base}{e}.gate_proj.weight"),
                                                               f.get_tensor(f"{base}{e}.up_proj.weight")], 0)
                                                    for e in range(E)]).float()
                        elif name.endswith("mlp.experts.down_proj"):
                            base = "mtp." + name[: -len("down_proj")]
                            m2[name] = torch.stack([f.get_tensor(f"{base}{e}.down_proj.weight") for e in range(E)]).float()
                    mtp2.load_state_dict(m2, strict=True)
                    stats["export_mtp_max_abs_weight_diff"] = max(
                        float((mtp2.state_dict()[n].to(dev) - t).abs().max()) for n, t in mtp.state_dict().items())
                del rl
                log(f"export round trip: max|logit diff| {stats['export_roundtrip_max_abs_logit']:.3g}, "
                    f"mtp weights {stats['export_mtp_max_abs_weight_diff']:.3g}")
            except Exception:  # noqa: BLE001
                log("export round trip check failed:\n" + traceback.format_exc())
            set_impl(model, attn="sdpa", experts="eager")
            nll = nll_m = 0.0
            cnt = cnt_m = 0
            agree = acc = acc_m = 0
            nll_bf = 0.0
            rin, rlg = None, None
            for i in range(0, evt.shape[0], 32):
                seq = evt[i:i + 32]
                x, y = seq[:, :-1], seq[:, 1:]
                runner.keep_inputs = (i == 0)
                logits, mlog, _ = runner.forward(x)
                if i == 0:
                    rin = runner.router_inputs[:cfg.num_hidden_layers]
                    rlg = runner.router_logits[:cfg.num_hidden_layers]
                    bsz = x.shape[0]
                runner.keep_inputs = False
                lp = torch.log_softmax(logits.float(), -1)
                nll += float(-lp.gather(-1, y[..., None]).sum())
                cnt += y.numel()
                mp = torch.log_softmax(mlog.float(), -1)
                nll_m += float(-mp.gather(-1, seq[:, 2:, None]).sum())
                cnt_m += seq[:, 2:].numel()
                am = logits.argmax(-1)          # main prediction of token t+1 at t
                at = mlog.argmax(-1)            # MTP prediction of token t+2 at t
                agree += int((at == am[:, 1:]).sum())
                acc += int((am == y).sum())
                acc_m += int((at == seq[:, 2:]).sum())
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    lb, _, _ = runner.forward(x, with_mtp=False)
                nll_bf += float(-torch.log_softmax(lb.float(), -1).gather(-1, y[..., None]).sum())
            stats["eval"] = dict(tokens=cnt, ppl_bf16_weights_f32_compute=math.exp(nll / cnt),
                                 ppl_bf16_autocast=math.exp(nll_bf / cnt), nll=nll / cnt,
                                 bits_per_byte=(nll / cnt) / math.log(2) / tinfo["heldout_bytes_per_token"],
                                 top1_acc_next=acc / cnt, mtp_ppl_t2=math.exp(nll_m / cnt_m),
                                 mtp_top1_acc_t2=acc_m / cnt_m,
                                 mtp_agreement_with_main_next_next=agree / cnt_m)
            log(f"eval: {stats['eval']}")
            save_stats()
            per_layer, cross = routing_stats(rin, rlg, [l.mlp.gate.weight for l in model.model.layers],
                                             bsz, S, K, E)
            stats["routing"] = dict(tokens=bsz * S, per_layer=per_layer, cross_layer=cross)
            log("routing repeat overlap per layer: " + ", ".join(f"{d['repeat_overlap_mean']:.2f}" for d in per_layer))
            log("cross-layer predict-k precision: " + ", ".join(f"{d['predict_' + str(K)]['precision']:.2f}" for d in cross))
            save_stats()
            # samples (greedy, full recompute each step)
            samples = []
            sp = [dict(text="def fibonacci(n):\n")] + [dict(text=p["text"]) for p in prompts]
            for p in sp:
                ids = tok.encode(p["text"], add_special_tokens=False).ids
                cur = torch.tensor([ids], device=dev)
                for _ in range(64):
                    lg, _, _ = runner.forward(cur, with_mtp=False)
                    cur = torch.cat([cur, lg[:, -1].argmax(-1, keepdim=True)], 1)
                gen = cur[0, len(ids):].tolist()
                samples.append(dict(prompt=p["text"], completion=tok.decode(gen, skip_special_tokens=False), ids=gen))
                if time.time() > deadline_all - 5:
                    break
            stats["samples"] = samples
            for s in samples[:2]:
                log("SAMPLE " + json.dumps(s["prompt"] + s["completion"]))
    except Exception:  # noqa: BLE001
        log("EVAL FAILED:\n" + traceback.format_exc())
    stats["wall_seconds"] = time.time() - T0
    save_stats()
    log("done")


if __name__ == "__main__":
    main()
