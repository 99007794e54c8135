"""distribute.experimental.PreemptionCheckpointHandler: a SIGTERM ends the step, saves, exits with 42."""

import gc
import os
import signal

import numpy as np
import pytest

import distribute as ds

STEPS = 8


def make_model(strategy):
    with strategy.scope():
        w = ds.Variable(np.arange(6, dtype=np.float32), name="w")
    return w, ds.Adam(learning_rate=0.01)


def train_step(strategy, w, adam, step):
    def fn():
        rid = int(ds.get_replica_context().replica_id_in_sync_group)
        adam.apply_gradients([(np.full(6, 0.1 * (step + 1) + rid, dtype=np.float32), w)])

    strategy.run(fn)


def handler_for(strategy, directory, w, adam, **kwargs):
    ckpt = ds.train.Checkpoint(w=w, optimizer=adam)
    return ds.experimental.PreemptionCheckpointHandler(None, ckpt, str(directory), strategy=strategy, **kwargs)


def test_a_sigterm_ends_the_step_saves_exits_42_and_the_run_resumes_bit_for_bit(tmp_path, strategy):
    plain_w, plain_adam = make_model(strategy)
    for step in range(STEPS):
        train_step(strategy, plain_w, plain_adam, step)

    w, adam = make_model(strategy)
    handler = handler_for(strategy, tmp_path, w, adam)
    assert handler.total_run_calls == 0

    def step_signalled_at_3(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # before the step's collectives
        train_step(strategy, w, adam, step)

    with pytest.raises(SystemExit) as exited:
        for step in range(handler.total_run_calls, STEPS):
            handler.run(step_signalled_at_3, step)
    assert exited.value.code == 42
    assert adam.iterations == 4  # steps 0 to 3: the signalled step ended
    assert handler.total_run_calls == 4
    latest = ds.train.latest_checkpoint(str(tmp_path))
    assert latest is not None
    reader = ds.train.load_checkpoint(latest)
    assert int(reader.get_tensor("checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE")) == 4
    assert int(reader.get_tensor("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE")) == 4
    del handler, exited  # (the traceback holds the handler and its manager's lock on the directory)
    gc.collect()

    # Run again with new objects: the handler restores, the count goes on.
    w2, adam2 = make_model(strategy)
    resumed = handler_for(strategy, tmp_path, w2, adam2)
    assert resumed.total_run_calls == 4
    for step in range(resumed.total_run_calls, STEPS):
        assert resumed.run(train_step, strategy, w2, adam2, step) is None
    assert resumed.total_run_calls == STEPS
    assert np.array_equal(w2.numpy(), plain_w.numpy())
    assert np.array_equal(adam2.get_slot(w2, "v").numpy(), plain_adam.get_slot(plain_w, "v").numpy())


def test_exit_fn_ctrl_c_and_the_signal_handlers_given_back(tmp_path, strategy):
    w, adam = make_model(strategy)
    ckpt = ds.train.Checkpoint(w=w, optimizer=adam)
    manager = ds.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=2)

    class Stopped(Exception):
        pass

    seen = []

    def exit_fn():
        seen.append(manager.latest_checkpoint)
        raise Stopped()

    config = ds.experimental.TerminationConfig(exit_fn=exit_fn)
    handler = ds.experimental.PreemptionCheckpointHandler(None, manager, termination_config=config, strategy=strategy)
    handler.run(train_step, strategy, w, adam, 0)
    assert seen == []
    # Ctrl-C is a preemption too while the handler lives: no KeyboardInterrupt.
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(Stopped):
        handler.run(train_step, strategy, w, adam, 1)
    assert seen == [str(tmp_path / "ckpt-1")]
    del handler
    gc.collect()
    # Python's own handlers are back.
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)

    # An exit_fn that returns: the run cannot go on as if nothing happened.
    handler = ds.experimental.PreemptionCheckpointHandler(
        None, manager, termination_config=ds.experimental.TerminationConfig(exit_fn=lambda: None), strategy=strategy
    )
    assert handler.total_run_calls == 2
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(ds.errors.CancelledError, match="exit_fn returned"):
        handler.save_checkpoint_if_preempted()


def test_bad_arguments_are_clear_errors(tmp_path, strategy):
    w, adam = make_model(strategy)
    ckpt = ds.train.Checkpoint(w=w, optimizer=adam)
    with pytest.raises(ds.errors.InvalidArgumentError, match="a checkpoint_dir must be passed as well"):
        ds.experimental.PreemptionCheckpointHandler(None, ckpt, strategy=strategy)
    with pytest.raises(TypeError, match="cluster_resolver must be None"):
        ds.experimental.PreemptionCheckpointHandler(object(), ckpt, str(tmp_path), strategy=strategy)
    with pytest.raises(TypeError, match="a Checkpoint or a CheckpointManager, got dict"):
        ds.experimental.PreemptionCheckpointHandler(None, {"w": w}, str(tmp_path), strategy=strategy)
    with pytest.raises(NotImplementedError, match="grace_period, save_fn|save_fn, grace_period"):
        ds.experimental.TerminationConfig(grace_period=5, save_fn=lambda: None)
    with pytest.raises(TypeError, match="exit_fn must be callable"):
        ds.experimental.TerminationConfig(exit_fn=42)
    spaced_never = ds.experimental.TerminationConfig(max_steps_between_exchanges=0)
    with pytest.raises(ds.errors.InvalidArgumentError, match="max_steps_between_exchanges >= 1"):
        handler_for(strategy, tmp_path, w, adam, termination_config=spaced_never)
    handler = handler_for(strategy, tmp_path, w, adam)
    with pytest.raises(TypeError, match="takes no arguments"):
        handler.save_checkpoint_if_preempted("ckpt-7")
