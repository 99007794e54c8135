"""distribute: TensorFlow's tf.distribute replica model, on a C++ engine.

    import distribute as ds

    strategy = ds.MirroredStrategy(["CPU:0", "CPU:1"])

    def step():
        ctx = ds.get_replica_context()
        return ctx.all_reduce(ds.ReduceOp.SUM, ds.constant(1.0))

    print(strategy.experimental_local_results(strategy.run(step)))

Replica functions run on the strategy's replica threads, side by side: every
collective and C++ computation releases the GIL. See docs/python.md.
"""

import atexit as _atexit
import sys as _sys

try:
    from . import _distribute as _distribute_module
except ImportError as _error:  # another interpreter, or numpy missing: say which, and how to build for it
    from . import _build_info

    try:
        import numpy as _numpy

        _numpy_here = f"numpy {_numpy.__version__}"
    except ImportError:
        _numpy_here = "no numpy"
    raise ImportError(
        f"distribute: its extension module does not load into this interpreter, {_sys.executable} "
        f"(Python {_sys.version.split()[0]}, {_numpy_here}). It was built for {_build_info.PYTHON_EXECUTABLE} "
        f"(Python {_build_info.PYTHON_VERSION}, numpy {_build_info.NUMPY_VERSION}). Run that interpreter, or "
        f"build the module for this one (numpy importable there): cmake --preset release "
        f"-DPython3_EXECUTABLE={_sys.executable} && cmake --build --preset release. Cause: {_error}"
    ) from _error
