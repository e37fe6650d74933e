#!/usr/bin/python3
"""bench_torch.py — PyTorch eager CPU training throughput for the same Llama config as bench_train.c
(RMSNorm, RoPE, causal GQA attention, SwiGLU, untied output; AdamW + clip), random tokens.
usage: /usr/bin/python3 bench_torch.py n_embd n_layer n_head n_head_kv n_ff ctx vocab batch threads steps"""
import math
import resource
import sys
import time

import torch
import torch.nn.functional as Fn

C, L, H, HK, FF, T, V, B, TH, STEPS = map(int, sys.argv[1:11])
torch.set_num_threads(TH)
torch.manual_seed(0)
hd = C // H


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.an, self.fn = torch.nn.Parameter(torch.ones(C)), torch.nn.Parameter(torch.ones(C))
        self.q, self.k = torch.nn.Linear(C, C, bias=False), torch.nn.Linear(C, HK * hd, bias=False)
        self.v, self.o = torch.nn.Linear(C, HK * hd, bias=False), torch.nn.Linear(C, C, bias=False)
        self.g, self.u = torch.nn.Linear(C, FF, bias=False), torch.nn.Linear(C, FF, bias=False)
        self.d = torch.nn.Linear(FF, C, bias=False)


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


inv = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
th = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
COS, SIN = torch.cos(th)[None, :, None, :], torch.sin(th)[None, :, None, :]


def rope(x):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * COS - x1 * SIN, x0 * SIN + x1 * COS], -1).flatten(-2)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, C)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
        self.on = torch.nn.Parameter(torch.ones(C))
        self.out = torch.nn.Linear(C, V, bias=False)

    def forward(self, tok, tgt):
        x = self.emb(tok)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for b in self.blocks:
            h = rms(x, b.an)
            q, k = rope(b.q(h).view(B, T, H, hd)), rope(b.k(h).view(B, T, HK, hd))
            v = b.v(h).view(B, T, HK, hd)
            k, v = k.repeat_interleave(H // HK, 2), v.repeat_interleave(H // HK, 2)
            att = (torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)).masked_fill(mask, float("-inf")).softmax(-1)
            x = x + b.o(torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, C))
            h = rms(x, b.fn)
            x = x + b.d(Fn.silu(b.g(h)) * b.u(h))
        return Fn.cross_entropy(self.out(rms(x, self.on)).view(-1, V), tgt.view(-1))


m = Model()
n_params = sum(p.numel() for p in m.parameters())
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
t0 = 0
for s in range(STEPS + 1):
    if s == 1:
        t0 = time.time()
    tok, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    opt.zero_grad(set_to_none=True)
    loss = m(tok, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
dt = time.time() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("torch  params %.2fM  batch %dx%d  threads %d  %.1f tokens/s  %.3f s/step  peak RSS %.1f MiB  (loss %.3f, torch %s)"
      % (n_params / 1e6, B, T, TH, B * T * STEPS / dt, dt / STEPS, rss, loss.item(), torch.__version__))
