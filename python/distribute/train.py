"""Checkpoints, as tf.train: Checkpoint, CheckpointManager, latest_checkpoint.

    ckpt = distribute.train.Checkpoint(model={"w": w, "b": b}, optimizer=adam, epoch=epoch)
    manager = distribute.train.CheckpointManager(ckpt, "/tmp/run", max_to_keep=3)
    ckpt.restore(manager.latest_checkpoint)   # nothing to restore on the first run
    for ...:
        ...train...
        manager.save()

The engine writes and reads the checkpoints (docs/checkpoints.md): safetensors
shards and a JSON manifest, crash-safe, restorable under any strategy and
replica count. This module gives them TensorFlow's Python shape: objects by
keyword, dicts, lists and tuples of variables and optimizers (a dict's keys
and a sequence's indices become the names' parts, as TF's object graph
names them), `ckpt.name = object`, and the load status' assertions raising
AssertionError.
"""

import os as _os

from . import errors as _errors
from ._distribute import CheckpointEntry, CheckpointOptions, CheckpointReader, Optimizer, Variable
from ._distribute import _Checkpoint, _CheckpointManager, _DistributedDataset
from ._distribute import latest_checkpoint as _latest_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointEntry",
    "CheckpointLoadStatus",
    "CheckpointManager",
    "CheckpointOptions",
    "CheckpointReader",
    "latest_checkpoint",
    "list_variables",
    "load_checkpoint",
]


def _leaves(name, value, out):
    """(path, object) for every Variable, Optimizer and dataset in `value`, a nest
    (a DistributedDataset or DistributedIterator is tracked as its engine dataset)."""
    if isinstance(value, (Variable, Optimizer)):
        out.append((name, value))
    elif isinstance(value, _DistributedDataset):
        out.append((name, value))
    elif isinstance(getattr(value, "_impl", None), _DistributedDataset):
        out.append((name, value._impl))
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"Checkpoint: the keys of '{name}' must be non-empty strings, got {key!r}")
            _leaves(f"{name}/{key}", item, out)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _leaves(f"{name}/{index}", item, out)
    else:
        raise TypeError(
            f"Checkpoint: '{name}' must be a Variable, an Optimizer, a distributed dataset or iterator, or a dict, "
            "list or tuple of them; "
            f"got {type(value).__name__}"
        )
    return out


def _options_of(options):
    if options is None:
        return CheckpointOptions()
    if not isinstance(options, CheckpointOptions):
        raise TypeError(f"options must be a distribute.train.CheckpointOptions or None, got {type(options).__name__}")
    return options


def _path_of(value):
    if isinstance(value, _os.PathLike):
        value = _os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"a checkpoint path must be a str or an os.PathLike, got {type(value).__name__}")
    return value


class CheckpointLoadStatus:
    """What Checkpoint.restore returns; its assertions raise AssertionError, as TF's."""

    def __init__(self, status):
        self._status = status

    def _check(self, name):
        try:
            getattr(self._status, name)()
        except _errors.FailedPreconditionError as error:
            raise AssertionError(error.message) from error
        return self

    def assert_consumed(self):
        """Every tracked object got its values, and every saved value went to an object."""
        return self._check("assert_consumed")

    def assert_existing_objects_matched(self):
        """Every tracked object that holds values got them from the checkpoint."""
        return self._check("assert_existing_objects_matched")

    def assert_nontrivial_match(self):
        """Something besides the root matched."""
        return self._check("assert_nontrivial_match")

    def expect_partial(self):
        """Silences the warning about saved values no object took."""
        self._status.expect_partial()
        return self


class _NothingRestored:
    """restore(None), as TF's InitializationOnlyStatus: the objects keep their values."""

    def _nothing(self):
        raise AssertionError("No checkpoint specified (save_path=None); nothing is being restored.")

    assert_consumed = assert_existing_objects_matched = assert_nontrivial_match = _nothing

    def expect_partial(self):
        return self


