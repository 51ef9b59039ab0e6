#!/usr/bin/env python3
"""The arithmetic of one GPT-2 training step on the CUDA backend
(src/cuda/gpt2_cuda.cpp), op by op: each launch's FLOPs (matrix products
only), the bytes it must move through device memory (every array it reads or
writes counted once), its exponentials (attention's softmax and the
classifier's), and its floor on an H200 (the largest of the three at the
datasheet rates below). Attention is FPA's (`fpa`) and sage's with all six
products in fp8 (`sage-fp8`), launch by launch as `qattn bench attention
--phases` names them, at the step's shape and at each `--shape B,H,T,d`.

With measured tokens/s (`--tokens-per-s NAME=VALUE`, `fpa` among them) it
also prints each setting's step time, its difference to FPA's per step and per
attention call, and what a `--target` speed-up over FPA asks of attention;
with measured attention calls at the step's shape (`--call-ms NAME=MS`,
forward + backward from `qattn bench attention --shape B,H,T,d`) attention's
share of the step.

usage: tools/dev/gpt2_ledger.py configs/gpt2_124m_fpa.json --micro-batch 64 \\
           --tokens-per-s fpa=585870 --tokens-per-s sage-fp8=577916 [--call-ms fpa=1.6]"""
import argparse
import json
import sys

BF16_FLOPS = 989e12  # dense, the H200 datasheet (the trainer's MFU peak)
FP8_FLOPS = 1979e12
BYTES_PER_S = 4.8e12  # HBM3e
# MUFU.EX2: 16 results per clock per SM (sm_90), 132 SMs, 1.98 GHz.
EXP_PER_S = 16 * 132 * 1.98e9
VOCAB_MULTIPLE = 128  # gpt2_cuda.cpp: kVocabMultiple


class Op:
    def __init__(self, name, group, flops=0.0, nbytes=0.0, exps=0.0, fp8=False):
        self.name, self.group = name, group
        self.flops, self.bytes, self.exps, self.fp8 = flops, nbytes, exps, fp8

    def scaled(self, k):
        return Op(self.name, self.group, k * self.flops, k * self.bytes, k * self.exps, self.fp8)

    def floor_s(self):
        rate = FP8_FLOPS if self.fp8 else BF16_FLOPS
        return max(self.flops / rate, self.bytes / BYTES_PER_S, self.exps / EXP_PER_S)


def attention_ops(kind, B, H, T, d):
    """One forward + backward at (B, H, T, d), launch by launch."""
    act = 2.0 * B * T * H * d  # one (B, T, H, d) bf16 activation
    code = B * T * H * d  # one 8-bit copy (T a whole number of 64-row blocks)
    rows = 4.0 * B * H * T  # one fp32 per (b, h, row)
    product = float(B) * H * T * T * d  # one causal product, FlashAttention's count
    scores = B * H * T * T / 2.0  # the causal half: one exponential each per pass
    if kind == "fpa":
        return [
            Op("attention forward", "attention", 2 * product, 3 * act + act + rows, scores),
            Op("attention delta", "attention", 0, 2 * act + rows),
            # dK/dV blocks (S, dP, dV, dK) and dQ blocks (S, dP, dQ), each making P
            Op("attention dkdv+dq", "attention", 7 * product, 3 * act + act + 2 * rows + 3 * act, 2 * scores),
        ]
    if kind == "sage-fp8":
        blocks = T // 64
        sums = 4.0 * B * H * blocks * d
        scales = 4.0 * B * H * blocks
        return [
            Op("sage key_block_sums", "attention", 0, act + sums),
            Op("sage key_mean", "attention", 0, sums + 4.0 * B * H * d),
            # Q, K, V in; Q̂, Q̂ᵀ, K̂, K̂ᵀ, V̂, V̂ᵀ out, their scales, ‖V‖ and its block maxima
            Op("sage quantise_qkv", "attention", 0, 3 * act + 6 * code + 7 * scales + rows),
            Op("sage forward", "attention", 2 * product, 3 * code + act + rows, scores, fp8=True),
            # dO, O in; dÔ, dÔᵀ, their scales, δ, ‖dO‖ and the block maxima of ‖dO‖, |δ| out
            Op("sage quantise_dout", "attention", 0, 2 * act + 2 * code + 4 * scales + 2 * rows),
            Op("sage dq", "attention", 3 * product, 5 * code + 4 * rows + act, scores, fp8=True),
            Op("sage dkdv", "attention", 4 * product, 6 * code + 4 * rows + 2 * act, scores, fp8=True),
        ]
    raise ValueError(f"attention kind '{kind}' (allowed: fpa, sage-fp8)")


