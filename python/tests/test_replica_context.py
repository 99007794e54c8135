import numpy as np
import pytest

import distribute as ds


def replica_id():
    return int(ds.get_replica_context().replica_id_in_sync_group)


def local(strategy, fn):
    return strategy.experimental_local_results(strategy.run(fn))


def test_context_properties(strategy):
    def fn():
        ctx = ds.get_replica_context()
        return (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, ctx.strategy)

    out = local(strategy, fn)
    assert [int(o[0]) for o in out] == [0, 1]
    assert out[0][0].dtype == ds.int32  # a tensor, as TF's
    assert all(o[1] == 2 and o[2] is strategy for o in out)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16", "bfloat16"])
def test_all_reduce_every_op(strategy, dtype):
    def fn():
        v = ds.constant([1, 2, 3], dtype=dtype) if replica_id() == 0 else ds.constant([4, 0, 5], dtype=dtype)
        ctx = ds.get_replica_context()
        return {op: ctx.all_reduce(op, v) for op in ("sum", "min", "max", "product")}

    for out in local(strategy, fn):
        assert np.asarray(out["sum"], dtype=np.float64).tolist() == [5, 2, 8]
        assert np.asarray(out["min"], dtype=np.float64).tolist() == [1, 0, 3]
        assert np.asarray(out["max"], dtype=np.float64).tolist() == [4, 2, 5]
        assert np.asarray(out["product"], dtype=np.float64).tolist() == [4, 0, 15]


def test_all_reduce_mean_and_nests(strategy):
    def fn():
        ctx = ds.get_replica_context()
        x = float(replica_id())
        return ctx.all_reduce(ds.ReduceOp.MEAN, {"a": [x, np.full((2,), x)], "b": (ds.constant(x),)})

    for out in local(strategy, fn):
        assert float(out["a"][0]) == 0.5
        assert out["a"][1].numpy().tolist() == [0.5, 0.5]
        assert isinstance(out["b"], tuple) and float(out["b"][0]) == 0.5


def test_all_gather_ragged_nest(strategy):
    # The seed's example: {'a': [0], 'b': [[0, 1]]} and {'a': [1], 'b': [[2, 3], [4, 5]]}.
    def fn():
        if replica_id() == 0:
            value = {"a": ds.constant([0]), "b": ds.constant([[0, 1]])}
        else:
            value = {"a": ds.constant([1]), "b": ds.constant([[2, 3], [4, 5]])}
        return ds.get_replica_context().all_gather(value, axis=0)

    for out in local(strategy, fn):
        assert out["a"].numpy().tolist() == [0, 1]
        assert out["b"].numpy().tolist() == [[0, 1], [2, 3], [4, 5]]


def test_broadcast(strategy):
    def fn():
        return ds.get_replica_context().broadcast(ds.constant([replica_id() + 1.0]), root_replica=1)

    assert [o.numpy().tolist() for o in local(strategy, fn)] == [[2.0], [2.0]]


def test_merge_call_regroups_and_selects(strategy):
    calls = []

    def merge_fn(s, value, shared, scale=1):
        calls.append(ds.in_cross_replica_context())
        assert isinstance(value, ds.PerReplica) and shared == "same"
        total = s.reduce("sum", value, axis=None)
        return ds.PerReplica([int(total) * scale + i for i in range(2)])

    shared = "same"

    def fn():
        ctx = ds.get_replica_context()
        return ctx.merge_call(merge_fn, args=(ds.constant(replica_id() + 1), shared), kwargs={"scale": 10})

    out = local(strategy, fn)
    assert calls == [True]  # once, in the cross-replica context
    assert [int(o) for o in out] == [30, 31]


def test_merge_call_result_shared_when_not_per_replica(strategy):
    def fn():
        return ds.get_replica_context().merge_call(lambda s: {"n": s.num_replicas_in_sync})

    out = strategy.run(fn)
    assert out == {"n": 2}


def test_mismatched_collectives_raise_on_every_replica(strategy):
    def fn():
        ctx = ds.get_replica_context()
        if replica_id() == 0:
            return ctx.all_reduce("sum", 1.0)
        return ctx.all_gather(ds.constant([1.0]), axis=0)

    with pytest.raises(ds.errors.FailedPreconditionError, match="all_reduce #1; replica 1: all_gather #1"):
        strategy.run(fn)


def test_collective_timeout_names_the_missing_replica():
    s = ds.MirroredStrategy(["CPU:0", "CPU:1"], communication_options=ds.CommunicationOptions(timeout_seconds=0.5))

    def fn():
        if replica_id() == 0:
            return ds.get_replica_context().all_reduce("sum", 1.0)
        return None  # replica 1 never joins

    with pytest.raises(ds.errors.OpError, match="replica"):
        s.run(fn)


def test_default_context_collectives_are_identities():
    ctx = ds.get_replica_context()
    assert ctx.replica_id_in_sync_group == 0 and ctx.num_replicas_in_sync == 1
    assert float(ctx.all_reduce("sum", 3.0)) == 3.0
    assert ctx.merge_call(lambda s, x: x + 1, args=(1,)) == 2


def test_indexed_slices_all_reduce_gather_and_reduce(strategy):
    def fn():
        rid = replica_id()
        rows = ds.IndexedSlices(np.full((1, 2), rid + 1.0, dtype=np.float32), np.array([rid], dtype=np.int32), [3, 2])
        ctx = ds.get_replica_context()
        return rows, ctx.all_reduce("sum", rows), ctx.all_reduce("sum", {"s": rows, "d": 1.0})

    out = local(strategy, fn)
    for _, summed, mixed in out:
        assert isinstance(summed, ds.IndexedSlices) and summed.dense_shape == (3, 2)
        assert summed.to_dense().numpy().tolist() == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]
        assert isinstance(mixed["s"], ds.IndexedSlices) and float(mixed["d"]) == 2.0
    per_replica = ds.PerReplica([o[0] for o in out])
    reduced = strategy.reduce("sum", per_replica, axis=None)
    assert reduced.to_dense().numpy().tolist() == [[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]
    with pytest.raises(TypeError, match="to_dense"):
        ds.constant(out[0][0])
