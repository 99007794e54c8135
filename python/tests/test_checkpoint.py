"""distribute.train: checkpoints from Python, with TensorFlow's API."""

import json
import os
import struct

import numpy as np
import pytest

import distribute as ds


def make_model(strategy):
    with strategy.scope():
        w = ds.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
        b = ds.Variable(np.zeros(3, dtype=np.float32), name="b")
        seen = ds.SyncOnReadVariable(0.0, name="seen", aggregation=ds.VariableAggregation.SUM)
    return w, b, seen


def train(strategy, w, b, seen, opt, steps):
    for step in range(steps):

        def fn():
            rid = int(ds.get_replica_context().replica_id_in_sync_group)
            g = np.full((2, 3), 0.1 * (step + 1) + rid, dtype=np.float32)
            opt.apply_gradients([(g, w), (np.ones(3, dtype=np.float32) * rid, b)])
            seen.assign_add(1.0)

        strategy.run(fn)


def test_save_restore_under_another_strategy_bit_for_bit(tmp_path, strategy):
    w, b, seen = make_model(strategy)
    adam = ds.Adam(learning_rate=0.01)
    train(strategy, w, b, seen, adam, 3)
    ckpt = ds.train.Checkpoint(model={"w": w, "b": b}, optimizer=adam, seen=seen)
    path = ckpt.save(str(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt-1") and ckpt.save_counter == 1
    assert ds.train.latest_checkpoint(str(tmp_path)) == path

    # Under the default strategy: plain variables, a fresh optimizer.
    w2 = ds.Variable(np.zeros((2, 3), dtype=np.float32))
    b2 = ds.Variable(np.ones(3, dtype=np.float32))
    seen2 = ds.Variable(0.0)
    adam2 = ds.Adam(learning_rate=0.01)
    restored = ds.train.Checkpoint(model={"w": w2, "b": b2}, optimizer=adam2, seen=seen2)
    restored.restore(path).assert_consumed()
    assert np.array_equal(w2.numpy(), w.numpy()) and np.array_equal(b2.numpy(), b.numpy())
    assert float(seen2.numpy()) == 6.0  # the SUM over 3 steps of 2 replicas
    assert adam2.iterations == 3
    assert np.array_equal(adam2.get_slot(w2, "m").numpy(), adam.get_slot(w, "m").numpy())
    assert restored.save_counter == 1


def test_keys_and_the_format_read_without_the_library(tmp_path, strategy):
    w, b, seen = make_model(strategy)
    sgd = ds.SGD(learning_rate=0.1, momentum=0.9)
    train(strategy, w, b, seen, sgd, 1)
    ckpt = ds.train.Checkpoint(model=[w, b], opt=sgd)
    prefix = ckpt.write(str(tmp_path / "single"))
    names = dict(ds.train.list_variables(prefix))
    assert names["model/0/.ATTRIBUTES/VARIABLE_VALUE"] == [2, 3]
    assert names["model/1/.OPTIMIZER_SLOT/opt/momentum/.ATTRIBUTES/VARIABLE_VALUE"] == [3]
    assert names["opt/iter/.ATTRIBUTES/VARIABLE_VALUE"] == []
    reader = ds.train.load_checkpoint(prefix)
    assert reader.verify() == []
    assert np.array_equal(reader.get_tensor("model/0/.ATTRIBUTES/VARIABLE_VALUE"), w.numpy())
    # The shard is plain safetensors: an 8-byte length, a JSON header, the bytes.
    manifest = json.loads((tmp_path / "single.index.json").read_text())
    entry = manifest["tensors"]["model/0/.ATTRIBUTES/VARIABLE_VALUE"]
    with open(tmp_path / manifest["shards"][entry["shard"]]["file"], "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        begin, end = header["model/0/.ATTRIBUTES/VARIABLE_VALUE"]["data_offsets"]
        f.seek(8 + length + begin)
        raw = f.read(end - begin)
    assert header["model/0/.ATTRIBUTES/VARIABLE_VALUE"]["dtype"] == "F32"
    assert np.array_equal(np.frombuffer(raw, dtype="<f4").reshape(2, 3), w.numpy())


def test_manager_keeps_the_newest_and_resumes(tmp_path):
    step = ds.Variable(np.int64(0))
    w = ds.Variable(np.zeros(4, dtype=np.float32))
    ckpt = ds.train.Checkpoint(w=w, step=step)
    manager = ds.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    assert manager.latest_checkpoint is None
    assert isinstance(ckpt.restore(manager.latest_checkpoint), object)  # None: nothing to restore, as in TF
    with pytest.raises(AssertionError, match="nothing is being restored"):
        ckpt.restore(None).assert_consumed()
    for i in range(4):
        w.assign(np.full(4, float(i), dtype=np.float32))
        step.assign(np.int64(i))
        manager.save()
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-3", "ckpt-4"]
    assert not (tmp_path / "ckpt-1.index.json").exists()
    del manager  # releases the directory's lock

    w_again = ds.Variable(np.zeros(4, dtype=np.float32))
    step_again = ds.Variable(np.int64(0))
    again = ds.train.Checkpoint(w=w_again, step=step_again)
    calls = []
    manager = ds.train.CheckpointManager(again, tmp_path, max_to_keep=2, init_fn=lambda: calls.append(1))
    assert manager.restore_or_initialize() == str(tmp_path / "ckpt-4")
    assert calls == [] and w_again.numpy().tolist() == [3.0] * 4 and int(step_again.numpy()) == 3
    # The next save numbers on from the restored counter.
    assert manager.save() == str(tmp_path / "ckpt-5")


def test_init_fn_runs_when_there_is_nothing(tmp_path):
    ckpt = ds.train.Checkpoint(w=ds.Variable(1.0))
    calls = []
    manager = ds.train.CheckpointManager(ckpt, str(tmp_path / "new"), max_to_keep=1, init_fn=lambda: calls.append(1))
    assert manager.restore_or_initialize() is None and calls == [1]


def test_restore_on_create_and_attribute_assignment(tmp_path, strategy):
    w, b, seen = make_model(strategy)
    adam = ds.Adam()
    train(strategy, w, b, seen, adam, 2)
    prefix = ds.train.Checkpoint(w=w, b=b, optimizer=adam).save(str(tmp_path / "c"))

    ckpt = ds.train.Checkpoint()
    status = ckpt.restore(prefix)
    late_adam = ds.Adam()
    ckpt.optimizer = late_adam
    with strategy.scope():
        late_w = ds.Variable(np.zeros((2, 3), dtype=np.float32))
    ckpt.w = late_w  # takes its saved value now, and the optimizer's slots for it
    assert np.array_equal(late_w.numpy(), w.numpy())
    assert late_adam.iterations == 2
    assert np.array_equal(late_adam.get_slot(late_w, "v").numpy(), adam.get_slot(w, "v").numpy())
    assert ckpt.w is late_w
    with pytest.raises(AssertionError, match=r"\(root\)\.b"):
        status.assert_consumed()  # 'b' was saved and nobody took it yet
    # TF's _preload_simple_restoration: a variable made with its saved value.
    with strategy.scope():
        late_b = ds.Variable(ckpt.initial_value("b"))
    ckpt.b = late_b
    assert np.array_equal(late_b.numpy(), b.numpy())
    assert np.array_equal(late_adam.get_slot(late_b, "m").numpy(), adam.get_slot(b, "m").numpy())
    status.assert_consumed()


def test_bad_input_is_a_clear_error(tmp_path):
    w = ds.Variable(np.zeros(3, dtype=np.float32))
    with pytest.raises(TypeError, match="'model/x' must be a Variable, an Optimizer"):
        ds.train.Checkpoint(model={"x": 3})
    with pytest.raises(TypeError, match="keys of 'model'"):
        ds.train.Checkpoint(model={1: w})
    with pytest.raises(ValueError, match="holds no Variable"):
        ds.train.Checkpoint(model={})
    ckpt = ds.train.Checkpoint(w=w)
    with pytest.raises(ds.errors.NotFoundError, match=str(tmp_path / "nothing")):
        ckpt.restore(str(tmp_path / "nothing"))
    with pytest.raises(TypeError, match="checkpoint path"):
        ckpt.save(3)
    prefix = ckpt.save(str(tmp_path / "c"))
    other = ds.train.Checkpoint(w=ds.Variable(np.zeros(4, dtype=np.float32)))
    with pytest.raises(ds.errors.InvalidArgumentError, match=r"float32\(3,\).*float32\(4,\)"):
        other.restore(prefix)
    # A flipped byte in the shard is DataLossError, and the variable keeps its value.
    manifest = json.loads((tmp_path / "c-1.index.json").read_text())
    shard = tmp_path / manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x40
    shard.write_bytes(bytes(data))
    w.assign(np.full(3, 7.0, dtype=np.float32))
    with pytest.raises(ds.errors.DataLossError, match="corrupted"):
        ckpt.restore(prefix)
    assert w.numpy().tolist() == [7.0, 7.0, 7.0]
    first = ds.train.CheckpointManager(ckpt, str(tmp_path / "locked"), max_to_keep=1)
    with pytest.raises(ds.errors.FailedPreconditionError, match="lock|another"):
        ds.train.CheckpointManager(ckpt, str(tmp_path / "locked"), max_to_keep=1)
    del first
    with pytest.raises(TypeError, match="max_to_keep"):
        ds.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep="3")


def test_save_inside_run_is_refused(tmp_path, strategy):
    with strategy.scope():
        w = ds.Variable(1.0)
    ckpt = ds.train.Checkpoint(w=w)
    with pytest.raises(ds.errors.FailedPreconditionError, match="save"):
        strategy.run(lambda: ckpt.save(str(tmp_path / "c")))


def test_asynchronous_saves_hold_the_values_of_their_call(tmp_path, strategy):
    w, b, seen = make_model(strategy)
    adam = ds.Adam()
    train(strategy, w, b, seen, adam, 1)
    at_save = w.numpy().copy()
    ckpt = ds.train.Checkpoint(w=w, b=b, optimizer=adam)
    manager = ds.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)
    options = ds.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    assert manager.save(options=options) == str(tmp_path / "ckpt-1")
    train(strategy, w, b, seen, adam, 2)  # while the thread writes
    manager.sync()
    assert manager.latest_checkpoint == str(tmp_path / "ckpt-1")
    reader = ds.train.load_checkpoint(manager.latest_checkpoint)
    assert np.array_equal(reader.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE"), at_save)
    assert not np.array_equal(w.numpy(), at_save)
    later = w.numpy().copy()
    path = ckpt.save(str(tmp_path / "other" / "c"), options=options)
    train(strategy, w, b, seen, adam, 1)
    ckpt.restore(path).assert_consumed()  # waits for the save in flight first
    assert np.array_equal(w.numpy(), later)
    with pytest.raises(TypeError, match="CheckpointOptions"):
        manager.save(options={"experimental_enable_async_checkpoint": True})


class _Shuffled:
    """An iterable whose every pass is shuffled by a seed of its own (the pass
    number), as a per-epoch shuffle is: 5 batches of 4 rows."""

    def __init__(self):
        self.passes = 0

    def __iter__(self):
        order = np.random.default_rng(self.passes).permutation(20).astype(np.float32)
        self.passes += 1
        return iter([order[i : i + 4] for i in range(0, 20, 4)])


def _rows(batch):
    """Every replica's rows, in replica order (one replica's batch is a plain tensor)."""
    parts = batch.values if isinstance(batch, ds.PerReplica) else (batch,)
    return np.concatenate([np.asarray(v) for v in parts]).tolist()


def _epochs(dataset, epoch, epochs, at_step=None):
    """A training loop from the completed epochs `epoch` holds; at_step(steps) after each step and epoch."""
    seen = []
    for e in range(int(epoch.numpy()), epochs):
        for batch in dataset:
            seen.append(_rows(batch))
            if at_step:
                at_step(len(seen))
        epoch.assign(np.int64(e + 1))
        if at_step:
            at_step(len(seen))
    return seen


def test_a_dataset_resumes_with_the_batches_that_follow(tmp_path, strategy):
    data = strategy.experimental_distribute_dataset(_Shuffled())
    epoch = ds.Variable(np.int64(0))
    ckpt = ds.train.Checkpoint(data=data, epoch=epoch)
    saves = []
    everything = _epochs(
        data, epoch, 3, lambda steps: saves.append((ckpt.write(str(tmp_path / f"at{len(saves)}")), steps))
    )
    assert len(everything) == 15 and len(saves) == 18
    for path, steps in saves:
        for replicas in (1, 4):
            other = ds.MirroredStrategy([f"CPU:{i}" for i in range(replicas)])
            again = other.experimental_distribute_dataset(_Shuffled())
            resumed_epoch = ds.Variable(np.int64(0))
            ds.train.Checkpoint(data=again, epoch=resumed_epoch).read(path).assert_consumed()
            assert _epochs(again, resumed_epoch, 3) == everything[steps:], (path, replicas)
    reader = ds.train.load_checkpoint(saves[7][0])  # after 2 steps of pass 1
    assert reader.get_tensor("data/.ATTRIBUTES/ITERATOR_STATE").tolist() == [1, 2, 0]


def test_an_iterator_is_checkpointed_as_tf_does(tmp_path, strategy):
    dataset = strategy.experimental_distribute_dataset([np.full(2, i, dtype=np.float32) for i in range(6)])
    iterator = iter(dataset)
    for _ in range(4):
        iterator.get_next()
    path = ds.train.Checkpoint(iterator=iterator).write(str(tmp_path / "it"))
    fresh = iter(strategy.experimental_distribute_dataset([np.full(2, i, dtype=np.float32) for i in range(6)]))
    ds.train.Checkpoint(iterator=fresh).read(path).assert_consumed()
    assert [_rows(next(fresh)) for _ in range(2)] == [[4.0, 4.0], [5.0, 5.0]]
    with pytest.raises(ds.errors.OutOfRangeError):
        fresh.get_next()


def test_a_dataset_position_that_cannot_be_taken_is_a_clear_error(tmp_path, strategy):
    used = strategy.experimental_distribute_dataset(_Shuffled())
    next(iter(used))
    next(iter(used))  # pass 1
    path = ds.train.Checkpoint(data=used).write(str(tmp_path / "p1"))
    with pytest.raises(ds.errors.FailedPreconditionError, match="dataset 'data' cannot take its saved position: "
                       "the dataset has been read from"):
        ds.train.Checkpoint(data=used).read(path)
    empty = strategy.experimental_distribute_dataset([])
    with pytest.raises(ds.errors.FailedPreconditionError, match="position is step 1 of pass 1, but the source's pass "
                       "ends after 0 batches"):
        ds.train.Checkpoint(data=empty).read(path)


def test_an_iterator_of_an_earlier_pass_is_refused(strategy):
    dataset = strategy.experimental_distribute_dataset([np.zeros(2, dtype=np.float32)] * 3)
    first, second = iter(dataset), iter(dataset)
    next(first)
    next(second)
    with pytest.raises(RuntimeError, match="a later pass over its dataset began"):
        next(first)
    assert len(list(second)) == 2
