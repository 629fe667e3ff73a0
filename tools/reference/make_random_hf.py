#!/usr/bin/env python3
"""A tiny random Qwen3.5-MoE HF directory whose every matrix row is 256 wide, without torch.

Why: the golden fixtures of make_fixtures.py have rows 16..128 wide, so `floe convert --type q4_K`
falls back (as llama-quantize does) and Q4_K never runs in the HF-reference model tests. This model
(`qwen35moe_k`) has hidden 256, heads of 64, expert / shared-expert intermediate 256, so every
matrix takes Q4_K. It is made here, on the CPU, with Python's own seeded generator (pure Python:
no torch or numpy needed), so it can be rebuilt bit for bit anywhere:

    python3 tools/reference/make_random_hf.py OUT_DIR

writes OUT_DIR/config.json and OUT_DIR/model.safetensors (BF16, HF names and shapes of
Qwen3_5MoeForCausalLM). Layers: one GatedDeltaNet (2 key heads of 64, 4 value heads of 64: the
V-head reorder and the tiled out_proj columns are exercised) and one gated full attention (4 heads
/ 2 KV heads of 64, partial RoPE 16 of 64); 8 experts top-2 plus the sigmoid-gated shared expert.
1-D parameters are perturbed like make_fixtures.py does: zero-centred norms N(0, 0.15^2), the gated
norm 1 + N(0, 0.15^2), A_log = log U(1, 16), dt_bias 1 + N(0, 0.15^2). Matrices N(0, 0.04^2)
(0.08 for the router, so routing is decisive); values rounded to bf16 (round to nearest even).
"""
import json
import math
import os
import random
import struct
import sys

SEED = 20261129
H, V, HD, NH, NKV = 256, 512, 64, 4, 2
LK, LV, NK, NV, CONV = 64, 64, 2, 4, 4
NE, TOPK, I, ISH = 8, 2, 256, 256


def config():
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": None,
        "pad_token_id": None, "dtype": "bfloat16", "head_dim": HD, "hidden_act": "silu", "hidden_size": H,
        "initializer_range": 0.04, "layer_types": ["linear_attention", "full_attention"],
        "linear_conv_kernel_dim": CONV, "linear_key_head_dim": LK, "linear_num_key_heads": NK,
        "linear_num_value_heads": NV, "linear_value_head_dim": LV, "max_position_embeddings": 512,
        "moe_intermediate_size": I, "num_attention_heads": NH, "num_experts": NE, "num_experts_per_tok": TOPK,
        "num_hidden_layers": 2, "num_key_value_heads": NKV, "output_router_logits": False,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [4, 2, 2], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000.0, "rope_type": "default"},
        "rms_norm_eps": 1e-06, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": ISH,
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": V,
    }


def tensors(rng):
    """(name, shape, generator of one value) in a fixed order"""
    g = lambda s: (lambda: rng.gauss(0.0, s))
    zc = g(0.15)                                   # zero-centred (1+w) norms
    one = lambda: 1.0 + rng.gauss(0.0, 0.15)
    out = [("model.embed_tokens.weight", [V, H], g(0.5))]
    for l, kind in enumerate(["linear", "full"]):
        p = f"model.layers.{l}."
        out.append((p + "input_layernorm.weight", [H], zc))
        if kind == "linear":
            a = p + "linear_attn."
            qkv = 2 * NK * LK + NV * LV
            out += [(a + "in_proj_qkv.weight", [qkv, H], g(0.04)), (a + "in_proj_z.weight", [NV * LV, H], g(0.04)),
                    (a + "in_proj_b.weight", [NV, H], g(0.04)), (a + "in_proj_a.weight", [NV, H], g(0.04)),
                    (a + "conv1d.weight", [qkv, 1, CONV], g(0.3)),
                    (a + "A_log", [NV], lambda: math.log(rng.uniform(1.0, 16.0))), (a + "dt_bias", [NV], one),
                    (a + "norm.weight", [LV], one), (a + "out_proj.weight", [H, NV * LV], g(0.04))]
        else:
            a = p + "self_attn."
            out += [(a + "q_proj.weight", [2 * NH * HD, H], g(0.04)), (a + "k_proj.weight", [NKV * HD, H], g(0.04)),
                    (a + "v_proj.weight", [NKV * HD, H], g(0.04)), (a + "o_proj.weight", [H, NH * HD], g(0.04)),
                    (a + "q_norm.weight", [HD], zc), (a + "k_norm.weight", [HD], zc)]
        out.append((p + "post_attention_layernorm.weight", [H], zc))
        m = p + "mlp."
        out.append((m + "gate.weight", [NE, H], g(0.08)))
        for e in range(NE):
            out += [(m + f"experts.{e}.gate_proj.weight", [I, H], g(0.04)),
                    (m + f"experts.{e}.up_proj.weight", [I, H], g(0.04)),
                    (m + f"experts.{e}.down_proj.weight", [H, I], g(0.04))]
        out += [(m + "shared_expert.gate_proj.weight", [ISH, H], g(0.04)),
                (m + "shared_expert.up_proj.weight", [ISH, H], g(0.04)),
                (m + "shared_expert.down_proj.weight", [H, ISH], g(0.04)),
                (m + "shared_expert_gate.weight", [1, H], g(0.04))]
    out += [("model.norm.weight", [H], zc), ("lm_head.weight", [V, H], g(0.04))]
    return out


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u += 0x7FFF + ((u >> 16) & 1)
    return struct.pack("<H", (u >> 16) & 0xFFFF)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_random_hf.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(SEED)
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, gen in tensors(rng):
        n = math.prod(shape)
        b = b"".join(bf16(gen()) for _ in range(n))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    tmp = os.path.join(out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
    print(f"wrote {out}: {len(header) - 1} tensors, {off} bytes of BF16")


if __name__ == "__main__":
    main()