def step_ops(model, micro_batch, tokens_per_step, kind):
    """Every launch of one training step: (ops, micro-batches per step)."""
    L, H, C, T = model["layers"], model["heads"], model["dim"], model["seq_len"]
    V = model["vocab"]
    Vp = (V + VOCAB_MULTIPLE - 1) // VOCAB_MULTIPLE * VOCAB_MULTIPLE
    B = micro_batch
    if tokens_per_step % (B * T):
        raise ValueError(f"train.tokens_per_step {tokens_per_step} is not a whole number of micro-batches "
                         f"of {B} x {T} tokens")
    accum = tokens_per_step // (B * T)
    N = B * T
    a = lambda width: 2.0 * N * width  # an (N, width) bf16 activation
    w = lambda rows, cols: 2.0 * rows * cols  # a bf16 weight
    g = lambda rows, cols: 8.0 * rows * cols  # an fp32 gradient read and written (accumulated)
    stats = 8.0 * N  # a LayerNorm's mean and rstd

    def matmul(name, IC, OC, reads, writes, weight_grad=False, group="matmul"):
        # out (N, OC) = inp (N, IC) . w (OC, IC)^T; the weight gradient
        # reads dout and inp and accumulates into fp32 dW.
        if weight_grad:
            return Op(name, group, 2.0 * N * IC * OC, reads + g(OC, IC))
        return Op(name, group, 2.0 * N * IC * OC, reads + w(OC, IC) + writes)

    per_micro = [Op("encoder forward", "other", 0, a(C) + 2 * a(C) + 4.0 * N)]
    layer = [
        Op("ln1 forward", "layernorm", 0, a(C) + a(C) + stats),
        matmul("qkv", C, 3 * C, a(C), a(3 * C)),
        *attention_ops(kind, B, H, T, C // H),
        matmul("attproj (+ residual)", C, C, 2 * a(C), a(C)),
        Op("ln2 forward", "layernorm", 0, a(C) + a(C) + stats),
        matmul("fc (+ GELU)", C, 4 * C, a(C), 2 * a(4 * C)),
        matmul("fcproj (+ residual)", 4 * C, C, a(4 * C) + a(C), a(C)),
        # backward, from the MLP down
        matmul("fcproj dW", 4 * C, C, a(C) + a(4 * C), 0, True),
        matmul("fcproj dinp (GELU')", 4 * C, C, a(C) + a(4 * C), a(4 * C)),
        matmul("fc dW", C, 4 * C, a(4 * C) + a(C), 0, True),
        matmul("fc dinp", C, 4 * C, a(4 * C), a(C)),
        Op("ln2 backward", "layernorm", 0, a(C) + a(C) + stats + 2 * a(C)),
        matmul("attproj dW", C, C, 2 * a(C), 0, True),
        matmul("attproj dinp", C, C, a(C), a(C)),
        matmul("qkv dW", C, 3 * C, a(3 * C) + a(C), 0, True),
        matmul("qkv dinp", C, 3 * C, a(3 * C), a(C)),
        Op("ln1 backward", "layernorm", 0, a(C) + a(C) + stats + 2 * a(C)),
    ]
    per_micro += [op.scaled(L) for op in layer]
    per_micro += [
        Op("lnf forward", "layernorm", 0, 2 * a(C) + stats),
        matmul("lm head", C, Vp, a(C), a(Vp), group="lm head"),
        # softmax over the padded row: logits read once, dlogits written in place
        Op("classifier", "lm head", 0, 2 * a(Vp) + 8.0 * N, float(N) * V),
        matmul("lm head dinp", C, Vp, a(Vp), a(C), group="lm head"),
        matmul("lm head dW", C, Vp, a(Vp) + a(C), 0, True, group="lm head"),
        Op("dres zero", "other", 0, a(C)),
        Op("lnf backward", "layernorm", 0, 2 * a(C) + stats + 2 * a(C)),
        Op("encoder backward", "other", 0, a(C) + 2 * 4.0 * N * C),
    ]
    params = L * (12 * C * C + 13 * C) + Vp * C + T * C + 2 * C
    per_step = [op.scaled(accum) for op in per_micro]
    # once per step: the gradients zeroed, their norm, AdamW (master, m, v,
    # gradient in; master, m, v, bf16 parameters out)
    per_step += [
        Op("zero grads", "optimizer", 0, 4.0 * params),
        Op("grad norm", "optimizer", 0, 4.0 * params),
        Op("adamw", "optimizer", 0, 30.0 * params),
    ]
    return per_step, accum


def named_values(items, what):
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if not sep or not name or not number > 0 or number == float("inf"):
            sys.exit(f"{what} '{item}' is not allowed; allowed: NAME=NUMBER with NUMBER > 0")
        out[name] = number
    return out


def read_config(path):
    """The config's model section and train.tokens_per_step, checked."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        sys.exit(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        sys.exit(f"{path}: not JSON: {e}")
    model = cfg.get("model") if isinstance(cfg, dict) else None
    train = cfg.get("train") if isinstance(cfg, dict) else None
    if not isinstance(model, dict) or not isinstance(train, dict):
        sys.exit(f"{path}: needs a 'model' and a 'train' object")
    for where, key in [(model, k) for k in ("layers", "heads", "dim", "seq_len", "vocab")] + [
            (train, "tokens_per_step")]:
        value = where.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            section = "model" if where is model else "train"
            sys.exit(f"{path}: {section}.{key} {json.dumps(value)} is not allowed; allowed: a positive integer")
    if model["dim"] % model["heads"]:
        sys.exit(f"{path}: model.dim {model['dim']} is not a multiple of model.heads {model['heads']}")
    return model, train


def print_ops(title, ops):
    print(title)
    print(f"  {'op':28s} {'GFLOP':>10s} {'GB':>9s} {'Gexp':>7s} {'floor ms':>9s}")
    for op in ops:
        print(f"  {op.name:28s} {op.flops / 1e9:10.1f} {op.bytes / 1e9:9.2f} {op.exps / 1e9:7.2f} {1e3 * op.floor_s():9.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="a model config (JSON with a 'model' and a 'train' section)")
    ap.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the config's)")
    ap.add_argument("--tokens-per-s", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--call-ms", action="append", default=[], metavar="NAME=MS",
                    help="measured attention forward + backward at the step's (B, H, T, d)")
    ap.add_argument("--target", type=float, default=1.05, help="speed-up over fpa asked for")
    ap.add_argument("--shape", action="append", default=[], metavar="B,H,T,d",
                    help="also the floors of one attention call at this shape")
    args = ap.parse_args()
    model, train = read_config(args.config)
    B = train.get("micro_batch") if args.micro_batch is None else args.micro_batch
    if not isinstance(B, int) or B < 1:
        sys.exit(f"--micro-batch {B} is not allowed; allowed: a positive integer (or the config's "
                 "train.micro_batch)")
    if not args.target > 0:
        sys.exit(f"--target {args.target} is not allowed; allowed: a number > 0")
    tokens_per_step = train["tokens_per_step"]
    T, H, C, L = model["seq_len"], model["heads"], model["dim"], model["layers"]
    if tokens_per_step % (B * T):
        sys.exit(f"{args.config}: train.tokens_per_step {tokens_per_step} is not a whole number of "
                 f"micro-batches of {B} x {T} tokens (--micro-batch {B})")
    measured = named_values(args.tokens_per_s, "--tokens-per-s")
    call_ms = named_values(args.call_ms, "--call-ms")
    if measured and "fpa" not in measured:
        sys.exit("--tokens-per-s: fpa=VALUE is needed (the other settings are compared with it)")
    for name in call_ms:
        if name not in measured:
            sys.exit(f"--call-ms {name}: no --tokens-per-s {name}=VALUE to set it against")
    shapes = [(B, H, T, C // H)]
    for text in args.shape:
        try:
            shape = tuple(int(x) for x in text.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 4 or min(shape) < 1 or shape[2] % 64:
            sys.exit(f"--shape '{text}' is not allowed; allowed: B,H,T,d, positive, T a multiple of 64")
        shapes.append(shape)
    print(f"GPT-2: {L} layers, {H} heads, dim {C}, T {T}; micro-batch {B}, {tokens_per_step:,} tokens per step")
    print(f"floors: bf16 {BF16_FLOPS / 1e12:.0f}, fp8 {FP8_FLOPS / 1e12:.0f} TFLOP/s; "
          f"{BYTES_PER_S / 1e12:.1f} TB/s; {EXP_PER_S / 1e12:.2f}e12 exp/s\n")
    for shape in shapes:
        for kind in ("fpa", "sage-fp8"):
            ops = attention_ops(kind, *shape)
            print_ops(f"attention {kind}, one call at {shape}:", ops)
            pre = sum(op.floor_s() for op in ops if op.flops == 0)
            total = sum(op.floor_s() for op in ops)
            print(f"  {'sum of floors':28s} {'':>10s} {'':>9s} {'':>7s} {1e3 * total:9.2f}"
                  f"  (passes without products {1e3 * pre:.2f})\n")
    groups = {}
    for kind in ("fpa", "sage-fp8"):
        ops, accum = step_ops(model, B, tokens_per_step, kind)
        calls = L * accum
        groups[kind] = {}
        for op in ops:
            tot = groups[kind].setdefault(op.group, [0.0, 0.0, 0.0])
            tot[0] += op.flops
            tot[1] += op.bytes
            tot[2] += op.floor_s()
    print(f"per step ({accum} micro-batches, {calls} attention calls), by group:")
    print(f"  {'group':12s} {'TFLOP':>8s} {'GB':>15s} {'floor ms':>13s}  (attention: fpa / sage-fp8)")
    for group in groups["fpa"]:
        f, s = groups["fpa"][group], groups["sage-fp8"][group]
        cell = lambda i, scale, fmt: (format(f[i] / scale, fmt) if f[i] == s[i]
                                      else format(f[i] / scale, fmt) + " / " + format(s[i] / scale, fmt))
        print(f"  {group:12s} {cell(0, 1e12, '.1f'):>8s} {cell(1, 1e9, '.1f'):>15s} {cell(2, 1e-3, '.1f'):>13s}")
    for kind in ("fpa", "sage-fp8"):
        total = [sum(v[i] for v in groups[kind].values()) for i in range(3)]
        att = groups[kind]["attention"]
        print(f"  total ({kind}): {total[0] / 1e12:.1f} TFLOP, {total[1] / 1e9:.1f} GB, floor {1e3 * total[2]:.1f} ms; "
              f"attention {100 * att[0] / total[0]:.1f}% of the FLOPs, {100 * att[1] / total[1]:.1f}% of the bytes, "
              f"{100 * att[2] / total[2]:.1f}% of the floor")

    if not measured:
        return
    step = {name: tokens_per_step / v for name, v in measured.items()}
    print(f"\nmeasured tokens/s -> step (arithmetic; {calls} attention calls per step):")
    for name, s in step.items():
        d = s - step["fpa"]
        print(f"  {name:12s} {measured[name]:>10,.0f} tokens/s  {1e3 * s:8.1f} ms  "
              f"{1e3 * d:+7.1f} ms vs fpa, {1e3 * d / calls:+.3f} ms per call")
    goal = step["fpa"] / args.target
    print(f"  {args.target}x fpa: {tokens_per_step / goal:,.0f} tokens/s, step {1e3 * goal:.1f} ms: "
          f"attention {1e3 * (step['fpa'] - goal):.1f} ms per step under fpa's, "
          f"{1e3 * (step['fpa'] - goal) / calls:.3f} ms per call")
    for name, s in step.items():
        if name != "fpa":
            print(f"    {name}: {1e3 * (s - goal) / calls:.3f} ms per call faster than now")
    for name, ms in call_ms.items():
        share = calls * ms / 1e3 / step[name]
        print(f"  {name}: attention {calls * ms:.1f} ms of {1e3 * step[name]:.1f} per step ({100 * share:.1f}%)")
        if name == "fpa":
            need = ms - 1e3 * (step["fpa"] - goal) / calls
            print(f"    {args.target}x fpa asks attention of {need:.3f} ms per call, "
                  f"{ms / need:.2f}x fpa's speed")


if __name__ == "__main__":
    main()
