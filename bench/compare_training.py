#!/usr/bin/python3
"""distribute-train beside PyTorch, in one run, on the same machine.

Runs, alternating, R times each: distribute-train with 1 replica (default
strategy) and with a MirroredStrategy of N replicas, and bench/pytorch_mlp.py
with 1 thread, N threads and DistributedDataParallel over N processes. Same
model, optimizer (Adam 0.001), global batch, epochs and data. Prints the median
training samples/s of each, the scaling of distribute from 1 to N replicas,
the ratio to PyTorch's best configuration, and where replica 0's step time
went in the mirrored runs.

  bench/compare_training.py [--epochs 3] [--repeats 3] [--replicas 2] [--global-batch 128]

Needs a release build (make build) and Debian's PyTorch (scripts/setup.sh --bench).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "build", "release", "tools", "distribute-train")
TORCH = os.path.join(ROOT, "bench", "pytorch_mlp.py")


def ours(args, strategy, replicas):
    with tempfile.NamedTemporaryFile(suffix=".json") as metrics:
        cmd = [TRAIN, "--strategy", strategy, "--epochs", str(args.epochs), "--global-batch",
               str(args.global_batch), "--metrics", metrics.name]
        if strategy == "mirrored":
            cmd += ["--replicas", str(replicas)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        epochs = json.load(open(metrics.name))["epochs"]
    seconds = sum(e["train_seconds"] for e in epochs)
    samples = sum(e["train_samples_per_second"] * e["train_seconds"] for e in epochs)
    fractions = {k: statistics.mean(e["step_fraction"][k] for e in epochs) for k in epochs[0]["step_fraction"]}
    accuracy = epochs[-1]["test_accuracy"]
    blas = re.search(r"OpenBLAS.*\)", out)
    return samples / seconds, accuracy, fractions, blas.group(0) if blas else "?"


def pytorch(args, flag, value):
    cmd = [TORCH, flag, str(value), "--epochs", str(args.epochs), "--global-batch", str(args.global_batch)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    blas = re.search(r"BLAS loaded: (.*)", out).group(1)
    m = re.search(r"([\d,]+) samples/s .* test accuracy ([\d.]+)", out)
    return float(m.group(1).replace(",", "")), float(m.group(2)), blas


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=128)
    args = p.parse_args()
    n = args.replicas
    configs = [
        (f"distribute, 1 replica (default strategy)", lambda: ours(args, "default", 1)),
        (f"distribute, MirroredStrategy {n} replicas", lambda: ours(args, "mirrored", n)),
        ("pytorch, 1 process x 1 thread", lambda: pytorch(args, "--threads", 1)),
        (f"pytorch, 1 process x {n} threads", lambda: pytorch(args, "--threads", n)),
        (f"pytorch, DDP {n} processes x 1 thread", lambda: pytorch(args, "--ddp", n)),
    ]
    results = {name: [] for name, _ in configs}
    extra = {}
    for r in range(args.repeats):
        for name, fn in configs:
            got = fn()
            results[name].append(got[0])
            extra[name] = got[1:]
            print(f"  run {r + 1}/{args.repeats}: {name}: {got[0]:,.0f} samples/s", file=sys.stderr, flush=True)
    median = {name: statistics.median(v) for name, v in results.items()}
    print(f"global batch {args.global_batch}, {args.epochs} epochs, {args.repeats} runs each, alternating; "
          f"median training samples/s (min - max)")
    print(f"| configuration | samples/s | min - max | test accuracy |")
    print(f"|---|---:|---:|---:|")
    for name, _ in configs:
        v = results[name]
        print(f"| {name} | {median[name]:,.0f} | {min(v):,.0f} - {max(v):,.0f} | {extra[name][0]:.4f} |")
    mirrored = median[configs[1][0]]
    best_torch_name = max((c[0] for c in configs[2:]), key=lambda k: median[k])
    print()
    print(f"scaling, distribute 1 -> {n} replicas: {mirrored / median[configs[0][0]]:.2f}x")
    print(f"distribute {n} replicas / PyTorch's best ({best_torch_name}): {mirrored / median[best_torch_name]:.2f}x")
    fractions = extra[configs[1][0]][1]
    print("mirrored, replica 0's step time: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in fractions.items()) +
          f" (collectives: merge_call + all_reduce = {100 * (fractions['merge_call'] + fractions['all_reduce']):.1f}%)")
    print(f"BLAS: distribute {extra[configs[0][0]][2]}; pytorch loaded {extra[configs[2][0]][1]}")


if __name__ == "__main__":
    main()
