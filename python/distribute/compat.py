"""TensorFlow's names over distribute, so that code written for tf.distribute
runs with one changed line:

    import distribute.compat as tf

    strategy = tf.distribute.MirroredStrategy(["GPU:0", "GPU:1"])

tf.function is a decorator that changes nothing (there is no graph here).
Without GPUs, set DISTRIBUTE_GPUS_AS_CPUS=1 to run "GPU:k" on CPU k.
"""

import types

import distribute as _ds

from distribute import (  # noqa: F401  (re-exported as tf.*)
    bfloat16,
    constant,
    convert_to_tensor,
    errors,
    float16,
    float32,
    float64,
    identity,
    int8,
    int16,
    int32,
    int64,
    uint8,
)

globals()["bool"] = _ds.bool_


def function(fn=None, **unused_options):
    """@tf.function and @tf.function(...): the function itself (eager, as written)."""
    if fn is None:
        return lambda f: f
    return fn


distribute = types.SimpleNamespace(
    MirroredStrategy=_ds.MirroredStrategy,
    OneDeviceStrategy=_ds.OneDeviceStrategy,
    MultiWorkerMirroredStrategy=_ds.MultiWorkerMirroredStrategy,
    Strategy=_ds.Strategy,
    ReplicaContext=_ds.ReplicaContext,
    ReduceOp=_ds.ReduceOp,
    get_replica_context=_ds.get_replica_context,
    get_cross_replica_context=_ds.get_cross_replica_context,
    get_strategy=_ds.get_strategy,
    has_strategy=_ds.has_strategy,
    in_cross_replica_context=_ds.in_cross_replica_context,
    DistributedValues=_ds.DistributedValues,
    experimental=types.SimpleNamespace(
        CommunicationOptions=_ds.CommunicationOptions,
        CommunicationImplementation=_ds.CommunicationImplementation,
    ),
)
