"""Ctrl-C ends MultiWorkerMirroredStrategy()'s wait for a worker that has not
come (issue #46): run by ctest as mpirun -np 2 python3 mpi_ctrl_c.py.

Worker 1 comes 6 s late. Worker 0 gets SIGINT 1 s into its wait and must
raise KeyboardInterrupt within a second of it, not when worker 1 arrives;
worker 1 still gets its strategy (worker 0's abandoned meeting completes),
and both exit cleanly."""

import os
import signal
import sys
import threading
import time

import distribute as ds

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")))
if rank == 1:
    time.sleep(6)
    s = ds.MultiWorkerMirroredStrategy(communication_options=ds.CommunicationOptions(timeout_seconds=30))
    print(f"worker 1: made, {s.num_workers} workers", flush=True)
    sys.exit(0)

threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    ds.MultiWorkerMirroredStrategy(communication_options=ds.CommunicationOptions(timeout_seconds=30))
    print(f"FAIL: worker 0 made its strategy after {time.monotonic() - start:.2f} s, not interrupted", flush=True)
    sys.exit(1)
except KeyboardInterrupt:
    waited = time.monotonic() - start
print(f"worker 0: KeyboardInterrupt after {waited:.2f} s", flush=True)
if waited >= 2.0:
    print("FAIL: the interrupt took more than a second", flush=True)
    sys.exit(1)
time.sleep(7)  # worker 1 meets the abandoned meeting meanwhile
print("worker 0: interrupted within a second", flush=True)
