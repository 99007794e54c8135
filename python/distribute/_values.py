"""Per-replica values and the two walks over nests that Strategy.run and
ReplicaContext.merge_call make in Python: select_replica (a replica's view of
its arguments) and regroup (the replicas' results as one value), with
TensorFlow's rules (docs/python.md)."""

from . import errors


class DistributedValues:
    """One value per local replica; `.values` holds them in local replica order."""

    _kind = "DistributedValues"

    def __init__(self, values):
        self._values = tuple(values)

    @property
    def values(self):
        return self._values

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        lines = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{self._kind}:{{\n{lines}\n}}"


class PerReplica(DistributedValues):
    """Values that may differ between replicas (what strategy.run returns)."""

    _kind = "PerReplica"


class Mirrored(DistributedValues):
    """Values that are the same on every replica."""

    _kind = "Mirrored"


def _is_namedtuple(value):
    return isinstance(value, tuple) and hasattr(value, "_fields")


def is_nested(value):
    return isinstance(value, (list, tuple, dict))


def map_structure(fn, value):
    """fn applied to every leaf of lists, tuples (named ones too) and dicts."""
    if isinstance(value, list):
        return [map_structure(fn, v) for v in value]
    if _is_namedtuple(value):
        return type(value)(*(map_structure(fn, v) for v in value))
    if isinstance(value, tuple):
        return tuple(map_structure(fn, v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, map_structure(fn, v)) for k, v in value.items())
    return fn(value)


def select_replica(local_id, value):
    """Replica `local_id`'s view: each DistributedValues leaf becomes its own component."""
    return map_structure(lambda v: v.values[local_id] if isinstance(v, DistributedValues) else v, value)


def _mismatch(path, what):
    where = path or "the top level"
    return errors.InvalidArgumentError(
        f"The replicas' values do not have the same structure: at {where}, {what}"
    )


def regroup(values, path=""):
    """The replicas' values as one: lists, tuples and dicts are walked in step;
    a leaf that is the same object on every replica is returned as it is, and
    any other becomes a PerReplica."""
    v0 = values[0]
    if isinstance(v0, (list, tuple)):
        for i, v in enumerate(values[1:], start=1):
            if type(v) is not type(v0) or len(v) != len(v0):
                raise _mismatch(path, f"replica 0 has {type(v0).__name__} of {len(v0)} and replica {i} "
                                      f"{type(v).__name__}" + (f" of {len(v)}" if isinstance(v, (list, tuple)) else ""))
        items = [regroup([v[k] for v in values], f"{path}[{k}]") for k in range(len(v0))]
        if isinstance(v0, list):
            return items
        return type(v0)(*items) if _is_namedtuple(v0) else tuple(items)
    if isinstance(v0, dict):
        for i, v in enumerate(values[1:], start=1):
            if not isinstance(v, dict) or set(v.keys()) != set(v0.keys()):
                raise _mismatch(path, f"replica 0 has dict keys {sorted(map(str, v0.keys()))} and replica {i} "
                                      + (f"{sorted(map(str, v.keys()))}" if isinstance(v, dict)
                                         else f"a {type(v).__name__}"))
        return type(v0)((k, regroup([v[k] for v in values], f"{path}[{k!r}]")) for k in v0)
    if all(v is v0 for v in values[1:]):
        return v0
    return PerReplica(values)
