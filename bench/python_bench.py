"""The Python front end's costs, measured side by side in one process.

    PYTHONPATH=build/release/python python3 bench/python_bench.py [--quick]

1. ctx.all_reduce from Python against the same loop in C++ (a binding that
   runs it without Python), 8 B and 1 MiB of float32 on 1 and 2 replicas,
   from a Tensor and from a numpy array (a copy into a new tensor per call:
   the C++ loop it is compared with then copies its input per call too).
2. The GIL: replicas whose step is a numpy 512x512 matmul and an all_reduce
   of its result, on 1 and on 2 replicas (samples/s: replicas x steps / s).
   OpenBLAS runs one thread per replica here (OPENBLAS_NUM_THREADS=1), so that
   two replicas can only gain from running side by side.

Rounds alternate the variants and each keeps its best round, since these
machines are noisy (docs/benchmarks.md).
"""

import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

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


if __name__ == "__main__":
    print(f"python_bench: {os.cpu_count()} CPUs, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}, "
          f"{ROUNDS} rounds, best of each\n")
    all_reduce_table()
    print()
    gil_table()
