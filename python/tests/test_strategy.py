import threading
import time

import numpy as np
import pytest

import distribute as ds


def test_run_regroups_results_as_tf(strategy):
    result = strategy.run(lambda: ds.constant(1.0))
    assert isinstance(result, ds.PerReplica) and len(result.values) == 2
    same = object()
    assert strategy.run(lambda: same) is same  # one object everywhere: returned as it is
    nested = strategy.run(lambda: {"a": [ds.constant(1), 7], "b": (ds.constant(2),)})
    assert isinstance(nested["a"][0], ds.PerReplica) and nested["a"][1] == 7
    assert isinstance(nested["b"], tuple) and isinstance(nested["b"][0], ds.PerReplica)


def test_run_refuses_results_of_different_structures(strategy):
    def fn():
        rid = int(ds.get_replica_context().replica_id_in_sync_group)
        return [1] * (rid + 1)

    with pytest.raises(ds.errors.InvalidArgumentError, match="same structure"):
        strategy.run(fn)


def test_run_selects_each_replicas_component(strategy):
    per_replica = strategy.run(lambda: ds.get_replica_context().replica_id_in_sync_group)
    out = strategy.run(lambda x, y=None: int(x) * 10 + y, args=(per_replica,), kwargs={"y": 3})
    assert out.values == (3, 13)
    with pytest.raises(ValueError, match="list or tuple"):
        strategy.run(lambda x: x, args=5)


def test_replicas_run_on_their_own_threads(strategy):
    seen = strategy.run(lambda: threading.get_ident())
    assert len(set(seen.values)) == 2


def test_local_results_follow_tf(strategy):
    result = strategy.run(lambda: [ds.constant(1), ds.constant(2)])
    local = strategy.experimental_local_results(result)
    assert len(local) == 2 and all(isinstance(v, list) and len(v) == 2 for v in local)
    assert strategy.experimental_local_results(5) == (5,)
    assert ds.get_strategy().experimental_local_results([1, 2]) == ([1, 2],)


def test_reduce_and_gather(strategy):
    ids = strategy.run(lambda: ds.get_replica_context().replica_id_in_sync_group)
    assert int(strategy.reduce(ds.ReduceOp.SUM, ids, axis=None)) == 1
    assert int(strategy.reduce("max", ids, axis=None)) == 1
    rows = strategy.run(lambda: ds.constant([[1, 2]]))
    assert strategy.gather(rows, axis=0).shape == (2, 2)
    assert int(strategy.reduce(ds.ReduceOp.MEAN, rows, axis=1)) == 1  # integers stay integers
    floats = strategy.run(lambda: ds.constant([[1.0, 2.0]]))
    assert float(strategy.reduce(ds.ReduceOp.MEAN, floats, axis=1)) == 1.5
    with pytest.raises(ds.errors.InvalidArgumentError):
        strategy.gather(rows, axis=3)


def test_scope_and_contexts(strategy):
    assert not ds.has_strategy() and not ds.in_cross_replica_context()
    assert ds.get_replica_context() is not None  # the default replica context
    with strategy.scope() as s:
        assert s is strategy and ds.get_strategy() is strategy
        assert ds.in_cross_replica_context() and ds.get_replica_context() is None
        assert ds.get_cross_replica_context() is strategy
    assert not ds.has_strategy()


def test_values_from_function(strategy):
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: ds.constant(ctx.replica_id_in_sync_group * 2)
    )
    assert [int(v) for v in values.values] == [0, 2]


def test_one_device_and_default_strategies():
    one = ds.OneDeviceStrategy("CPU:0")
    assert one.num_replicas_in_sync == 1
    assert int(one.run(lambda: ds.get_replica_context().all_reduce("sum", 4))) == 4
    default = ds.get_strategy()
    assert default.run(lambda: ds.get_replica_context().replica_id_in_sync_group) == 0


def test_an_exception_in_one_replica_releases_the_others(strategy):
    class Boom(Exception):
        pass

    def fn():
        ctx = ds.get_replica_context()
        if int(ctx.replica_id_in_sync_group) == 1:
            raise Boom("from replica 1")
        return ctx.all_reduce("sum", 1.0)  # replica 0 waits here until released

    with pytest.raises(Boom, match="from replica 1") as info:
        strategy.run(fn)
    assert any("fn" == entry.name for entry in info.traceback)  # the replica's own frame
    # The strategy is usable afterwards.
    assert [float(v) for v in strategy.run(lambda: ds.get_replica_context().all_reduce("sum", 1.0)).values] == [2.0, 2.0]


def test_the_gil_is_released_in_collectives(strategy):
    # Replica 1 sleeps in Python before the all_reduce; replica 0 waits in the
    # collective meanwhile. Were the GIL held there, replica 1 could not run.
    def fn():
        ctx = ds.get_replica_context()
        if int(ctx.replica_id_in_sync_group) == 1:
            time.sleep(0.05)
        return ctx.all_reduce("sum", np.ones(3, dtype=np.float32))

    out = strategy.run(fn)
    assert [v.numpy().tolist() for v in out.values] == [[2.0, 2.0, 2.0]] * 2


def test_ctrl_c_cancels_a_run_waiting_in_a_collective(strategy):
    import _thread

    cancelled = []

    def fn():
        ctx = ds.get_replica_context()
        rid = int(ctx.replica_id_in_sync_group)
        if rid == 1:
            time.sleep(1.0)  # replica 0 waits in its all_reduce meanwhile, and Ctrl-C comes
        try:
            return ctx.all_reduce("sum", 1.0)
        except ds.errors.CancelledError as e:
            cancelled.append((rid, str(e)))
            raise

    timer = threading.Timer(0.2, _thread.interrupt_main)  # as Ctrl-C does
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        strategy.run(fn)
    timer.join()
    assert sorted(r for r, _ in cancelled) == [0, 1]
    assert "KeyboardInterrupt" in cancelled[0][1]
    out = strategy.run(lambda: ds.get_replica_context().all_reduce("sum", 1.0))
    assert [float(v) for v in out.values] == [2.0, 2.0]


def test_runs_inside_a_scope_keep_its_context(strategy):
    with strategy.scope():
        out = strategy.run(lambda: ds.get_strategy() is strategy)
    assert out is True
    other = ds.MirroredStrategy(["CPU:0"])
    with strategy.scope():
        with pytest.raises(ds.errors.OpError, match="[Mm]ix"):
            other.run(lambda: 1)