class Checkpoint:
    """tf.train.Checkpoint: variables and optimizers by name, saved and restored together.

    Checkpoint(model={"w": w}, optimizer=adam) saves w under
    "model/w/.ATTRIBUTES/VARIABLE_VALUE" and Adam's slots for it under
    "model/w/.OPTIMIZER_SLOT/optimizer/m/...". `ckpt.name = object` tracks
    more; after a restore, an object tracked later takes its saved value then
    (restore-on-create), and an optimizer's slots are made by the restore.
    """

    def __init__(self, root=None, **kwargs):
        object.__setattr__(self, "_engine", _Checkpoint())
        object.__setattr__(self, "_objects", {})
        if root is not None:
            kwargs = {"root": root, **kwargs}
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        leaves = _leaves(name, value, [])
        if not leaves:
            raise ValueError(f"Checkpoint: '{name}' holds no Variable, Optimizer or dataset")
        for path, leaf in leaves:
            self._engine._track(path, leaf)
        # The engine holds optimizers by reference: they live as long as this.
        self._objects[name] = value

    def __getattr__(self, name):
        objects = object.__getattribute__(self, "_objects")
        if name in objects:
            return objects[name]
        raise AttributeError(f"'Checkpoint' object has no attribute '{name}'")

    @property
    def save_counter(self):
        """How many times save() has written (restored by restore())."""
        return self._engine.save_counter

    def save(self, file_prefix, options=None):
        """Writes "<file_prefix>-<save_counter+1>" and records it in the directory's index.

        With options=CheckpointOptions(experimental_enable_async_checkpoint=True)
        it returns once the values are copied, and a thread writes them; the
        next save, restore or sync() waits for it and raises its error.
        """
        return self._engine.save(_path_of(file_prefix), _options_of(options))

    def write(self, file_prefix, options=None):
        """Writes exactly `file_prefix` (no counter, no index)."""
        return self._engine.write(_path_of(file_prefix), _options_of(options))

    def sync(self):
        """Waits for an asynchronous save in flight and raises its error (every worker calls it)."""
        self._engine.sync()

    def restore(self, save_path, options=None):
        """Restores a checkpoint (a directory: its latest). None restores nothing, as in TF."""
        _options_of(options)  # (nothing of a restore depends on them)
        if save_path is None:
            return _NothingRestored()
        return CheckpointLoadStatus(self._engine.restore(_path_of(save_path)))

    def read(self, save_path, options=None):
        """Restores a checkpoint written by write() (no save counter expected)."""
        _options_of(options)
        return CheckpointLoadStatus(self._engine.read(_path_of(save_path)))

    def initial_value(self, name):
        """The value a pending restore holds for the variable `name` (as a Tensor), or None."""
        return self._engine._initial_value(name)


class CheckpointManager:
    """tf.train.CheckpointManager: numbered checkpoints in one directory, the newest kept.

    The directory is made and checked writable here (an unusable one is
    refused before training starts); while the manager lives it holds a lock
    on it, so a second job saving there is refused rather than mixed in.
    """

    def __init__(
        self,
        checkpoint,
        directory,
        max_to_keep,
        keep_checkpoint_every_n_hours=None,
        checkpoint_name="ckpt",
        step_counter=None,
        checkpoint_interval=None,
        init_fn=None,
    ):
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"CheckpointManager: checkpoint must be a Checkpoint, got {type(checkpoint).__name__}")
        if max_to_keep is not None and (isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int)):
            raise TypeError(f"CheckpointManager: max_to_keep must be an int or None, got {max_to_keep!r}")
        if step_counter is not None and not isinstance(step_counter, Variable):
            raise TypeError(f"CheckpointManager: step_counter must be a Variable, got {type(step_counter).__name__}")
        if init_fn is not None and not callable(init_fn):
            raise TypeError("CheckpointManager: init_fn must be callable")
        self._checkpoint = checkpoint
        self._checkpoint_interval = checkpoint_interval
        self._engine = _CheckpointManager(
            checkpoint._engine,
            _path_of(directory),
            max_to_keep,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            checkpoint_name=checkpoint_name,
            step_counter=step_counter,
            checkpoint_interval=checkpoint_interval,
            init_fn=init_fn,
        )

    @property
    def checkpoint(self):
        return self._checkpoint

    @property
    def directory(self):
        return self._engine.directory

    @property
    def checkpoint_interval(self):
        return self._checkpoint_interval

    @property
    def latest_checkpoint(self):
        """The newest checkpoint's prefix, or None."""
        return self._engine.latest_checkpoint

    @property
    def checkpoints(self):
        """The managed checkpoints, oldest first."""
        return list(self._engine.checkpoints)

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        """Saves the next checkpoint (returns its prefix), or None when the interval has not passed.

        Asynchronous with options=CheckpointOptions(experimental_enable_async_checkpoint=True):
        latest_checkpoint and checkpoints name it once the next save or sync() has seen it whole.
        """
        return self._engine.save(checkpoint_number, check_interval, _options_of(options))

    def sync(self):
        """Waits for an asynchronous save, records it, raises its error."""
        self._engine.sync()

    def restore_or_initialize(self):
        """Restores the latest checkpoint and returns its path; else calls init_fn and returns None."""
        return self._engine.restore_or_initialize()


def latest_checkpoint(checkpoint_dir, latest_filename=None):
    """tf.train.latest_checkpoint: the newest whole checkpoint in the directory, or None."""
    if latest_filename is not None:
        raise ValueError("latest_checkpoint: latest_filename is not supported (the index is checkpoint.json)")
    return _latest_checkpoint(_path_of(checkpoint_dir))


def load_checkpoint(ckpt_dir_or_file):
    """tf.train.load_checkpoint: a CheckpointReader (get_tensor, get_variable_to_shape_map, verify)."""
    return CheckpointReader(_path_of(ckpt_dir_or_file))


def list_variables(ckpt_dir_or_file):
    """tf.train.list_variables: (key, shape) of every tensor, sorted by key."""
    return [(e.key, list(e.shape)) for e in load_checkpoint(ckpt_dir_or_file).entries()]
