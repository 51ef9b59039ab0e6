#!/usr/bin/env python3
"""transformers' side of tools/dev/hf_check.sh.

Loads a directory written by `qattn export --format hf` with
GPT2LMHeadModel.from_pretrained, as a user would, and compares it with the
numbers qattn produced:
  - the mean cross-entropy over the validation windows qattn's evaluation
    reads (window w = tokens [w*T, w*T + T] of the val shards concatenated in
    name order; batch i = windows i*B .. i*B + B - 1; the first --batches
    batches), in fp32 on the CPU; it must be within 1e-3 of --qattn-val;
  - the greedy continuation of end-of-text (argmax of the last position's
    logits, the whole context recomputed each step as `qattn sample` does);
    it must equal --qattn-greedy token for token.
Prints a markdown table; exits 1 when a check fails.
"""
import argparse
import array
import glob
import json
import os
import struct
import sys

LOSS_TOLERANCE = 1e-3
SHARD_MAGIC, SHARD_VERSION = 20240520, 1


def read_tokens(pattern):
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit(f"hf_check.py: no shard matches {pattern}")
    tokens = array.array("H")
    for path in paths:
        with open(path, "rb") as f:
            header = struct.unpack("<256i", f.read(1024))
            if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
                sys.exit(f"hf_check.py: {path}: not an llm.c token shard (magic {header[0]}, version {header[1]})")
            chunk = array.array("H")
            chunk.frombytes(f.read(2 * header[2]))
            if len(chunk) != header[2]:
                sys.exit(f"hf_check.py: {path}: {len(chunk)} tokens, the header says {header[2]}")
            tokens.extend(chunk)
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens


def load_model(directory):
    import torch
    from transformers import GPT2LMHeadModel

    try:  # the plainest attention arithmetic where the version offers the choice
        model, info = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager", output_loading_info=True)
    except TypeError:
        model, info = GPT2LMHeadModel.from_pretrained(directory, output_loading_info=True)
    model = model.float().eval()
    # Buffers and the tied head may be listed as missing; a parameter must not be.
    names = lambda v: [n if isinstance(n, str) else str(n) for n in v]  # mismatched_keys holds tuples
    problems = {k: [n for n in names(v) if not n.endswith(("attn.bias", "attn.masked_bias", "lm_head.weight"))]
                for k, v in info.items() if isinstance(v, (list, set, tuple))}
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        sys.exit(f"hf_check.py: from_pretrained({directory}) did not load cleanly: {problems}")
    if not torch.equal(model.lm_head.weight, model.transformer.wte.weight):
        sys.exit("hf_check.py: lm_head.weight is not the token embedding (the head should be tied)")
    return model


def val_loss(model, tokens, T, B, batches):
    import torch
    import torch.nn.functional as F

    windows = (len(tokens) - 1) // T
    if windows < B * batches:
        sys.exit(f"hf_check.py: the val shards hold {windows} windows of {T}+1 tokens; {B * batches} needed")
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            rows = [tokens[w * T: w * T + T + 1] for w in range(i * B, (i + 1) * B)]
            x = torch.tensor([list(r[:-1]) for r in rows], dtype=torch.long)
            y = torch.tensor([list(r[1:]) for r in rows], dtype=torch.long)
            logits = model(x).logits
            total += F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    return total / batches


def greedy(model, eot, count, T):
    """The argmax continuation, and the smallest gap between the two largest
    logits along it (a gap near 0 is a near tie that rounding may flip)."""
    import torch

    ids, smallest_gap = [eot], float("inf")
    with torch.no_grad():
        for _ in range(count):
            logits = model(torch.tensor([ids[-T:]], dtype=torch.long)).logits[0, -1]
            top = torch.topk(logits, 2).values
            smallest_gap = min(smallest_gap, (top[0] - top[1]).item())
            ids.append(int(torch.argmax(logits)))  # the first of equal maxima, as qattn's
    return ids[1:], smallest_gap


def gpt2_decoder(vocab_dir):
    """Token ids -> text with GPT-2's encoder.json (its byte <-> character map), or None."""
    path = os.path.join(vocab_dir, "encoder.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        token_of = {i: s for s, i in json.load(f).items()}
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return lambda ids: bytes(chars[c] for i in ids for c in token_of[i]).decode("utf-8", errors="replace")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="directory written by qattn export --format hf")
    p.add_argument("--val", required=True, help="glob of the val shards qattn evaluated")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--qattn-val", type=float, required=True, help="qattn's fp32 val loss on those windows")
    p.add_argument("--qattn-train-val", type=float, help="the training run's final val loss (shown only)")
    p.add_argument("--qattn-greedy", required=True, help="qattn sample --temperature 0 --ids output")
    p.add_argument("--vocab", default="data/cache/gpt2", help="directory with encoder.json (shows the text)")
    a = p.parse_args()

    import torch
    import transformers

    torch.manual_seed(0)
    with open(os.path.join(a.model, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    eot = config.get("eos_token_id", config["vocab_size"] - 1)
    model = load_model(a.model)
    loss = val_loss(model, read_tokens(a.val), a.seq_len, a.micro_batch, a.batches)
    theirs = [int(t) for t in a.qattn_greedy.split()]
    ours, gap = greedy(model, eot, len(theirs), a.seq_len)
    same = sum(x == y for x, y in zip(theirs, ours))
    loss_ok, greedy_ok = abs(loss - a.qattn_val) <= LOSS_TOLERANCE, theirs == ours and len(theirs) > 0

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, CPU fp32; model {a.model}")
    print(f"({config['n_layer']} layers, {config['n_embd']} wide, {config['n_head']} heads, vocab {config['vocab_size']})\n")
    print("| check | qattn | transformers | difference | result |")
    print("|---|---|---|---|---|")
    windows = f"{a.batches} x {a.micro_batch} windows of {a.seq_len}"
    print(f"| val loss, {windows} (fp32) | {a.qattn_val:.6f} | {loss:.6f} | {abs(loss - a.qattn_val):.2e} "
          f"| {'ok' if loss_ok else 'FAIL'} (within {LOSS_TOLERANCE:g}) |")
    print(f"| greedy continuation of end-of-text | {len(theirs)} tokens | {len(ours)} tokens "
          f"| {len(theirs) - same} differ | {'ok' if greedy_ok else 'FAIL'} (same tokens) |")
    if a.qattn_train_val is not None:
        print(f"\nThe training run's own final val loss (qattn's training backend): {a.qattn_train_val:.6f}")
    print(f"Smallest top-1/top-2 logit gap along transformers' greedy path: {gap:.4f}")
    decode = gpt2_decoder(a.vocab)
    if decode and config["vocab_size"] == 50257:
        print(f"qattn:        {decode(theirs)!r}")
        print(f"transformers: {decode(ours)!r}")
    else:
        print(f"qattn:        {theirs}\ntransformers: {ours}")
    sys.exit(0 if loss_ok and greedy_ok else 1)


if __name__ == "__main__":
    main()
