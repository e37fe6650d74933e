#!/usr/bin/python3
"""lora_golden.py — independent PyTorch reference for tern's LoRA fine-tuning (tests/train/test_lora_golden.c).

The base is the tiny llama GGUF that tests/common/tiny_model.c writes (its weights reproduced here bit
for bit: splitmix64 + Box-Muller per tensor, N(0, 1/sqrt(fan_in)) matrices, norm weights 1 + 0.1 z),
in f32 and quantized to q8_0 (ggml's reference quantizer reproduced in numpy: d = amax / 127, fp16 d,
round half away from zero) — the frozen base, as QLoRA trains over it. Adapters on q, k, v, o, gate,
up, down: y = x W^T + (alpha / rank) (x A^T) B^T, A [rank][k] ~ U(-1/sqrt(k), 1/sqrt(k)) from tern's
seed stream, B = 0. Trains 10 steps with torch.optim.AdamW (adapters without weight decay, as tern),
linear warmup + cosine schedule and clip_grad_norm_ over the adapters, on one fixed random batch.
Writes the loss before each step and after the last one, float32 and float64 runs, per base type.

Run with Debian's python3-torch:  /usr/bin/python3 scripts/lora_golden.py [out]
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_golden  # noqa: E402
from train_golden import SplitMix, lr_at, rmsnorm, rope  # noqa: E402  (RMSNorm, adjacent-pair RoPE, the schedule)

CFG = dict(n_vocab=270, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=64, eps=1e-5, rope_base=10000.0, seed=5)
RANK, ALPHA, LORA_SEED = 4, 8.0, 3
B, T, STEPS, DATA_SEED = 2, 8, 10, 9
LR, WARMUP, MIN_FRAC, BETAS, ADAM_EPS, CLIP = 1e-2, 2, 0.1, (0.9, 0.95), 1e-8, 1.0
M64 = (1 << 64) - 1
TARGETS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def tensor_table(c):
    """tests/common/tiny_model.c's llama tensors, in the order it writes them: (name, ne0, ne1, kind)."""
    C, F, V = c["n_embd"], c["n_ff"], c["n_vocab"]
    KV = c["n_head_kv"] * (C // c["n_head"])
    t = [("token_embd.weight", C, V, "w")]
    for l in range(c["n_layer"]):
        b = "blk.%d." % l
        t += [(b + "attn_norm.weight", C, 1, "n"), (b + "attn_q.weight", C, C, "w"), (b + "attn_k.weight", C, KV, "w"),
              (b + "attn_v.weight", C, KV, "w"), (b + "attn_output.weight", C, C, "w"), (b + "ffn_norm.weight", C, 1, "n"),
              (b + "ffn_gate.weight", C, F, "w"), (b + "ffn_up.weight", C, F, "w"), (b + "ffn_down.weight", F, C, "w")]
    return t + [("output_norm.weight", C, 1, "n"), ("output.weight", C, V, "w")]


def tiny_normal(rng):
    """tiny_model.c's tiny_normal: u1 = (x >> 11 + 0.5) 2^-53, u2 = (x >> 11) 2^-53."""
    u1 = ((rng.next() >> 11) + 0.5) * 2.0 ** -53
    u2 = (rng.next() >> 11) * 2.0 ** -53
    return np.float32(math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2))


def q8_0_roundtrip(row):
    """ggml's quantize_row_q8_0_ref then dequantize, per 32 values, in float32 as C does."""
    out = np.empty_like(row)
    for b in range(0, row.size, 32):
        x = row[b:b + 32]
        amax = np.float32(np.max(np.abs(x)))
        d = np.float32(amax / np.float32(127.0))
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        v = (x * inv).astype(np.float32).astype(np.float64)  # the float32 product, as C rounds it
        q = np.trunc(v) + np.where(np.abs(v - np.trunc(v)) >= 0.5, np.sign(v), 0.0)  # roundf: half away from zero
        out[b:b + 32] = (q.astype(np.float32) * np.float32(np.float16(d))).astype(np.float32)
    return out


def base_weights(c, wtype):
    w = {}
    for idx, (name, ne0, ne1, kind) in enumerate(tensor_table(c)):
        rng = SplitMix(c["seed"] * 7919 + idx * 104729)
        sc = np.float32(1.0) / np.float32(math.sqrt(ne0))
        rows = []
        for _ in range(ne1):
            z = np.array([tiny_normal(rng) for _ in range(ne0)], np.float32)
            r = (np.float32(1.0) + np.float32(0.1) * z) if kind == "n" else z * sc
            r = r.astype(np.float32)
            if kind == "w" and wtype == "q8_0" and name not in ("token_embd.weight", "output.weight"):
                r = q8_0_roundtrip(r)
            rows.append(r)
        w[name] = np.stack(rows) if ne1 > 1 else rows[0]
    return w


