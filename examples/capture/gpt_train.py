#!/usr/bin/env python3
"""A GPT-style model in plain PyTorch, trained on one GPU and recorded with lumos_capture.

bf16 autocast, FlashAttention through ``scaled_dot_product_attention`` (causal), AdamW (foreach),
a host batch copied in each step and ``loss.item()`` at the end of the step, as a training loop
that logs its loss does.  Every transformer layer is a ``TransformerLayer[i]`` record_function
scope and the phases are ``## forward ##`` / ``## backward ##`` / ``## optimizer ##``, so lumos
finds layers and phases from annotations.

    python3 gpt_train.py --out traces/base --layers 8 --hidden 2048 --seq 1024 --micro-batch 4

Controlled variants for measured what-if truth:
  --dup-fc1          the first MLP GEMM of every layer runs twice in the forward pass (the first
                     result is discarded): x2 on a known op, inside the ``mlp_fc1`` scope;
  --cpu-wait-us N    a CPU busy-wait of N microseconds at the start of every layer's forward
                     (``cpu_wait`` scope);
  --cuda-graphs      the whole step (forward, backward, optimizer) captured once as a CUDA graph
                     and replayed;
  --accum N          N micro-batches per step (gradient accumulation): each runs its own
                     ``## forward ##`` and ``## backward ##``, the optimizer runs once after the last.

Prints one JSON line ``{"result": {...}}`` with the shape, the versions and the step times
measured without the profiler (``loss.item()`` makes each step end on the host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lumos_capture  # noqa: E402


def busy_wait(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class Block(nn.Module):
    def __init__(self, index: int, hidden: int, heads: int, ffn: int, dup_fc1: bool, cpu_wait_us: float):
        super().__init__()
        self.index, self.heads, self.dup_fc1, self.cpu_wait_us = index, heads, dup_fc1, cpu_wait_us
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with record_function(f"TransformerLayer[{self.index}]"):
            if self.cpu_wait_us > 0:
                with record_function("cpu_wait"):
                    busy_wait(self.cpu_wait_us)
            b, s, h = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            y = self.ln2(x)
            with record_function("mlp_fc1"):
                z = self.fc1(y)
                if self.dup_fc1:
                    z = self.fc1(y)
            return x + self.fc2(F.gelu(z))


class GPT(nn.Module):
    def __init__(self, a: argparse.Namespace):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.seq, a.hidden)
        self.blocks = nn.ModuleList(Block(i, a.hidden, a.heads, a.ffn, a.dup_fc1, a.cpu_wait_us) for i in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="trace directory (rank0.json.gz is written there)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=0, help="default: hidden / 128")
    p.add_argument("--ffn", type=int, default=0, help="default: 4 x hidden")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    p.add_argument("--dup-fc1", action="store_true")
    p.add_argument("--cpu-wait-us", type=float, default=0.0)
    p.add_argument("--cuda-graphs", action="store_true")
    p.add_argument("--warmup-steps", type=int, default=3, help="unprofiled steps before the capture")
    p.add_argument("--steps", type=int, default=3, help="recorded steps")
    p.add_argument("--timed-steps", type=int, default=10, help="unprofiled steps timed after the capture")
    a = p.parse_args()
    a.heads = a.heads or max(1, a.hidden // 128)
    a.ffn = a.ffn or 4 * a.hidden
    if a.accum < 1 or (a.accum > 1 and a.cuda_graphs):
        print("gpt_train.py: --accum must be >= 1, and 1 with --cuda-graphs", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpt_train.py needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dev = torch.device("cuda")
    with dev:
        model = GPT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=a.cuda_graphs)
    host_batch = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1)).pin_memory()

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        # autocast's weight cache must be off under graph capture
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not a.cuda_graphs):
            logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.float().view(-1, a.vocab), tokens[:, 1:].reshape(-1))

    def eager_step() -> float:
        for _ in range(a.accum):
            tokens = host_batch.to(dev, non_blocking=True)
            with record_function("## forward ##"):
                loss = loss_of(tokens)
                if a.accum > 1:
                    loss = loss / a.accum
            with record_function("## backward ##"):
                loss.backward()
        with record_function("## optimizer ##"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.item()

    step = eager_step
    if a.cuda_graphs:
        static_tokens = host_batch.to(dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_of(static_tokens).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = loss_of(static_tokens)
            static_loss.backward()
            opt.step()

        def graph_step() -> float:
            static_tokens.copy_(host_batch, non_blocking=True)
            graph.replay()
            return static_loss.item()

        step = graph_step

    for _ in range(a.warmup_steps):
        step()
    with lumos_capture.capture(a.out, steps=a.steps, wait=0, warmup=1) as cap:
        for _ in range(cap.steps_needed):
            step()
            cap.step()
    times = []
    for _ in range(a.timed_steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    params = sum(p.numel() for p in model.parameters())
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "shape": {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "ffn": a.ffn, "seq": a.seq,
                  "micro_batch": a.micro_batch, "vocab": a.vocab, "accum": a.accum},
        "mode": "cuda_graphs" if a.cuda_graphs else "eager",
        "dup_fc1": a.dup_fc1,
        "cpu_wait_us": a.cpu_wait_us,
        "parameters": params,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "unprofiled_step_ms": [round(t, 4) for t in times],
        "unprofiled_step_ms_median": round(statistics.median(times), 4),
        "files": cap.files,
    }
    print(json.dumps({"result": result}), flush=True)
    return 0 if cap.files else 1


if __name__ == "__main__":
    sys.exit(main())
