import numpy as np
import pytest

import distribute as ds


def replica_id():
    return int(ds.get_replica_context().replica_id_in_sync_group)


def test_variables_under_scope_are_mirrored(strategy):
    with strategy.scope():
        v = ds.Variable(1.0, name="v", aggregation=ds.VariableAggregation.SUM)
    assert isinstance(v, ds.Variable) and v.synchronization == ds.VariableSynchronization.ON_WRITE
    assert len(v.values) == 2 and v.name == "v" and v.dtype == ds.float32

    def step():
        v.assign_add(float(replica_id() + 1))  # SUM: 1 + 2 added to every component

    strategy.run(step)
    assert [float(c) for c in v.values] == [4.0, 4.0]
    assert float(v.read_value()) == 4.0 and v.numpy() == 4.0


def test_assign_without_aggregation_from_replicas_is_refused(strategy):
    with strategy.scope():
        v = ds.Variable(0.0)
    with pytest.raises(ds.errors.OpError, match="aggregation"):
        strategy.run(lambda: v.assign(float(replica_id())))


def test_sync_on_read_variable_sums_on_read(strategy):
    with strategy.scope():
        metric = ds.SyncOnReadVariable(0.0, name="correct", aggregation=ds.VariableAggregation.SUM)
    strategy.run(lambda: metric.assign_add(float(replica_id() + 1)))
    assert float(metric.read_value()) == 3.0  # read in the cross-replica context: summed


def test_sgd_fits_a_line_on_two_replicas(strategy):
    with strategy.scope():
        w = ds.Variable(0.0, name="w")
        b = ds.Variable(0.0, name="b")
    sgd = ds.SGD(learning_rate=0.1, momentum=0.5)
    x_all = np.linspace(-1, 1, 32, endpoint=False, dtype=np.float32)
    y_all = 3 * x_all - 1
    for _ in range(40):
        for batch in strategy.experimental_distribute_dataset(
            [(x_all[i : i + 8], y_all[i : i + 8]) for i in range(0, 32, 8)]
        ):

            def step(batch):
                x, y = batch[0].numpy(), batch[1].numpy()
                err = float(w.read_value()) * x + float(b.read_value()) - y
                # This replica's share of the gradient of the global mean squared error.
                dw = 2 * float(np.sum(err * x)) / 8
                db = 2 * float(np.sum(err)) / 8
                sgd.apply_gradients([(dw, w), (db, b)])

            strategy.run(step, args=(batch,))
    assert abs(float(w.read_value()) - 3) < 1e-3 and abs(float(b.read_value()) + 1) < 1e-3
    assert sgd.iterations == 160


def test_dataset_splits_global_batches(strategy):
    data = [np.arange(4, dtype=np.float32), np.arange(4, 7, dtype=np.float32)]  # the last is uneven
    seen = [tuple(t.numpy().tolist() for t in batch.values) for batch in strategy.experimental_distribute_dataset(data)]
    assert seen == [([0.0, 1.0], [2.0, 3.0]), ([4.0, 5.0], [6.0])]


def test_datasets_from_function(strategy):
    def dataset_fn(ctx):
        assert ctx.num_replicas_in_sync == 2 and ctx.get_per_replica_batch_size(4) == 2
        return [{"x": np.full((2,), ctx.input_pipeline_id, dtype=np.int32)}, {"x": np.zeros(2, dtype=np.int32)}]

    batches = list(strategy.distribute_datasets_from_function(dataset_fn))
    assert len(batches) >= 1 and isinstance(batches[0]["x"], ds.PerReplica)


def test_extended_reduce_to_batch_and_broadcast(strategy):
    values = strategy.run(lambda: ds.constant([float(replica_id() + 1)]))
    assert strategy.extended.reduce_to("sum", values, "CPU:0").numpy().tolist() == [3.0]
    mirrored = strategy.extended.reduce_to(ds.ReduceOp.MEAN, values, values)
    assert isinstance(mirrored, ds.Mirrored) and [m.numpy().tolist() for m in mirrored.values] == [[1.5], [1.5]]
    both = strategy.extended.batch_reduce_to("sum", [(values, values), (values, "CPU:0")])
    assert isinstance(both[0], ds.Mirrored) and both[1].numpy().tolist() == [3.0]
    with pytest.raises(ValueError, match="tuple"):
        strategy.extended.batch_reduce_to("sum", [[values, values]])
    copies = strategy.extended.broadcast_to(ds.constant(5))
    assert [int(c) for c in copies.values] == [5, 5]
    assert strategy.extended.worker_devices == strategy._devices
    with pytest.raises(ValueError, match="destinations"):
        strategy.extended.reduce_to("sum", values, 3)


def test_call_for_each_replica(strategy):
    out = strategy.extended.call_for_each_replica(lambda x: x + replica_id(), args=(10,))
    assert out.values == (10, 11)


def test_extended_update_in_both_contexts(strategy):
    with strategy.scope():
        v = ds.Variable([1.0, 2.0], name="v")
    out = strategy.extended.update(v, lambda c, x: c.assign_add(x), args=(1.0,))
    assert out is None  # fn returned nothing on every component
    assert [c.numpy().tolist() for c in v.values] == [[2.0, 3.0], [2.0, 3.0]]
    # A PerReplica argument: each component its own replica's value.
    per_replica = strategy.run(lambda: ds.constant([float(replica_id()), 0.0]))
    strategy.extended.update(v, lambda c, x: c.assign(x), args=(per_replica,))
    assert [c.numpy().tolist() for c in v.values] == [[0.0, 0.0], [1.0, 0.0]]

    # In a replica context: one merge_call; every component updated once, with
    # its replica's argument, and each replica gets its own component's result.
    def step():
        return strategy.extended.update(v, lambda c, x: (c.assign_sub(x), float(c.read_value()[0]))[1], args=(1.0,))

    assert strategy.run(step).values == (-1.0, 0.0)

    kept = []
    strategy.extended.update(v, lambda c: kept.append(c))
    with pytest.raises(ds.errors.FailedPreconditionError, match="while fn runs"):
        kept[0].read_value()
    with pytest.raises(ds.errors.OpError):
        strategy.extended.update(v, lambda c: c.assign([1.0, 2.0, 3.0]))  # another shape
