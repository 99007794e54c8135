import pytest

import distribute as ds
from distribute import _distribute


def test_every_cpp_error_code_has_its_class():
    for name in _distribute._error_code_names():
        cls = getattr(ds.errors, name)
        assert issubclass(cls, ds.errors.OpError)


def test_cpp_errors_arrive_with_their_class_and_message():
    with pytest.raises(ds.errors.InvalidArgumentError, match="not a valid ReduceOp"):
        ds.ReduceOp.from_string("median")
    with pytest.raises(ds.errors.InvalidArgumentError) as info:
        ds.MirroredStrategy(["GPU:7"])
    assert "GPU" in info.value.message and info.value.error_code == 3


def test_gpu_names_run_on_cpus_only_when_asked(monkeypatch):
    if _distribute._gpus_visible():
        pytest.skip("GPUs are visible: GPU names are not mapped")
    with pytest.raises(ds.errors.InvalidArgumentError):
        ds.MirroredStrategy(["GPU:0", "GPU:1"])
    monkeypatch.setenv("DISTRIBUTE_GPUS_AS_CPUS", "1")
    s = ds.MirroredStrategy(["GPU:0", "/device:gpu:1"])
    assert s.num_replicas_in_sync == 2
    assert "CPU:1" in repr(s)
