"""MultiWorkerMirroredStrategy from Python: run by ctest as
mpirun -np 2 python3 -m pytest python/tests/test_multi_worker.py
(each worker runs every test, in the same order)."""

import numpy as np
import pytest

import distribute as ds
from distribute import _distribute

launched = hasattr(_distribute, "_started_by_launcher") and _distribute._started_by_launcher()
pytestmark = pytest.mark.skipif(not launched, reason="needs an MPI launcher: mpirun -np 2 python3 -m pytest ...")


@pytest.fixture(scope="module")
def strategy():
    return ds.MultiWorkerMirroredStrategy(
        ["CPU:0", "CPU:1"], communication_options=ds.CommunicationOptions(timeout_seconds=30)
    )


def test_shape_of_the_cluster(strategy):
    assert strategy.num_workers == 2
    assert strategy.num_replicas_in_sync == 4 and strategy._num_local_replicas == 2


def test_all_reduce_and_all_gather_span_the_workers(strategy):
    def fn():
        ctx = ds.get_replica_context()
        rid = int(ctx.replica_id_in_sync_group)
        return ctx.all_reduce("sum", float(rid)), ctx.all_gather(np.array([rid], dtype=np.int32), axis=0)

    for total, gathered in strategy.experimental_local_results(strategy.run(fn)):
        assert float(total) == 6.0
        assert gathered.numpy().tolist() == [0, 1, 2, 3]
    ids = strategy.run(lambda: ds.get_replica_context().replica_id_in_sync_group)
    first = 2 * strategy.worker_rank
    assert [int(v) for v in ids.values] == [first, first + 1]


def test_reduce_across_workers(strategy):
    values = strategy.run(lambda: ds.constant([1.0, 2.0]))
    assert strategy.reduce("sum", values, axis=None).numpy().tolist() == [4.0, 8.0]


def test_a_mismatch_on_one_worker_raises_on_every_worker(strategy):
    def fn():
        ctx = ds.get_replica_context()
        size = 3 if int(ctx.replica_id_in_sync_group) == 3 else 2
        return ctx.all_reduce("sum", np.ones(size, dtype=np.float32))

    with pytest.raises(ds.errors.InvalidArgumentError, match="shape"):
        strategy.run(fn)
    # The strategy works again afterwards.
    out = strategy.run(lambda: ds.get_replica_context().all_reduce("sum", 1.0))
    assert [float(v) for v in out.values] == [4.0, 4.0]


def _shared_directory(strategy):
    """A directory worker 0 makes, its path sent to every worker (one all-reduce of its bytes)."""
    import tempfile

    path = tempfile.mkdtemp(prefix="distribute-mw-ckpt-") if strategy.worker_rank == 0 else ""
    encoded = np.zeros(256, dtype=np.float32)
    encoded[: len(path)] = np.frombuffer(path.encode(), dtype=np.uint8)

    def fn():
        first = int(ds.get_replica_context().replica_id_in_sync_group) == 0
        return ds.get_replica_context().all_reduce("sum", encoded if first else np.zeros(256, dtype=np.float32))

    total = strategy.experimental_local_results(strategy.run(fn))[0].numpy()
    return bytes(int(c) for c in total if c).decode()


def test_checkpoint_saved_by_every_worker_restores_in_one_process(strategy):
    import shutil

    directory = _shared_directory(strategy)
    try:
        with strategy.scope():
            w = ds.Variable(np.arange(8, dtype=np.float32), name="w")
            seen = ds.SyncOnReadVariable(0.0, name="seen", aggregation=ds.VariableAggregation.SUM)
        adam = ds.Adam()

        def step():
            rid = int(ds.get_replica_context().replica_id_in_sync_group)
            adam.apply_gradients([(np.full(8, rid + 1.0, dtype=np.float32), w)])
            seen.assign_add(1.0)

        strategy.run(step)
        ckpt = ds.train.Checkpoint(w=w, optimizer=adam, seen=seen)
        manager = ds.train.CheckpointManager(ckpt, directory, max_to_keep=2)
        assert manager.save() == directory + "/ckpt-1"
        reader = ds.train.load_checkpoint(directory)
        assert reader.verify() == [] and "2 workers" in reader.layout
        assert float(reader.get_tensor("seen/.ATTRIBUTES/VARIABLE_VALUE")) == 4.0  # 4 replicas, one step
        # Restored in this process alone, under the default strategy.
        w1, seen1, adam1 = ds.Variable(np.zeros(8, dtype=np.float32)), ds.Variable(0.0), ds.Adam()
        ds.train.Checkpoint(w=w1, optimizer=adam1, seen=seen1).restore(directory).assert_consumed()
        assert np.array_equal(w1.numpy(), w.numpy()) and float(seen1.numpy()) == 4.0 and adam1.iterations == 1
        del manager
        # Both workers are done reading before worker 0 removes the directory.
        strategy.run(lambda: ds.get_replica_context().all_reduce("sum", 1.0))
    finally:
        if strategy.worker_rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


def test_a_sigterm_to_one_worker_stops_both_after_the_same_step(strategy):
    import os
    import shutil
    import signal

    directory = _shared_directory(strategy)
    try:
        with strategy.scope():
            w = ds.Variable(np.arange(4, dtype=np.float32), name="w")
        adam = ds.Adam()

        def step():
            rid = int(ds.get_replica_context().replica_id_in_sync_group)
            adam.apply_gradients([(np.full(4, rid + 1.0, dtype=np.float32), w)])

        ckpt = ds.train.Checkpoint(w=w, optimizer=adam)
        # Outside the scope and without strategy=, the default strategy: it
        # would stop this worker alone, so it is refused.
        with pytest.raises(ds.errors.InvalidArgumentError, match="whose workers save together"):
            ds.experimental.PreemptionCheckpointHandler(None, ckpt, directory)
        # (An exchange after every step: the request is seen after the step it came in.)
        config = ds.experimental.TerminationConfig(max_steps_between_exchanges=1)
        handler = ds.experimental.PreemptionCheckpointHandler(
            None, ckpt, directory, termination_config=config, strategy=strategy
        )
        assert handler.total_run_calls == 0
        with pytest.raises(SystemExit) as exited:
            for n in range(10):
                if n == 3 and strategy.worker_rank == 1:
                    os.kill(os.getpid(), signal.SIGTERM)  # worker 1 only
                handler.run(strategy.run, step)
        assert exited.value.code == 42
        assert handler.total_run_calls == 4 and adam.iterations == 4  # the same step on both workers
        reader = ds.train.load_checkpoint(directory)
        assert int(reader.get_tensor("checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE")) == 4
        del handler, exited
        strategy.run(lambda: ds.get_replica_context().all_reduce("sum", 1.0))  # both done reading
    finally:
        if strategy.worker_rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
