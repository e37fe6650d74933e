#!/usr/bin/python3
"""bench_lora_torch.py — PyTorch eager CPU LoRA fine-tuning throughput and peak RSS for the Llama whose
shapes a GGUF file's header gives (the model `tern finetune` is run on), for bench/train/run_lora_bench.sh.

The base (embeddings, norms, every matrix, the output) is random and frozen — speed and memory do not
depend on its values — in fp32 or bf16 (--dtype); LoRA A [rank][n_in] and B [n_out][rank] (fp32,
trained) on the same targets as `tern finetune`'s defaults (q,k,v,o,gate,up,down; rank 16, alpha
32: scale alpha/rank), y = x W^T + s (x A^T) B^T; AdamW on the adapters only (lr 2e-4, weight decay 0,
global-norm clip 1), cross-entropy on every position of random tokens. Reports tokens/s over the
steps after the first (the first is warmup) and peak RSS (getrusage ru_maxrss of the process).

usage: /usr/bin/python3 bench_lora_torch.py MODEL.gguf [--batch 4] [--ctx N] [--steps 3] [--threads 2]
                        [--rank 16] [--alpha 2*rank] [--targets q,k,v,o,gate,up,down] [--dtype fp32|bf16]"""
import argparse
import math
import resource
import struct
import sys
import time

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def gguf_header(path):
    """(metadata dict without arrays' items — arrays give their length —, {tensor name: dims}) of a GGUF file."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                raise ValueError("%s: truncated GGUF header" % path)
            return struct.unpack(fmt, b)[0]

        def rstr():
            n = rd("<Q")
            if n > 1 << 20:
                raise ValueError("%s: string of %d bytes in the header" % (path, n))
            return f.read(n).decode("utf-8", "replace")

        def rval(t):
            if t in scalar:
                return rd(scalar[t])
            if t == 8:
                return rstr()
            if t == 9:
                it, n = rd("<I"), rd("<Q")
                if it == 8:
                    for _ in range(n):
                        f.seek(rd("<Q"), 1)
                elif it in scalar:
                    f.seek(n * struct.calcsize(scalar[it]), 1)
                else:
                    raise ValueError("%s: array of type %d" % (path, it))
                return n
            raise ValueError("%s: metadata value of type %d" % (path, t))

        if f.read(4) != b"GGUF":
            raise ValueError("%s: not a GGUF file (no 'GGUF' magic)" % path)
        rd("<I")
        n_tensors, n_kv = rd("<Q"), rd("<Q")
        kv = {}
        for _ in range(n_kv):
            k = rstr()
            kv[k] = rval(rd("<I"))
        tensors = {}
        for _ in range(n_tensors):
            name = rstr()
            dims = [rd("<Q") for _ in range(rd("<I"))]
            rd("<I"), rd("<Q")
            tensors[name] = dims
    return kv, tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=0, help="default min(512, the model's context), as tern finetune")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (one more runs first, untimed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=0.0, help="default 2 * rank, as tern finetune")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the frozen base's type")
    a = ap.parse_args()
    try:
        kv, tensors = gguf_header(a.model)
    except (OSError, ValueError, struct.error) as e:
        sys.exit("bench_lora_torch: %s" % e)
    arch = kv.get("general.architecture")
    if arch != "llama":
        sys.exit("bench_lora_torch: %s: architecture %r, this script builds llama only" % (a.model, arch))
    need = ["embedding_length", "block_count", "attention.head_count", "feed_forward_length", "context_length"]
    miss = [k for k in need if "llama." + k not in kv]
    if miss or "token_embd.weight" not in tensors:
        sys.exit("bench_lora_torch: %s lacks %s" % (a.model, ", ".join(["llama." + k for k in miss] or ["token_embd.weight"])))
    targets = a.targets.split(",")
    bad = [t for t in targets if t not in TARGETS]
    if bad or a.batch < 1 or a.steps < 1 or a.threads < 1 or a.rank < 1:
        sys.exit("bench_lora_torch: bad flags (targets %s; batch, steps, threads and rank must be >= 1)" % ",".join(TARGETS))

    import torch
    import torch.nn.functional as Fn

    C, L = kv["llama.embedding_length"], kv["llama.block_count"]
    H = kv["llama.attention.head_count"]
    HK = kv.get("llama.attention.head_count_kv", H)
    FF = kv["llama.feed_forward_length"]
    hd = kv.get("llama.attention.key_length", C // H)
    V = tensors["token_embd.weight"][1]
    eps = kv.get("llama.attention.layer_norm_rms_epsilon", 1e-5)
    base_rope = kv.get("llama.rope.freq_base", 10000.0)
    tied = "output.weight" not in tensors
    T = a.ctx or min(512, kv["llama.context_length"])
    B, r = a.batch, a.rank
    s = (a.alpha or 2.0 * r) / r
    wdt = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    def frozen(*shape):  # random base weights, made in their type (no fp32 copy of a bf16 base)
        return torch.empty(*shape, dtype=wdt).uniform_(-0.02, 0.02)

    class Lin(torch.nn.Module):
        """x W^T (W frozen, [n_out][n_in]) plus s (x A^T) B^T when adapted."""

        def __init__(self, n_in, n_out, adapt):
            super().__init__()
            self.register_buffer("w", frozen(n_out, n_in))
            self.a = torch.nn.Parameter(torch.empty(r, n_in).uniform_(-1 / math.sqrt(n_in), 1 / math.sqrt(n_in))) if adapt else None
            self.b = torch.nn.Parameter(torch.zeros(n_out, r)) if adapt else None  # 0, as tern (and PEFT)

        def forward(self, x):
            y = Fn.linear(x.to(wdt), self.w).float() if wdt != torch.float32 else Fn.linear(x, self.w)
            if self.a is not None:
                y = y + s * Fn.linear(Fn.linear(x, self.a), self.b)
            return y

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    inv = base_rope ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    th = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    COS, SIN = torch.cos(th)[None, :, None, :], torch.sin(th)[None, :, None, :]

    def rope(x):  # llama.cpp's normal (interleaved-pair) rope; the cost is what matters here
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * COS - x1 * SIN, x0 * SIN + x1 * COS], -1).flatten(-2)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("an", torch.ones(C))
            self.register_buffer("fn", torch.ones(C))
            self.q, self.k = Lin(C, H * hd, "q" in targets), Lin(C, HK * hd, "k" in targets)
            self.v, self.o = Lin(C, HK * hd, "v" in targets), Lin(H * hd, C, "o" in targets)
            self.g, self.u = Lin(C, FF, "gate" in targets), Lin(C, FF, "up" in targets)
            self.d = Lin(FF, C, "down" in targets)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("emb", frozen(V, C))
            self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
            self.register_buffer("on", torch.ones(C))
            self.register_buffer("out", self.emb if tied else frozen(V, C))

        def forward(self, tok, tgt):
            x = Fn.embedding(tok, self.emb).float()
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
            for b in self.blocks:
                h = rms(x, b.an)
                q, k = rope(b.q(h).view(B, T, H, hd)), rope(b.k(h).view(B, T, HK, hd))
                v = b.v(h).view(B, T, HK, hd)
                if HK != H:
                    k, v = k.repeat_interleave(H // HK, 2), v.repeat_interleave(H // HK, 2)
                att = (torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)).masked_fill(mask, float("-inf")).softmax(-1)
                x = x + b.o(torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, H * hd))
                h = rms(x, b.fn)
                x = x + b.d(Fn.silu(b.g(h)) * b.u(h))
            h = rms(x, self.on)
            logits = Fn.linear(h.to(wdt), self.out).float() if wdt != torch.float32 else Fn.linear(h, self.out)
            return Fn.cross_entropy(logits.view(-1, V), tgt.view(-1))

    m = Model()
    params = [p for p in m.parameters() if p.requires_grad]
    n_train = sum(p.numel() for p in params)
    n_base = sum(t.numel() for t in m.buffers())
    opt = torch.optim.AdamW(params, lr=2e-4, betas=(0.9, 0.999), weight_decay=0.0)
    t0 = 0.0
    for step in range(a.steps + 1):
        if step == 1:
            t0 = time.time()
        tok, tgt = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        opt.zero_grad(set_to_none=True)
        loss = m(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    dt = time.time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("torch-lora  base %s %.2fM frozen  adapters %.2fM (rank %d, %d matrices)  batch %dx%d  threads %d  "
          "%.2f tokens/s  %.3f s/step  peak RSS %.1f MiB  (loss %.3f, torch %s)"
          % (a.dtype, n_base / 1e6, n_train / 1e6, r, len(targets) * L, B, T, a.threads, B * T * a.steps / dt,
             dt / a.steps, rss, loss.item(), torch.__version__))


if __name__ == "__main__":
    main()
