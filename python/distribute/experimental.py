"""Preemption, as tf.distribute.experimental: PreemptionCheckpointHandler, TerminationConfig.

    strategy = distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    with strategy.scope():
        ...variables, optimizer...
    ckpt = distribute.train.Checkpoint(model=..., optimizer=...)
    handler = distribute.experimental.PreemptionCheckpointHandler(None, ckpt, "/tmp/run", strategy=strategy)
    for step in range(handler.total_run_calls, steps):
        handler.run(strategy.run, train_step, args=(...,))

A SIGTERM (or Ctrl-C) to any worker makes every worker finish the same
step, save a checkpoint and leave by `exit_fn`: `sys.exit(42)` unless
TerminationConfig says otherwise. Run again, the handler restores that
checkpoint and `total_run_calls` says where to go on. The request travels
in the agreements the workers make anyway (docs/checkpoints.md,
"Preemption").
"""

import sys as _sys

from . import errors as _errors
from ._distribute import _PreemptionCheckpointHandler, get_strategy
from .train import Checkpoint, CheckpointManager

__all__ = ["PreemptionCheckpointHandler", "TerminationConfig"]


class TerminationConfig:
    """tf.distribute.experimental.TerminationConfig for a plain Linux host.

    exit_fn is called on every worker once the checkpoint is saved (by
    default sys.exit(42)). TF's termination_watcher_fn, grace_period and
    save_fn are for platforms with maintenance notices; here a SIGTERM is
    the notice, so they are refused rather than ignored.

    Steps that make no agreement among the workers (only collectives inside
    the step) carry no request; the handler exchanges the requests after
    some of them, at the same steps on every worker, spaced to cost at most
    `exchange_budget` of the steps' time, so that a request waits at most
    `max_stop_delay_seconds` and `max_steps_between_exchanges` steps (these
    three are distribute's own; 1 step exchanges after every such step).
    """

    def __init__(
        self,
        termination_watcher_fn=None,
        exit_fn=None,
        grace_period=None,
        save_fn=None,
        *,
        exchange_budget=0.001,
        max_stop_delay_seconds=1.0,
        max_steps_between_exchanges=10000,
    ):
        unsupported = [
            name
            for name, value in (("termination_watcher_fn", termination_watcher_fn), ("save_fn", save_fn))
            if value is not None
        ]
        if grace_period:
            unsupported.append("grace_period")
        if unsupported:
            raise NotImplementedError(
                "TerminationConfig: " + ", ".join(unsupported) + " is not supported: on a plain Linux host "
                "the handler stops at the first SIGTERM and saves with its CheckpointManager"
            )
        if exit_fn is not None and not callable(exit_fn):
            raise TypeError(f"TerminationConfig: exit_fn must be callable, got {type(exit_fn).__name__}")
        self.termination_watcher_fn = None
        self.exit_fn = exit_fn if exit_fn is not None else (lambda: _sys.exit(42))
        self.grace_period = 0
        self.save_fn = None
        self.exchange_budget = float(exchange_budget)
        self.max_stop_delay_seconds = float(max_stop_delay_seconds)
        self.max_steps_between_exchanges = int(max_steps_between_exchanges)


class PreemptionCheckpointHandler:
    """tf.distribute.experimental.PreemptionCheckpointHandler.

    Made in the cross-replica context by every worker alike. It tracks
    "checkpointed_runs" in the checkpoint, restores the latest checkpoint
    (restore_or_initialize), and handles SIGTERM and SIGINT while it lives;
    a second signal ends the process at once. The strategy is `strategy`,
    else the one of the current scope. `cluster_resolver` is TF's first
    argument: distribute has no resolvers (the strategy knows its workers),
    so it must be None.
    """

    def __init__(
        self,
        cluster_resolver,
        checkpoint_or_checkpoint_manager,
        checkpoint_dir=None,
        termination_config=None,
        *,
        strategy=None,
    ):
        if cluster_resolver is not None:
            raise TypeError(
                "PreemptionCheckpointHandler: cluster_resolver must be None: the strategy knows its workers "
                f"(got {type(cluster_resolver).__name__}; pass strategy=... or make the handler in its scope)"
            )
        target = checkpoint_or_checkpoint_manager
        if isinstance(target, Checkpoint):
            if checkpoint_dir is None:
                raise _errors.InvalidArgumentError(
                    "When a checkpoint is passed, a checkpoint_dir must be passed as well."
                )
            manager = CheckpointManager(target, checkpoint_dir, max_to_keep=1)
        elif isinstance(target, CheckpointManager):
            manager = target
        else:
            raise TypeError(
                "PreemptionCheckpointHandler: checkpoint_or_checkpoint_manager must be a Checkpoint or a "
                f"CheckpointManager, got {type(target).__name__}"
            )
        config = termination_config if termination_config is not None else TerminationConfig()
        if not isinstance(config, TerminationConfig):
            raise TypeError(
                f"PreemptionCheckpointHandler: termination_config must be a TerminationConfig, got "
                f"{type(config).__name__}"
            )
        self._manager = manager
        self._strategy = strategy if strategy is not None else get_strategy()
        self._engine = _PreemptionCheckpointHandler(
            self._strategy,
            manager._engine,
            config.exit_fn,
            config.exchange_budget,
            config.max_stop_delay_seconds,
            config.max_steps_between_exchanges,
        )

    @property
    def total_run_calls(self):
        """Steps run through the handler, those before a restart included."""
        return self._engine.total_run_calls

    def run(self, distributed_train_function, *args, **kwargs):
        """Runs one step and returns its result; then, if any worker was asked to stop, saves and exits."""
        result = distributed_train_function(*args, **kwargs)
        self._engine._save_checkpoint_if_preempted()
        return result

    def save_checkpoint_if_preempted(self, *args, **kwargs):
        """What run() does after its step, for loops that do not wrap their step: once per step, after it."""
        if args or kwargs:
            raise TypeError(
                "save_checkpoint_if_preempted: the handler saves with its CheckpointManager and takes no "
                "arguments"
            )
        self._engine._save_checkpoint_if_preempted()

    def watch_preemption_scope(self):
        """TF's scope for TPU preemptions; here errors already reach every worker, so it only wraps."""
        return _NoScope()


class _NoScope:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
