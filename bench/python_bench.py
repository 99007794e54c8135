"""The Python front end's costs, measured side by side in one process.

    PYTHONPATH=build/release/python python3 bench/python_bench.py [--quick]

1. ctx.all_reduce from Python against the same loop in C++ (a binding that
   runs it without Python), 8 B and 1 MiB of float32 on 1 and 2 replicas,
   from a Tensor and from a numpy array (a copy into a new tensor per call:
   the C++ loop it is compared with then copies its input per call too).
2. The GIL: replicas whose step is a numpy 512x512 matmul and an all_reduce
   of its result, on 1 and on 2 replicas (samples/s: replicas x steps / s).
3. numpy in replica functions: the forward and backward pass of a
   784-256-128-10 MLP (global batch 256) in plain numpy (one process, numpy's
   own BLAS threads), on 1 replica, and on 2 replicas with the module's BLAS
   rule (docs/python.md) and without it (DISTRIBUTE_LIMIT_BLAS_THREADS=0).
   Nothing is set in the environment: the defaults are what is measured.

Rounds alternate the variants and each keeps its best round, since these
machines are noisy (docs/benchmarks.md).
"""

import os
import sys
import time

import numpy as np  # noqa: E402

import distribute as ds  # noqa: E402
from distribute import _distribute  # noqa: E402

QUICK = "--quick" in sys.argv
ROUNDS = 3 if QUICK else 7


def python_all_reduce(strategy, value, iterations):
    def loop():
        ctx = ds.get_replica_context()
        ctx.all_reduce(ds.ReduceOp.SUM, value)  # warm
        start = time.perf_counter()
        for _ in range(iterations):
            ctx.all_reduce(ds.ReduceOp.SUM, value)
        return (time.perf_counter() - start) / iterations

    out = strategy.run(loop)
    return out.values[0] if isinstance(out, ds.PerReplica) else out


def all_reduce_table():
    print("| replicas | bytes | input | C++ us/call | Python us/call | Python - C++ (us) | Python / C++ |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for devices in (["CPU:0"], ["CPU:0", "CPU:1"]):
        strategy = ds.MirroredStrategy(devices)
        for elements, iterations in ((2, 20000), (262144, 400)):
            if QUICK:
                iterations //= 10
            array = np.zeros(elements, dtype=np.float32)
            # A numpy input is copied into a new tensor for each call: the C++
            # loop it is compared with copies its input for each call too.
            inputs = (("Tensor", ds.constant(array), False), ("numpy", array, True))
            cpp = {name: float("inf") for name, _, _ in inputs}
            py = dict(cpp)
            for _ in range(ROUNDS):
                for name, value, fresh in inputs:
                    cpp[name] = min(cpp[name], _distribute._time_cpp_all_reduce(strategy, elements, iterations, fresh))
                    py[name] = min(py[name], python_all_reduce(strategy, value, iterations))
            for name, _, _ in inputs:
                c, p = cpp[name], py[name]
                print(
                    f"| {len(devices)} | {elements * 4} | {name} | {c * 1e6:.2f} | {p * 1e6:.2f} | "
                    f"{(p - c) * 1e6:.2f} | {p / c:.2f} |"
                )


def matmul_samples_per_second(strategy, steps):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512), dtype=np.float32)
    b = rng.standard_normal((512, 512), dtype=np.float32)

    def step():
        ctx = ds.get_replica_context()
        ctx.all_reduce(ds.ReduceOp.SUM, a @ b)

    strategy.run(step)  # warm
    start = time.perf_counter()
    for _ in range(steps):
        strategy.run(step)
    return strategy.num_replicas_in_sync * steps / (time.perf_counter() - start)


def gil_table():
    one = ds.MirroredStrategy(["CPU:0"])
    two = ds.MirroredStrategy(["CPU:0", "CPU:1"])
    steps = 10 if QUICK else 40
    best1 = best2 = 0.0
    for _ in range(ROUNDS):
        best1 = max(best1, matmul_samples_per_second(one, steps))
        best2 = max(best2, matmul_samples_per_second(two, steps))
    print("| replicas | samples/s (512x512 matmul + all_reduce of it, per replica) | vs 1 replica |")
    print("|---:|---:|---:|")
    print(f"| 1 | {best1:.1f} | 1.00 |")
    print(f"| 2 | {best2:.1f} | {best2 / best1:.2f} |")


def mlp_weights(rng):
    sizes = (784, 256, 128, 10)
    return [rng.standard_normal((a, b), dtype=np.float32) * np.float32(0.05) for a, b in zip(sizes, sizes[1:])]


def mlp_gradients(weights, x, y):
    """Forward and backward pass of a ReLU MLP with softmax cross-entropy: the gradients."""
    activations = [x]
    for w in weights[:-1]:
        activations.append(np.maximum(activations[-1] @ w, 0))
    logits = activations[-1] @ weights[-1]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    delta = p / np.float32(len(y))
    grads = []
    for i in range(len(weights) - 1, -1, -1):
        grads.append(activations[i].T @ delta)
        if i:
            delta = (delta @ weights[i].T) * (activations[i] > 0)
    return grads[::-1]


def mlp_samples_per_second(strategy, batches, steps):
    """samples/s of `steps` steps, each taking one global batch; plain numpy when strategy is None."""
    rng = np.random.default_rng(1)
    weights = mlp_weights(rng)
    replicas = 1 if strategy is None else strategy.num_replicas_in_sync
    share = [(x[r::replicas], y[r::replicas]) for x, y in batches for r in range(replicas)]

    def one_step(k):
        if strategy is None:
            mlp_gradients(weights, *batches[k % len(batches)])
            return

        def step():
            r = int(ds.get_replica_context().replica_id_in_sync_group)
            mlp_gradients(weights, *share[(k % len(batches)) * replicas + r])

        strategy.run(step)

    one_step(0)  # warm
    start = time.perf_counter()
    for k in range(steps):
        one_step(k)
    return steps * len(batches[0][0]) / (time.perf_counter() - start)


def numpy_mlp_table():
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((256, 784), dtype=np.float32), rng.integers(0, 10, 256)) for _ in range(4)
    ]
    steps = 20 if QUICK else 80
    one = ds.OneDeviceStrategy("CPU:0")
    two = ds.MirroredStrategy(["CPU:0", "CPU:1"])
    variants = {"plain numpy": None, "1 replica": one, "2 replicas": two, "2 replicas, no BLAS rule": two}
    best = {name: 0.0 for name in variants}
    for _ in range(ROUNDS):
        for name, strategy in variants.items():
            if name.endswith("no BLAS rule"):
                os.environ["DISTRIBUTE_LIMIT_BLAS_THREADS"] = "0"
            try:
                best[name] = max(best[name], mlp_samples_per_second(strategy, batches, steps))
            finally:
                os.environ.pop("DISTRIBUTE_LIMIT_BLAS_THREADS", None)
    print("| numpy MLP step (784-256-128-10, global batch 256) | samples/s | vs 1 replica | vs plain numpy |")
    print("|---|---:|---:|---:|")
    for name, value in best.items():
        print(f"| {name} | {value:,.0f} | {value / best['1 replica']:.2f} | {value / best['plain numpy']:.2f} |")


if __name__ == "__main__":
    from distribute import _blas

    threads = sorted(set(_blas.current_threads().values()))
    print(f"python_bench: {os.cpu_count()} CPUs, numpy's BLAS threads {threads} (nothing set in the environment: "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}), {ROUNDS} rounds, best of each\n")
    all_reduce_table()
    print()
    gil_table()
    print()
    numpy_mlp_table()
