#!/usr/bin/env python3
"""ntpbench's training step against PyTorch eager's on this CPU, measured side by side.

The same job on one process: GPT-2 small (12 layers, 12 heads, 768 wide, vocabulary 50,257, tied
head), B sequences of T tokens, forward + backward + global-norm clipping at 1.0 + AdamW (lr 3e-4,
betas 0.9/0.95, weight decay 0.1 on 2-D tensors), fp32, THREADS threads each. PyTorch runs its best
case on a CPU: fused AdamW, scaled_dot_product_attention, flush-denormal on. The two are
interleaved round by round (ntpbench's steps, then PyTorch's), and each round's median step is
printed, then the medians' ratio. Needs torch in the interpreter that runs this script (it is not
one of ntpbench's dependencies: `pip install torch` in a venv of its own, bench/README.md), and a
build of ntpbench.

    python3 bench/vs_pytorch.py build/ntpbench [--batch 4 --seq 64 --threads 2 --steps 10 --rounds 3]

Exits 77 (skipped) without torch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


PHASES = ("forward", "backward", "optimizer", "other")


def ntpbench_steps(binary: str, a, out: str) -> list[dict]:
    """Seconds of each step of one ntpbench run, whole and by phase (its results file's /steps and
    /ranks/phase_times), the first two left out."""
    import h5py
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    cmd = [binary, "--preset", "gpt2", "--micro-batch", str(a.batch), "--seq", str(a.seq), "--threads",
           str(a.threads), "--steps", str(a.steps + 2), "--quiet", "--no-final-checkpoint", "--overwrite",
           "--out", out]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ntpbench failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    with h5py.File(out, "r") as f:
        st = f["steps"][()]
        pt = f["ranks/phase_times"][()][:, 0, :]  # one rank
        names = f["ranks/phase_times"].attrs["phases"]
        names = (names.decode() if isinstance(names, bytes) else str(names)).split(",")
        blas = f.attrs.get("blas_core_choice", b"")
    a.blas = blas.decode() if isinstance(blas, bytes) else str(blas)
    rows = []
    for i in range(2, len(st)):
        by = dict(zip(names, pt[i]))
        step = float(st["t_end"][i] - st["t_start"][i])
        known = {k: float(by[k]) for k in PHASES[:3]}
        rows.append({"step": step, **known, "other": step - sum(known.values())})
    return rows


def pytorch_model(torch, vocab=50257, context=1024, layers=12, heads=12, width=768):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head, as ntpbench's GPT-2
            return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    return GPT()


def pytorch_steps(torch, a) -> list[float]:
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model = pytorch_model(torch)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    rows = []
    for i in range(a.steps + 2):
        idx = torch.randint(0, 50257, (a.batch, a.seq))
        targets = torch.randint(0, 50257, (a.batch, a.seq))
        t0 = time.perf_counter()
        loss = model(idx, targets)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t3 = time.perf_counter()
        if i >= 2:
            rows.append({"step": t3 - t0, "forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "other": 0.0})
    return rows


def medians(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in ("step", *PHASES)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ntpbench", help="the ntpbench binary (build/ntpbench)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and side (two more warm up)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed in this interpreter (bench/README.md says how)", file=sys.stderr)
        return 77
    print(f"gpt2, one process, B {a.batch}, T {a.seq}, {a.threads} threads, {a.steps} steps per round; "
          f"torch {torch.__version__}")
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            ours.append(medians(ntpbench_steps(a.ntpbench, a, os.path.join(d, "run.h5"))))
            theirs.append(medians(pytorch_steps(torch, a)))
            print(f"round {r + 1}: ntpbench {ours[-1]['step'] * 1e3:8.1f} ms   pytorch {theirs[-1]['step'] * 1e3:8.1f} ms"
                  f"   ntpbench / pytorch {ours[-1]['step'] / theirs[-1]['step']:.3f}", flush=True)
    print(f"ntpbench's BLAS: {a.blas}")
    print("median over rounds, ms (PyTorch's optimizer: clipping and fused AdamW; its other: none measured):")
    print(f"{'':10}{'step':>9}" + "".join(f"{p:>11}" for p in PHASES))
    for name, rows in (("ntpbench", ours), ("pytorch", theirs)):
        print(f"{name:10}" + "".join(f"{statistics.median(r[k] for r in rows) * 1e3:{9 if k == 'step' else 11}.1f}"
                                     for k in ("step", *PHASES)))
    ratio = statistics.median([o["step"] / t["step"] for o, t in zip(ours, theirs)])
    print(f"ntpbench / pytorch: {ratio:.3f} (the target: 0.5 or less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