from . import _blas, errors, experimental, train
from ._distribute import (
    SGD,
    Adam,
    CommunicationImplementation,
    CommunicationOptions,
    CosineDecay,
    DType,
    ExponentialDecay,
    IndexedSlices,
    InputContext,
    LearningRateSchedule,
    MirroredStrategy,
    MirroredVariable,
    OneDeviceStrategy,
    Optimizer,
    PiecewiseConstantDecay,
    ReduceOp,
    ReplicaContext,
    Strategy,
    StrategyExtended,
    SyncOnReadVariable,
    Tensor,
    Variable,
    VariableAggregation,
    VariableSynchronization,
    _ValueKind,
    constant,
    from_dlpack,
    get_cross_replica_context,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from ._distribute import (  # the dtypes, named as TF's (distribute.float32, ...)
    bfloat16,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
)
from ._distribute import bool as bool_  # `bool` would hide the builtin here
from ._values import DistributedValues, Mirrored, PerReplica, map_structure, regroup, select_replica

globals()["bool"] = bool_  # distribute.bool, as tf.bool

# Before the interpreter finalises: runs still in flight on daemon threads are
# cancelled and return into Python, rather than into an interpreter that is
# going away (which would abort the process and lose its exit status).
_atexit.register(_distribute_module._end_runs_for_exit)

if hasattr(_distribute_module, "MultiWorkerMirroredStrategy"):
    MultiWorkerMirroredStrategy = _distribute_module.MultiWorkerMirroredStrategy
else:

    class MultiWorkerMirroredStrategy:
        """Stands in where distribute was built without MPI."""

        def __init__(self, *args, **kwargs):
            raise errors.UnimplementedError(
                "MultiWorkerMirroredStrategy: this build of distribute has no MPI backend "
                "(install libopenmpi-dev and build again)"
            )


def convert_to_tensor(value, dtype=None):
    """`value` as a Tensor: a Tensor as it is, anything else as constant(value, dtype)."""
    if isinstance(value, Tensor) and dtype is None:
        return value
    return constant(value, dtype=dtype)


def identity(value):
    """A Tensor with the value of `value` (a Tensor, a number, a list or a numpy array)."""
    return convert_to_tensor(value)


# --- Strategy: the parts written in Python (regrouping results) ------------


def _run(self, fn, args=(), kwargs=None, options=None):
    """Runs fn(*args, **kwargs) on every replica, each on its own thread.

    A PerReplica (or Mirrored) in args or kwargs, at any depth of lists, tuples
    and dicts, gives each replica its own component. The results are regrouped:
    a nest of PerReplica, or the value itself where every replica returned the
    same object. An exception in one replica releases the others (they get
    AbortedError in their collectives) and is raised here as it was raised.
    """
    del options  # (tf.distribute.RunOptions: nothing here depends on them)
    if not isinstance(args, (list, tuple)):
        raise ValueError(f"positional args must be a list or tuple, got {type(args)}")
    kwargs = {} if kwargs is None else kwargs
    _check_components(self, (args, kwargs), "run")

    def replica_fn(local_id):
        return fn(*select_replica(local_id, tuple(args)), **select_replica(local_id, kwargs))

    with _blas.limited(self._num_local_replicas):
        return regroup(self._run_replicas(replica_fn))


def _check_components(strategy, value, api):
    """Every distributed value in `value` has one component per local replica (as C++ checks)."""
    n = strategy._num_local_replicas

    def check(v):
        if isinstance(v, DistributedValues) and len(v.values) != n:
            raise errors.InvalidArgumentError(
                f"{api}: a distributed value has {len(v.values)} components but {strategy!r} has {n} local replicas"
            )

    map_structure(check, value)


def _local_results(self, value):
    """The components on this worker's replicas, as a tuple (TF's rules)."""
    if isinstance(value, DistributedValues):
        return value.values
    if self._is_default or isinstance(self, OneDeviceStrategy) or not _is_nested(value):
        return (value,)
    return tuple(select_replica(i, value) for i in range(self._num_local_replicas))


def _is_nested(value):
    return isinstance(value, (list, tuple, dict))


def _components(value):
    return [convert_to_tensor(v) for v in value.values]


def _reduce(self, reduce_op, value, axis):
    """Reduces `value` across replicas (and along `axis` within each, unless None) to one tensor."""
    if isinstance(value, DistributedValues):
        if value.values and all(isinstance(v, IndexedSlices) for v in value.values):
            if axis is not None:
                raise ValueError("reduce: IndexedSlices are reduced across replicas only (axis=None)")
            return self._reduce_slices(reduce_op, list(value.values))
        return self._reduce_components(reduce_op, _components(value), axis, isinstance(value, Mirrored))
    if _is_nested(value):
        return map_structure(lambda v: _reduce(self, reduce_op, v, axis), value)
    return self._reduce_tensor(reduce_op, value, axis)


def _gather(self, value, axis):
    """Concatenates the replicas' components of `value` along `axis`, on the host."""
    if isinstance(value, DistributedValues):
        return self._gather_per_replica(_components(value), axis)
    if _is_nested(value):
        return map_structure(lambda v: _gather(self, v, axis), value)
    return self._gather_tensor(value, axis)


def _values_from_function(self, value_fn):
    """A PerReplica of value_fn(ValueContext) for each local replica, under its device."""
    import types

    def call(replica_id, num_replicas):
        return value_fn(types.SimpleNamespace(replica_id_in_sync_group=replica_id, num_replicas_in_sync=num_replicas))

    return regroup(self._values_from_function(call))


class DistributedDataset:
    """Batches split across the replicas: each item is the batch as a nest of
    PerReplica (TF's rebatching: a global batch of B gives each of N replicas
    B/N rows; an uneven last batch is split as evenly as it can be).

    As a tf.distribute dataset, each `for` (each iter()) is a new pass over
    the source, so `for epoch ...: for batch in dataset:` sees every batch in
    every epoch. A source that cannot start again (a generator, an iterator)
    gives one pass; a second pass after it was exhausted raises ValueError
    rather than an empty epoch. The passes are taken one after another: an
    iterator of an earlier pass raises RuntimeError once a later one began.

    A distribute.train.Checkpoint keeps its position (the pass, the steps
    into it), given the dataset or an iterator of it: restored into a dataset
    made alike and not read yet, it draws the batches before again, and the
    next iterator continues the restored pass (docs/checkpoints.md)."""

    def __init__(self, impl):
        # One engine dataset for every pass; its first pass is made now, as
        # TF makes the dataset (under several workers, dataset_fn's failure
        # on one is raised here by all).
        self._impl = impl
        self._generation = 0  # of the pass the newest iterator began

    def __iter__(self):
        return DistributedIterator(self)


class DistributedIterator:
    """One pass over a DistributedDataset (what iter(dataset) gives, as TF's
    DistributedIterator): next() gives the next batch; get_next() raises
    OutOfRangeError at the end, as TF's does."""

    def __init__(self, dataset):
        self._dataset = dataset
        self._generation = None  # set when its pass begins, at the first next()

    @property
    def _impl(self):
        return self._dataset._impl

    def __iter__(self):
        return self

    def __next__(self):
        dataset = self._dataset
        if self._generation is None:
            batch = dataset._impl._begin()  # (a pass refused begins nothing)
            dataset._generation += 1
            self._generation = dataset._generation
        elif self._generation != dataset._generation:
            raise RuntimeError(
                "DistributedIterator: a later pass over its dataset began (another iter() was read from); "
                "the passes of a distributed dataset are taken one after another"
            )
        else:
            batch = dataset._impl._next()
        if batch is None:
            raise StopIteration
        return regroup(batch)

    def get_next(self):
        try:
            return next(self)
        except StopIteration:
            raise errors.OutOfRangeError("End of sequence") from None


_END = object()


def _first_leaf(value):
    while isinstance(value, (list, tuple, dict)):
        if not value:
            return None
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    return value


class _Passes:
    """The passes over a Python iterable: iter(source) for each, where that
    starts again; a one-shot iterator (iter() gives the same one each time)
    gives one pass, then it is refused. `peeked` is a first item already
    taken from the first pass."""

    def __init__(self, source, api, first_iterator=None, peeked=_END):
        self._source = source
        self._api = api
        self._first = iter(source) if first_iterator is None else first_iterator
        self._one_shot = self._first is source
        self._peeked = peeked
        self._passes = 0
        self._exhausted = False

    def next_pass(self):
        """A function giving the next item of a new pass, or None at its end."""
        self._passes += 1
        pending = []
        if self._passes == 1:
            items = self._first
            if self._peeked is not _END:
                pending.append(self._peeked)
        else:
            items = self._first if self._one_shot else iter(self._source)
            if items is self._first:  # (also an __iter__ that gives the same iterator each time)
                self._one_shot = True
                if self._exhausted:
                    raise ValueError(
                        f"{self._api}: the source {self._source!r} is a one-shot iterator (a generator or an "
                        "iterator) that an earlier pass exhausted, so it cannot be iterated again; pass an "
                        "iterable that can start again (a list, or an object whose __iter__ returns a new "
                        "iterator) to iterate once per epoch"
                    )

        def next_item():
            if pending:
                return pending.pop()
            item = next(items, _END)
            if item is _END:
                self._exhausted = self._exhausted or items is self._first
                return None
            return item

        return next_item


def _distribute_dataset(self, dataset, options=None, global_batch_size=None):
    """Splits each global batch of `dataset` (any iterable of numpy arrays,
    tensors, or lists, tuples and dicts of them) across the replicas.
    global_batch_size defaults to the length of the first batch. Each `for`
    over the result is a new pass over `dataset`."""
    del options
    api = "experimental_distribute_dataset"
    try:
        first_iterator = iter(dataset)
    except TypeError:
        raise TypeError(
            f"{api}: dataset must be an iterable of batches (a list, a generator, ...), got {type(dataset).__name__}"
        ) from None
    peeked = _END
    if global_batch_size is None:
        peeked = next(first_iterator, _END)
        leaf = None if peeked is _END else _first_leaf(peeked)
        global_batch_size = self.num_replicas_in_sync if leaf is None else len(leaf)
    passes = _Passes(dataset, api, first_iterator, peeked)
    return DistributedDataset(self._distribute_dataset(passes.next_pass, int(global_batch_size)))


def _datasets_from_function(self, dataset_fn, options=None):
    """dataset_fn(input_context) gives each input pipeline's iterable of
    per-replica batches (TF's distribute_datasets_from_function). It is
    called once; each `for` over the result is a new pass over what it gave."""
    del options
    api = "distribute_datasets_from_function"
    made = []

    def pipeline(input_context):
        if not made:
            source = dataset_fn(input_context)
            try:
                iter(source)
            except TypeError:
                raise TypeError(
                    f"{api}: dataset_fn must return an iterable of per-replica batches, "
                    f"got {type(source).__name__}"
                ) from None
            made.append(_Passes(source, api))
        return made[0].next_pass()

    return DistributedDataset(self._datasets_from_function(pipeline))


def _method(cls, name, fn):
    """Makes fn the method cls.name, named so (a TypeError for a missing
    argument says "Strategy.reduce()", not the private function's name)."""
    fn.__name__ = name
    fn.__qualname__ = f"{cls.__name__}.{name}"
    setattr(cls, name, fn)


_method(Strategy, "run", _run)
_method(Strategy, "experimental_distribute_dataset", _distribute_dataset)
_method(Strategy, "distribute_datasets_from_function", _datasets_from_function)
_method(Strategy, "experimental_local_results", _local_results)
_method(Strategy, "reduce", _reduce)
_method(Strategy, "gather", _gather)
_method(Strategy, "experimental_distribute_values_from_function", _values_from_function)


def _merge_call(self, merge_fn, args=(), kwargs=None):
    """Runs merge_fn(strategy, *args, **kwargs) once, in the cross-replica
    context, with every replica's arguments regrouped (PerReplica where they
    differ); each replica gets its own component of the result."""
    if not isinstance(args, (list, tuple)):
        raise ValueError(f"merge_call: args must be a list or tuple, got {type(args)}")
    kwargs = {} if kwargs is None else kwargs
    local_id = self._local_replica_id

    def merge_body(strategy, payloads):
        merged_args = regroup([p[0] for p in payloads])
        merged_kwargs = regroup([p[1] for p in payloads])
        return merge_fn(strategy, *merged_args, **merged_kwargs)

    return select_replica(local_id, self._merge_call(merge_body, (tuple(args), kwargs)))


_method(ReplicaContext, "merge_call", _merge_call)


# --- StrategyExtended --------------------------------------------------------


def _destination_devices(destinations):
    if isinstance(destinations, str):
        return [destinations]
    if isinstance(destinations, DistributedValues):
        return [convert_to_tensor(v).device for v in destinations.values]
    if isinstance(destinations, Variable):
        return [t.device for t in destinations.values]
    if isinstance(destinations, Tensor):
        return [destinations.device]
    raise ValueError(
        "destinations must be one of a `DistributedValues` object, a tf.Variable object, or a device string."
    )


def _kind_and_components(value):
    if isinstance(value, PerReplica):
        return _ValueKind.PER_REPLICA, _components(value)
    if isinstance(value, Mirrored):
        return _ValueKind.MIRRORED, _components(value)
    return _ValueKind.TENSOR, [convert_to_tensor(value)]


def _placed(values):
    # As TF: one destination device gives the tensor, several a Mirrored.
    return values[0] if len(values) == 1 else Mirrored(values)


def _reduce_to(self, reduce_op, value, destinations, options=None):
    """Reduces `value` (PerReplica, Mirrored or a tensor; or a nest of them) to `destinations`."""
    if _is_nested(value):
        return map_structure(lambda v: _reduce_to(self, reduce_op, v, destinations, options), value)
    kind, components = _kind_and_components(value)
    return _placed(self._reduce_to(reduce_op, components, kind, _destination_devices(destinations), options))


def _batch_reduce_to(self, reduce_op, value_destination_pairs, options=None):
    """reduce_to of every (value, destinations) pair; PerReplica values are reduced together, in packs."""
    pairs = list(value_destination_pairs)
    for pair in pairs:
        if not isinstance(pair, tuple):
            raise ValueError("Each element of `value_destination_pairs` should be a tuple.")
        if len(pair) != 2:
            raise ValueError("Each element of `value_destination_pairs` should be a tuple of size 2.")
    if pairs and all(isinstance(v, PerReplica) for v, _ in pairs):
        results = self._batch_reduce_to(
            reduce_op, [_components(v) for v, _ in pairs], [_destination_devices(d) for _, d in pairs], options
        )
        return [_placed(r) for r in results]
    return [_reduce_to(self, reduce_op, v, d, options) for v, d in pairs]


def _broadcast_to(self, tensor, destinations=None):
    """Copies of `tensor` on `destinations` (every replica's device when None)."""
    devices = None if destinations is None else _destination_devices(destinations)
    return _placed(self._broadcast_to(tensor, devices))


def _call_for_each_replica(self, fn, args=(), kwargs=None):
    """Strategy.run without its scope handling, as TF's (its errors name call_for_each_replica)."""
    kwargs = {} if kwargs is None else kwargs
    _check_components(self._strategy, (args, kwargs), "call_for_each_replica")

    def replica_fn(local_id):
        return fn(*select_replica(local_id, tuple(args)), **select_replica(local_id, kwargs))

    with _blas.limited(self._strategy._num_local_replicas):
        return regroup(self._strategy._run_replicas(replica_fn, True))


def _has_distributed(value):
    found = []
    map_structure(lambda v: found.append(isinstance(v, DistributedValues)), value)
    return any(found)


def _update(self, var, fn, args=(), kwargs=None, group=True):
    """fn(component, *args, **kwargs) on every component of `var`, as TF's:
    the component has read_value(), numpy(), assign(), assign_add() and
    assign_sub(). In a replica context, one merge_call and every component
    updated once with its replica's arguments. A Mirrored of fn's results
    (each replica's own in a replica context; group=False: a tuple)."""
    kwargs = {} if kwargs is None else kwargs
    if _has_distributed((args, kwargs)):
        n = len(var.values)
        payloads = [(select_replica(i, tuple(args)), select_replica(i, kwargs)) for i in range(n)]
        results = self._update(var, lambda c, p: fn(c, *p[0], **p[1]), payloads, True)
    else:
        results = self._update(var, lambda c, p: fn(c, *p[0], **p[1]), (tuple(args), kwargs), False)
    if _in_a_strategys_replica():
        local = get_replica_context()._local_replica_id
        return results[local]
    if not group:
        return tuple(results)
    return regroup(results) if len(results) > 1 else results[0]


def _in_a_strategys_replica():
    ctx = get_replica_context()
    return ctx is not None and not ctx.strategy._is_default


_method(StrategyExtended, "update", _update)
_method(StrategyExtended, "reduce_to", _reduce_to)
_method(StrategyExtended, "batch_reduce_to", _batch_reduce_to)
_method(StrategyExtended, "broadcast_to", _broadcast_to)
_method(StrategyExtended, "call_for_each_replica", _call_for_each_replica)
ReplicaContext.__repr__ = lambda self: (
    f"<ReplicaContext: replica {int(self.replica_id_in_sync_group)} of {self.num_replicas_in_sync}>"
)

__all__ = [
    "errors",
    "experimental",
    "train",
    "Adam",
    "CosineDecay",
    "ExponentialDecay",
    "LearningRateSchedule",
    "PiecewiseConstantDecay",
    "DistributedDataset",
    "DistributedIterator",
    "IndexedSlices",
    "InputContext",
    "MirroredVariable",
    "MultiWorkerMirroredStrategy",
    "Optimizer",
    "SGD",
    "StrategyExtended",
    "SyncOnReadVariable",
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "CommunicationImplementation",
    "CommunicationOptions",
    "DType",
    "DistributedValues",
    "Mirrored",
    "MirroredStrategy",
    "OneDeviceStrategy",
    "PerReplica",
    "ReduceOp",
    "ReplicaContext",
    "Strategy",
    "Tensor",
    "constant",
    "convert_to_tensor",
    "from_dlpack",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "identity",
    "in_cross_replica_context",
    "map_structure",
    "regroup",
    "select_replica",
]
