#!/usr/bin/python3
"""The training step of distribute-train, in PyTorch, for a side-by-side run.

Same model (784-256-128-10, ReLU, softmax cross-entropy), same optimizer
(Adam, lr 0.001), same global batch, same Fashion-MNIST files. Prints one
line per configuration: samples/s over the training epoch(s) and the test
accuracy. Configurations: --threads N (one process, torch.set_num_threads)
or --ddp N (DistributedDataParallel over N processes, one thread each, gloo).

Debian's PyTorch calls whatever libblas.so.3 is installed; the line printed
first names the BLAS library this process has loaded, to show it is OpenBLAS.
"""
import argparse
import gzip
import os
import re
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def load(data_dir, stem, rank):
    path = os.path.join(data_dir, stem)
    with gzip.open(path + ".gz" if not os.path.exists(path) else path, "rb") as f:
        raw = f.read()
    return np.frombuffer(raw, dtype=np.uint8, offset=16 if rank == 3 else 8)


def dataset(data_dir):
    x = load(data_dir, "train-images-idx3-ubyte", 3).reshape(-1, 784)
    y = load(data_dir, "train-labels-idx1-ubyte", 1)
    tx = load(data_dir, "t10k-images-idx3-ubyte", 3).reshape(-1, 784)
    ty = load(data_dir, "t10k-labels-idx1-ubyte", 1)
    to_x = lambda a: torch.from_numpy(a.astype(np.float32) / 255.0)
    to_y = lambda a: torch.from_numpy(a.astype(np.int64))
    return to_x(x), to_y(y), to_x(tx), to_y(ty)


def model():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def blas_loaded():
    maps = open("/proc/self/maps").read()
    return sorted(set(os.path.basename(p) for p in re.findall(r"/\S*(?:blas|lapack)\S*\.so[.0-9]*", maps)))


def train(rank, world, args, result=None):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads if world == 1 else 1)
    if world > 1:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=rank, world_size=world)
    x, y, tx, ty = dataset(args.data)
    net = model()
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(net.parameters(), lr=0.001, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x.shape[0]
    per = args.global_batch // world
    rows = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + epoch))
        for b in range(0, n, args.global_batch):
            idx = order[b:b + args.global_batch][rank * per:(rank + 1) * per]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            rows += idx.shape[0] * world
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (net(tx).argmax(dim=1) == ty).float().mean().item()
    if rank == 0:
        label = f"ddp {world} processes x 1 thread" if world > 1 else f"1 process x {args.threads} thread(s)"
        print(f"pytorch {label}: {rows / seconds:,.0f} samples/s ({seconds:.2f} s), test accuracy {accuracy:.4f}",
              flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ddp", type=int, default=0, help="processes for DistributedDataParallel (0: none)")
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    print(f"pytorch {torch.__version__}, BLAS loaded: {', '.join(blas_loaded()) or 'none found'}", flush=True)
    if args.ddp > 1:
        mp.spawn(train, args=(args.ddp, args), nprocs=args.ddp)
    else:
        train(0, 1, args)


if __name__ == "__main__":
    sys.exit(main())
