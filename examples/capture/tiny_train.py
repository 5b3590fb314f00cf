#!/usr/bin/env python3
"""Tiny training run recorded with lumos_capture: a 2-layer transformer (or an MLP) on random
tokens, on CUDA when there is a device, else on CPU.

    python3 tiny_train.py --out traces/                      # context-manager form
    python3 tiny_train.py --out traces/ --form decorator     # decorator form
    python3 tiny_train.py --out traces/ --world-size 2       # 2 local ranks (DDP, gloo/nccl)
    torchrun --nproc-per-node 2 tiny_train.py --out traces/  # ranks from torchrun

Then: lumos inspect traces/
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lumos_capture  # noqa: E402


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 256, d_model: int = 64, layers: int = 2, heads: int = 4, seq: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos[:, : tokens.shape[1]]))


def build(kind: str, seq: int) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(nn.Embedding(256, 64), nn.Flatten(0, 1), nn.Linear(64, 256), nn.ReLU(),
                             nn.Linear(256, 256))
    return TinyTransformer(seq=seq)


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if world > 1:
        import torch.distributed as dist
        if device.type == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(rank)

    model = build(args.model, args.seq).to(device)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def batches():
        while True:
            tokens = torch.randint(0, 256, (args.batch, args.seq + 1), device=device)
            yield tokens[:, :-1], tokens[:, 1:]

    def train_step(batch):
        x, y = batch
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    options = dict(steps=args.steps, wait=args.wait, warmup=args.warmup)
    data = batches()
    if args.form == "context":
        # --- lumos_capture, context-manager form ---
        with lumos_capture.capture(args.out, **options) as cap:
            for it in range(args.iters or cap.steps_needed):
                loss = train_step(next(data))
                cap.step()
                if cap.done and not args.iters:
                    break
        files = cap.files
    else:
        # --- lumos_capture, decorator form ---
        step = lumos_capture.profile_steps(args.out, **options)(train_step)
        for it in range(args.iters or step.capture.steps_needed):
            loss = step(next(data))
        files = step.finish()
    print(f"rank {rank}: final loss {float(loss):.4f}; traces {files}", flush=True)

    if world > 1:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()


def _spawned(rank: int, world: int, args: argparse.Namespace) -> None:
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world)
    run(rank, world, args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="lumos_traces", help="trace directory (default lumos_traces)")
    p.add_argument("--form", choices=["context", "decorator"], default="context")
    p.add_argument("--model", choices=["transformer", "mlp"], default="transformer")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    p.add_argument("--steps", type=int, default=3, help="recorded (active) steps")
    p.add_argument("--wait", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=0, help="loop iterations (default: just the schedule)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    p.add_argument("--world-size", type=int, default=1, help="spawn this many local ranks")
    args = p.parse_args()

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)  # torchrun
    elif args.world_size > 1:
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        mp.spawn(_spawned, args=(args.world_size, args), nprocs=args.world_size, join=True)
    else:
        run(0, 1, args)


if __name__ == "__main__":
    main()
