#!/usr/bin/python3
"""train_golden.py — independent PyTorch reference for tern's training loop (tests/train/test_golden.c).

Builds the same tiny Llama (RMSNorm, RoPE on adjacent pairs as GGUF/llama.cpp "normal" mode, causal
GQA attention, SwiGLU, untied output, mean cross-entropy) in plain torch, initialises it with the
same weights as tn_tmodel_init_random (splitmix64 + Box-Muller, reproduced here bit for bit), and
trains 10 steps with torch.optim.AdamW (decay on matrices only), linear warmup + cosine schedule and
clip_grad_norm_. Writes the loss before each step and after the last one to
tests/golden/train_tiny.txt, in float32 and (for the tolerance argument) float64.

Run with Debian's python3-torch:  /usr/bin/python3 scripts/train_golden.py [out]
"""
import math
import sys

import numpy as np
import torch

CFG = dict(n_vocab=32, n_embd=16, n_layer=2, n_head=4, n_head_kv=2, n_ff=32, eps=1e-5, rope_base=10000.0)
B, T, STEPS, SEED, DATA_SEED = 2, 8, 10, 1234, 42
LR, WARMUP, MIN_FRAC, WD, BETAS, ADAM_EPS, CLIP = 1e-2, 2, 0.1, 0.1, (0.9, 0.95), 1e-8, 1.0
M64 = (1 << 64) - 1


class SplitMix:
    def __init__(self, s):
        self.s = s & M64

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def unif(self):
        return ((self.next() >> 11) + 1.0) * 2.0 ** -53

    def normal(self):
        u1, u2 = self.unif(), self.unif()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


def tensor_table(c):
    C, F, V = c["n_embd"], c["n_ff"], c["n_vocab"]
    KV = c["n_head_kv"] * (C // c["n_head"])
    t = [("token_embd.weight", (V, C))]
    for l in range(c["n_layer"]):
        t += [(f"blk.{l}.attn_norm.weight", (C,)), (f"blk.{l}.attn_q.weight", (C, C)), (f"blk.{l}.attn_k.weight", (KV, C)),
              (f"blk.{l}.attn_v.weight", (KV, C)), (f"blk.{l}.attn_output.weight", (C, C)),
              (f"blk.{l}.ffn_norm.weight", (C,)), (f"blk.{l}.ffn_gate.weight", (F, C)), (f"blk.{l}.ffn_up.weight", (F, C)),
              (f"blk.{l}.ffn_down.weight", (C, F))]
    t += [("output_norm.weight", (C,)), ("output.weight", (V, C))]
    return t


def init_weights(c, seed):
    """tn_tmodel_init_random: N(0, 0.02) matrices (attn_output/ffn_down: 0.02/sqrt(2 n_layer)), norms 1."""
    rng = SplitMix(seed ^ 0x7465726E2D696E69)
    std = np.float32(0.02)
    std_res = np.float32(std / np.sqrt(np.float32(2.0 * c["n_layer"])))
    w = {}
    for name, shape in tensor_table(c):
        if len(shape) == 1:
            w[name] = np.ones(shape, np.float32)
            continue
        sd = float(std_res if ("attn_output" in name or "ffn_down" in name) else std)
        n = int(np.prod(shape))
        w[name] = np.array([np.float32(rng.normal() * sd) for _ in range(n)], np.float32).reshape(shape)
    return w


def batch(c):
    rng = SplitMix(DATA_SEED)
    tok = [rng.next() % c["n_vocab"] for _ in range(B * T)]
    tgt = [rng.next() % c["n_vocab"] for _ in range(B * T)]
    return torch.tensor(tok).view(B, T), torch.tensor(tgt).view(B, T)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, base):  # x [B, T, H, hd], adjacent pairs (x0, x1) rotated by pos * base^(-2i/hd)
    hd = x.shape[-1]
    pos = torch.arange(x.shape[1], dtype=torch.float64)
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    th = pos[:, None] * inv[None, :]
    cos, sin = torch.cos(th).to(x.dtype)[None, :, None, :], torch.sin(th).to(x.dtype)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def forward(P, c, tok, tgt):
    C, H, HK = c["n_embd"], c["n_head"], c["n_head_kv"]
    hd = C // H
    x = P["token_embd.weight"][tok]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(c["n_layer"]):
        p = lambda s: P[f"blk.{l}.{s}.weight"]
        h = rmsnorm(x, p("attn_norm"), c["eps"])
        q = rope((h @ p("attn_q").T).view(B, T, H, hd), c["rope_base"])
        k = rope((h @ p("attn_k").T).view(B, T, HK, hd), c["rope_base"])
        v = (h @ p("attn_v").T).view(B, T, HK, hd)
        k = k.repeat_interleave(H // HK, dim=2)  # head h uses kv head h // (H/HK)
        v = v.repeat_interleave(H // HK, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C)
        x = x + y @ p("attn_output").T
        h = rmsnorm(x, p("ffn_norm"), c["eps"])
        x = x + (torch.nn.functional.silu(h @ p("ffn_gate").T) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    logits = rmsnorm(x, P["output_norm.weight"], c["eps"]) @ P["output.weight"].T
    return torch.nn.functional.cross_entropy(logits.view(-1, c["n_vocab"]), tgt.view(-1))


def lr_at(step):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = min(1.0, (step - WARMUP) / (STEPS - WARMUP))
    return LR * (MIN_FRAC + (1 - MIN_FRAC) * 0.5 * (1 + math.cos(math.pi * p)))


def run(dtype):
    c = CFG
    w = init_weights(c, SEED)
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in w.items()}
    decay = [P[n] for n, s in tensor_table(c) if len(s) == 2]
    no_decay = [P[n] for n, s in tensor_table(c) if len(s) == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=ADAM_EPS)
    tok, tgt = batch(c)
    losses = []
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad()
        loss = forward(P, c, tok, tgt)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), CLIP)
        opt.step()
    with torch.no_grad():
        losses.append(forward(P, c, tok, tgt).item())
    return losses


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/train_tiny.txt"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    l32, l64 = run(torch.float32), run(torch.float64)
    with open(out, "w") as f:
        f.write("# tern training golden: scripts/train_golden.py (PyTorch %s)\n" % torch.__version__)
        f.write("# config %s B=%d T=%d steps=%d seed=%d data_seed=%d lr=%g warmup=%d min_frac=%g wd=%g betas=%s eps=%g clip=%g\n"
                % (CFG, B, T, STEPS, SEED, DATA_SEED, LR, WARMUP, MIN_FRAC, WD, BETAS, ADAM_EPS, CLIP))
        f.write("# step loss_f32 loss_f64 (loss before step i; the last line is after the last step)\n")
        for i, (a, b) in enumerate(zip(l32, l64)):
            f.write("%d %.9f %.9f\n" % (i, a, b))
    print("\n".join("%d %.7f %.7f" % (i, a, b) for i, (a, b) in enumerate(zip(l32, l64))))


if __name__ == "__main__":
    main()
