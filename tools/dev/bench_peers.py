#!/usr/bin/env python3
"""Peer speeds for qattn's benchmarks, measured with PyTorch on the same GPU.

  attention: torch SDPA, causal, bf16, with the FlashAttention-2 and cuDNN back
             ends, at the shapes given; the same table as `qattn bench attention`
             (FLOPs: forward 2*B*H*T^2*d, backward 2.5x). With --qattn BINARY the
             qattn kernel runs in the same call and the ratios qattn/peer are printed.
  gpt2:      one GPT-2 124M training step (T = 1024, micro-batch 32, bf16
             autocast, fused AdamW), eager and torch.compile, in tokens/s.

PyTorch is a peer here, never a dependency of qattn: this script runs only on
the GPU machine, where PyTorch is installed.

  python3 tools/dev/bench_peers.py --shape 8,12,1024,64 --shape 4,16,4096,128 \
      --qattn build-gpu/qattn [--attention-only]
"""
import argparse
import math
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def parse_shape(text):
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"--shape '{text}': expected B,H,T,d (four positive integers)")
    return shape


def median(xs):
    return sorted(xs)[len(xs) // 2]


def time_sdpa(backend, shape, warmup, reps):
    """Median forward and backward milliseconds of causal SDPA on one back end."""
    B, H, T, d = shape
    q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    fwd, bwd = [], []
    with sdpa_kernel([backend]):
        for i in range(warmup + reps):
            for x in (q, k, v):
                x.grad = None
            events[0].record()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            events[1].record()
            out.backward(dout)
            events[2].record()
            torch.cuda.synchronize()
            if i >= warmup:
                fwd.append(events[0].elapsed_time(events[1]))
                bwd.append(events[1].elapsed_time(events[2]))
    return median(fwd), median(bwd)


def qattn_times(binary, shapes, warmup, reps):
    """{shape: (fwd ms, bwd ms)} from `qattn bench attention --kind fpa`."""
    cmd = [binary, "bench", "attention", "--kind", "fpa", "--no-check",
           "--warmup", str(warmup), "--reps", str(reps)]
    for s in shapes:
        cmd += ["--shape", ",".join(map(str, s))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 10 and f[0] == "fpa":
            times[tuple(int(x) for x in f[1:5])] = (float(f[5]), float(f[7]))
    return times


def print_row(name, shape, fwd_ms, bwd_ms, extra=""):
    B, H, T, d = shape
    flops = 2.0 * B * H * T * T * d
    print(f"{name:<14} {B:3d} {H:3d} {T:6d} {d:4d}  {fwd_ms:8.3f} {flops / fwd_ms / 1e9:8.1f}"
          f"  {bwd_ms:8.3f} {2.5 * flops / bwd_ms / 1e9:8.1f}  {fwd_ms + bwd_ms:9.3f}{extra}")


def bench_attention(args):
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; causal bf16, "
          f"{args.warmup} warm-up + {args.reps} timed runs, median; TFLOP/s fwd 2BHT^2d, bwd 2.5x")
    print(f"{'system':<14} {'B':>3} {'H':>3} {'T':>6} {'d':>4}  {'fwd ms':>8} {'TFLOP/s':>8}"
          f"  {'bwd ms':>8} {'TFLOP/s':>8}  {'total ms':>9}  qattn speed / peer (fwd, bwd, total)")
    ours = qattn_times(args.qattn, args.shape, args.warmup, args.reps) if args.qattn else {}
    for shape in args.shape:
        if shape in ours:
            print_row("qattn fpa", shape, *ours[shape])
        for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                f, b = time_sdpa(backend, shape, args.warmup, args.reps)
            except RuntimeError as e:  # a back end may refuse a shape
                print(f"{name:<14} {shape}: not available ({str(e).splitlines()[0]})")
                continue
            extra = ""
            if shape in ours:
                of, ob = ours[shape]
                extra = f"  {f / of:5.2f} {b / ob:5.2f} {(f + b) / (of + ob):5.2f}"
            print_row(name, shape, f, b, extra)
        sys.stdout.flush()


# ---------------------------------------------------------------------------
# GPT-2 124M, nanoGPT-style: the PyTorch training step qattn's trainer competes with.

class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50304, T=1024, L=12, H=12, C=768):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def bench_gpt2(compiled, micro_batch=32, T=1024, warmup=5, steps=10):
    torch.manual_seed(0)
    model = GPT2().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if compiled else model
    idx = torch.randint(0, 50257, (micro_batch, T), device="cuda")
    tgt = torch.randint(0, 50257, (micro_batch, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.time()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps
    name = "torch.compile" if compiled else "eager"
    print(f"gpt2-124m {name:<14} micro-batch {micro_batch} T {T}: {ms:7.1f} ms/step, "
          f"{micro_batch * T / ms * 1e3:10.0f} tokens/s (warm-up {warm_s:.0f} s)")
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=parse_shape, action="append",
                   help="B,H,T,d (repeatable); default 8,12,1024,64 and 4,16,4096,128")
    p.add_argument("--qattn", help="path of the qattn binary, to time its fpa kernel in the same call")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--attention-only", action="store_true", help="skip the GPT-2 training step")
    p.add_argument("--gpt2-only", action="store_true", help="skip the attention kernels")
    args = p.parse_args()
    args.shape = args.shape or [(8, 12, 1024, 64), (4, 16, 4096, 128)]
    if not torch.cuda.is_available():
        sys.exit("bench_peers.py needs a CUDA GPU and PyTorch with CUDA")
    torch.backends.cuda.matmul.allow_tf32 = True
    if not args.gpt2_only:
        bench_attention(args)
    if not args.attention_only:
        for compiled in (False, True):
            bench_gpt2(compiled)


if __name__ == "__main__":
    main()