def lora_init(c):
    """tern's lora_init: one splitmix stream (seed ^ "lora-ini"), lora_a of each adapted matrix in
    the model's tensor order, row-major [rank][k], U(-1/sqrt(k), 1/sqrt(k)); lora_b = 0."""
    rng = SplitMix(LORA_SEED ^ 0x6C6F72612D696E69)
    ab = {}
    for name, ne0, ne1, kind in tensor_table(c):
        if not any(name.endswith(t + ".weight") and name.startswith("blk.") for t in TARGETS):
            continue
        bound = 1.0 / math.sqrt(ne0)
        a = np.array([np.float32((2.0 * rng.unif() - 1.0) * bound) for _ in range(RANK * ne0)], np.float32).reshape(RANK, ne0)
        ab[name] = (a, np.zeros((ne1, RANK), np.float32))
    return ab


def batch(c):
    rng = SplitMix(DATA_SEED)
    tok, tgt = [], []
    for _ in range(B * T):
        tok.append(rng.next() % c["n_vocab"])
        tgt.append(rng.next() % c["n_vocab"])
    return torch.tensor(tok).view(B, T), torch.tensor(tgt).view(B, T)


def forward(W, L, c, tok, tgt):
    C, H, HK = c["n_embd"], c["n_head"], c["n_head_kv"]
    hd, s = C // H, ALPHA / RANK

    def mm(x, name):
        y = x @ W[name].T
        if name in L:
            a, b = L[name]
            y = y + s * ((x @ a.T) @ b.T)
        return y

    x = W["token_embd.weight"][tok]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(c["n_layer"]):
        p = "blk.%d." % l
        h = rmsnorm(x, W[p + "attn_norm.weight"], c["eps"])
        q = rope(mm(h, p + "attn_q.weight").view(B, T, H, hd), c["rope_base"])
        k = rope(mm(h, p + "attn_k.weight").view(B, T, HK, hd), c["rope_base"])
        v = mm(h, p + "attn_v.weight").view(B, T, HK, hd)
        k = k.repeat_interleave(H // HK, dim=2)
        v = v.repeat_interleave(H // HK, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
        x = x + mm(y, p + "attn_output.weight")
        h = rmsnorm(x, W[p + "ffn_norm.weight"], c["eps"])
        x = x + mm(torch.nn.functional.silu(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
    logits = rmsnorm(x, W["output_norm.weight"], c["eps"]) @ W["output.weight"].T
    return torch.nn.functional.cross_entropy(logits.view(-1, c["n_vocab"]), tgt.view(-1))


def run(wtype, dtype):
    c = CFG
    W = {k: torch.tensor(v, dtype=dtype) for k, v in base_weights(c, wtype).items()}  # frozen
    L = {k: (torch.tensor(a, dtype=dtype, requires_grad=True), torch.tensor(b, dtype=dtype, requires_grad=True))
         for k, (a, b) in lora_init(c).items()}
    params = [t for ab in L.values() for t in ab]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=ADAM_EPS, weight_decay=0.0)
    tok, tgt = batch(c)
    losses = []
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad()
        loss = forward(W, L, c, tok, tgt)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
    with torch.no_grad():
        losses.append(forward(W, L, c, tok, tgt).item())
    return losses


def main():
    # lr_at is train_golden's warmup + cosine: the same constants
    assert (train_golden.LR, train_golden.WARMUP, train_golden.STEPS, train_golden.MIN_FRAC) == (LR, WARMUP, STEPS, MIN_FRAC)
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/lora_tiny.txt"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with open(out + ".tmp", "w") as f:
        f.write("# tern LoRA golden: scripts/lora_golden.py (PyTorch %s)\n" % torch.__version__)
        f.write("# config %s rank=%d alpha=%g lora_seed=%d B=%d T=%d steps=%d data_seed=%d lr=%g warmup=%d min_frac=%g "
                "betas=%s eps=%g clip=%g\n" % (CFG, RANK, ALPHA, LORA_SEED, B, T, STEPS, DATA_SEED, LR, WARMUP, MIN_FRAC, BETAS,
                                               ADAM_EPS, CLIP))
        f.write("# base step loss_f32 loss_f64 (loss before step i; the last line is after the last step)\n")
        for wtype in ("f32", "q8_0"):
            l32, l64 = run(wtype, torch.float32), run(wtype, torch.float64)
            for i, (a, b) in enumerate(zip(l32, l64)):
                f.write("%s %d %.9f %.9f\n" % (wtype, i, a, b))
                print("%s %d %.7f %.7f" % (wtype, i, a, b))
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
