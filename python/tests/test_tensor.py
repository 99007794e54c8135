import numpy as np
import pytest

import distribute as ds


def test_constant_dtypes_follow_tf_constant():
    assert ds.constant(1).dtype == ds.int32
    assert ds.constant(2**40).dtype == ds.int64
    assert ds.constant(1.5).dtype == ds.float32
    assert ds.constant(True).dtype == ds.bool
    assert ds.constant([[1, 2], [3, 4]]).shape == (2, 2)
    assert ds.constant(np.arange(3, dtype=np.float64)).dtype == ds.float64
    assert ds.constant(np.int16(7)).dtype == ds.int16
    assert ds.constant(1.5).shape == ()
    assert ds.constant([1, 2], dtype="float16").dtype == ds.float16
    assert ds.constant([1, 2], dtype=np.uint8).dtype == ds.uint8
    assert ds.constant(3, dtype=ds.float64).numpy().item() == 3.0


def test_constant_refuses_values_that_do_not_fit():
    with pytest.raises(TypeError, match="do not fit"):
        ds.constant(1.5, dtype=ds.int32)
    with pytest.raises(TypeError, match="do not fit"):
        ds.constant(300, dtype="int8")
    with pytest.raises(TypeError):
        ds.constant("text")
    with pytest.raises(TypeError):
        ds.constant(None)
    with pytest.raises(TypeError, match="dtype"):
        ds.constant(1, dtype="complex64")


def test_constant_copies_its_input():
    a = np.arange(4, dtype=np.float32)
    t = ds.constant(a)
    a[0] = 100
    assert t.numpy()[0] == 0


def test_constant_shape_fills_or_reshapes():
    assert ds.constant(0.0, shape=(2, 3)).numpy().tolist() == [[0.0] * 3] * 2
    assert ds.constant([1, 2, 3, 4], shape=[2, 2]).shape == (2, 2)
    with pytest.raises(ds.errors.OpError):
        ds.constant([1, 2, 3], shape=[2, 2])


def test_numpy_is_a_read_only_view():
    t = ds.constant([1.0, 2.0])
    view = t.numpy()
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 5
    assert np.shares_memory(view, t.numpy())
    del t  # the view keeps the storage alive
    assert view.tolist() == [1.0, 2.0]


def test_buffer_protocol_is_read_only_and_shares_memory():
    t = ds.constant([[1, 2], [3, 4]], dtype=ds.int64)
    m = memoryview(t)
    assert m.readonly and m.format == "q" and m.shape == (2, 2)
    assert np.asarray(m).tolist() == [[1, 2], [3, 4]]


def test_repr_and_str_as_tf():
    assert repr(ds.constant(2.0)) == "<tf.Tensor: shape=(), dtype=float32, numpy=2.0>"
    assert repr(ds.constant([1, 2, 3])) == (
        "<tf.Tensor: shape=(3,), dtype=int32, numpy=array([1, 2, 3], dtype=int32)>"
    )
    assert str(ds.constant([1, 2, 3])) == "tf.Tensor([1 2 3], shape=(3,), dtype=int32)"
    assert repr(ds.float32) == "tf.float32"


def test_scalar_conversions_and_comparisons():
    t = ds.constant(3)
    assert int(t) == 3 and float(t) == 3.0 and bool(t) and [10, 20, 30, 40][t] == 40
    assert t == 3 and t != 4
    assert (ds.constant([1, 2]) == 1).tolist() == [True, False]
    with pytest.raises(TypeError):
        int(ds.constant([1, 2]))
    with pytest.raises(TypeError):
        hash(t)
    assert len(ds.constant([[1], [2], [3]])) == 3
    assert ds.constant([[1, 2], [3, 4]])[1].numpy().tolist() == [3, 4]


def test_bfloat16_goes_through_float32():
    t = ds.constant([1.0, 2.5], dtype=ds.bfloat16)
    assert t.dtype == ds.bfloat16
    assert t.numpy().dtype == np.float32 and t.numpy().tolist() == [1.0, 2.5]


def test_dlpack_with_numpy_shares_memory_both_ways():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = ds.from_dlpack(a)
    assert t.shape == (2, 3) and t.dtype == ds.float32
    a[0, 0] = 42  # no copy: the tensor sees it
    assert t.numpy()[0, 0] == 42
    assert ds.Tensor.__dlpack_device__(t) == (1, 0)
    back = np.from_dlpack(t)
    assert back.tolist() == a.tolist()


def test_dlpack_capsule_is_consumed_once():
    t = ds.constant([1, 2, 3])
    capsule = t.__dlpack__()
    u = ds.from_dlpack(capsule)
    assert u.numpy().tolist() == [1, 2, 3]
    with pytest.raises(TypeError, match="not yet consumed"):
        ds.from_dlpack(capsule)


def test_dlpack_refuses_what_it_cannot_share():
    with pytest.raises(ds.errors.InvalidArgumentError):
        ds.from_dlpack(np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2])  # strided


def test_torch_dlpack_when_installed():
    torch = pytest.importorskip("torch")
    x = torch.arange(4, dtype=torch.float32)
    t = ds.from_dlpack(x)
    x[1] = 9
    assert t.numpy().tolist() == [0.0, 9.0, 2.0, 3.0]
    assert torch.from_dlpack(t).tolist() == [0.0, 9.0, 2.0, 3.0]
