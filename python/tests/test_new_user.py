"""What a new user trips over (issue #45): datasets iterated once per epoch,
numpy's BLAS threads within the cores, an import from another interpreter,
TF_CONFIG, and messages that point the way."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import distribute as ds
from distribute import _blas, _distribute


def replica_id():
    return int(ds.get_replica_context().replica_id_in_sync_group)


def run_python(code, env=None, timeout=60):
    """`code` in a new interpreter (this one), with this package importable."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- 1. a distributed dataset is iterated again for every epoch --------------


def labels_of(dataset):
    return [sorted(v for c in batch.values for v in c.numpy().tolist()) for batch in dataset]


def test_a_list_is_iterated_once_per_epoch(strategy):
    data = [np.arange(i, i + 4, dtype=np.float32) for i in range(0, 12, 4)]
    dist = strategy.experimental_distribute_dataset(data)
    epochs = [labels_of(dist) for _ in range(3)]
    assert epochs[0] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert epochs[1] == epochs[0] and epochs[2] == epochs[0]


def test_an_object_whose_iter_starts_again_is_iterated_once_per_epoch(strategy):
    class Batches:
        passes = 0

        def __iter__(self):
            Batches.passes += 1
            return iter([np.ones(2, dtype=np.float32)] * 2)

    dist = strategy.experimental_distribute_dataset(Batches())
    assert [len(labels_of(dist)) for _ in range(3)] == [2, 2, 2]


def test_training_several_epochs_sees_every_batch_in_every_epoch(strategy):
    with strategy.scope():
        w = ds.Variable(0.0, name="w")
    sgd = ds.SGD(learning_rate=0.2)
    x_all = np.linspace(-1, 1, 16, endpoint=False, dtype=np.float32)
    y_all = 2 * x_all
    dist = strategy.experimental_distribute_dataset([(x_all[i : i + 8], y_all[i : i + 8]) for i in range(0, 16, 8)])

    def step(batch):
        x, y = batch[0].numpy(), batch[1].numpy()
        err = float(w.read_value()) * x - y
        sgd.apply_gradients([(2 * float(np.sum(err * x)) / 8, w)])

    steps_per_epoch = []
    for _ in range(30):
        steps = 0
        for batch in dist:
            strategy.run(step, args=(batch,))
            steps += 1
        steps_per_epoch.append(steps)
    assert steps_per_epoch == [2] * 30
    assert sgd.iterations == 60
    assert abs(float(w.read_value()) - 2) < 1e-3


def test_an_exhausted_generator_is_refused_not_empty(strategy):
    def batches():
        yield np.zeros(2, dtype=np.float32)

    source = batches()
    dist = strategy.experimental_distribute_dataset(source)
    assert len(labels_of(dist)) == 1
    with pytest.raises(ValueError, match="one-shot iterator.*cannot be iterated again") as info:
        labels_of(dist)
    assert "generator object" in str(info.value)


def test_a_generator_left_early_goes_on_where_it_stopped(strategy):
    dist = strategy.experimental_distribute_dataset(np.full(2, i, dtype=np.float32) for i in range(3))
    for batch in dist:
        assert batch.values[0].numpy().tolist() == [0.0]
        break
    assert labels_of(dist) == [[1, 1], [2, 2]]


def test_datasets_from_function_is_iterated_once_per_epoch(strategy):
    calls = []

    def dataset_fn(ctx):
        calls.append(ctx.input_pipeline_id)
        return [np.full(1, i, dtype=np.int32) for i in range(4)]  # per-replica batches

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    epochs = [labels_of(dist) for _ in range(3)]
    assert epochs == [[[0, 1], [2, 3]]] * 3
    assert calls == [0]  # called once, as TensorFlow calls it


def test_a_scalar_is_not_a_dataset(strategy):
    with pytest.raises(TypeError, match="experimental_distribute_dataset: dataset must be an iterable"):
        strategy.experimental_distribute_dataset(3)
    with pytest.raises(TypeError, match="dataset_fn must return an iterable"):
        strategy.distribute_datasets_from_function(lambda ctx: 3)


# --- 2. numpy in replica functions does not oversubscribe the cores ----------


def blas_threads():
    return set(_blas.current_threads().values())


@pytest.mark.skipif(not _blas.current_threads(), reason="no BLAS library with threads is loaded (threadpoolctl)")
@pytest.mark.skipif(_blas.usable_cores() < 2, reason="one usable core: nothing to divide")
def test_replicas_share_the_cores_among_their_blas_threads(strategy):
    before = blas_threads()
    expected = max(1, _blas.usable_cores() // 2)
    inside = strategy.run(lambda: blas_threads())
    assert inside.values == ({min(expected, t) for t in before},) * 2
    assert blas_threads() == before  # given back
    one = ds.OneDeviceStrategy("CPU:0")
    assert one.run(lambda: blas_threads()) == before  # one replica keeps them all


@pytest.mark.skipif(not _blas.current_threads(), reason="no BLAS library with threads is loaded (threadpoolctl)")
def test_a_thread_count_the_user_set_is_never_raised():
    out = run_python(
        """
        import distribute as ds
        from distribute import _blas
        s = ds.MirroredStrategy(["CPU:0", "CPU:1"])
        seen = []
        s.run(lambda: seen.append(max(_blas.current_threads().values())))
        print(seen)
        print(max(_blas.current_threads().values()))
        """,
        env={"OPENBLAS_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[1, 1]", "1"]


@pytest.mark.skipif(not _blas.current_threads(), reason="no BLAS library with threads is loaded (threadpoolctl)")
@pytest.mark.skipif(_blas.usable_cores() < 2, reason="one usable core: nothing to divide")
def test_the_blas_limit_can_be_turned_off():
    out = run_python(
        """
        import distribute as ds
        from distribute import _blas
        before = max(_blas.current_threads().values())
        s = ds.MirroredStrategy(["CPU:0", "CPU:1"])
        seen = []
        s.run(lambda: seen.append(max(_blas.current_threads().values())))
        print(seen == [before, before])
        """,
        env={"DISTRIBUTE_LIMIT_BLAS_THREADS": "0"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


# --- 4. another Python finds out why ------------------------------------------


def test_an_interpreter_without_numpy_is_told_what_the_module_was_built_for():
    # numpy made unimportable, as in a python3 that lacks it.
    out = run_python("import sys; sys.modules['numpy'] = None; import distribute")
    assert out.returncode != 0
    message = out.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: distribute: its extension module does not load"), out.stderr
    assert f"this interpreter, {sys.executable}" in message and "no numpy" in message
    assert f"built for {_distribute_build_python()}" in message
    assert f"-DPython3_EXECUTABLE={sys.executable}" in message


def _distribute_build_python():
    from distribute import _build_info

    return _build_info.PYTHON_EXECUTABLE


# --- 5. TF_CONFIG is not ignored silently --------------------------------------


@pytest.mark.skipif(not hasattr(_distribute, "MultiWorkerMirroredStrategy"), reason="built without MPI")
def test_tf_config_without_a_launcher_is_said_once():
    tf_config = '{"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"type": "worker", "index": 1}}'
    out = run_python(
        """
        import distribute as ds
        for _ in range(2):
            s = ds.MultiWorkerMirroredStrategy()
        print(s.num_workers)
        """,
        env={"TF_CONFIG": tf_config},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    assert out.stderr.count("TF_CONFIG is set") == 1, out.stderr
    assert "single worker" in out.stderr and "mpirun -np N" in out.stderr


# --- 7. messages that point the way ------------------------------------------


def test_a_missing_argument_names_the_public_method(strategy):
    values = strategy.run(lambda: ds.constant(1.0))
    with pytest.raises(TypeError, match=r"Strategy\.reduce\(\) missing 1 required positional argument: 'axis'"):
        strategy.reduce("sum", values)
    with pytest.raises(TypeError, match=r"StrategyExtended\.reduce_to\(\) missing"):
        strategy.extended.reduce_to("sum", values)


def test_a_gpu_name_without_a_gpu_mentions_gpus_as_cpus(monkeypatch):
    if _distribute._gpus_visible():
        pytest.skip("GPUs are visible")
    monkeypatch.delenv("DISTRIBUTE_GPUS_AS_CPUS", raising=False)
    for make in (lambda: ds.MirroredStrategy(["GPU:0", "GPU:1"]), lambda: ds.OneDeviceStrategy("/gpu:0")):
        with pytest.raises(ds.errors.InvalidArgumentError, match="DISTRIBUTE_GPUS_AS_CPUS=1"):
            make()
    with pytest.raises(ds.errors.InvalidArgumentError) as info:
        ds.MirroredStrategy(["CPU:0", "TPU:0"])  # no GPU named: no hint
    assert "DISTRIBUTE_GPUS_AS_CPUS" not in str(info.value)


def test_an_iter_that_gives_the_same_iterator_each_time_is_one_shot(strategy):
    class SameEveryTime:
        def __init__(self):
            self._it = iter([np.zeros(2, dtype=np.float32)] * 2)

        def __iter__(self):
            return self._it

    dist = strategy.experimental_distribute_dataset(SameEveryTime())
    assert len(labels_of(dist)) == 2
    with pytest.raises(ValueError, match="one-shot iterator"):
        labels_of(dist)


# --- 6. optimizers as TensorFlow's ------------------------------------------


def train_one_variable(strategy, optimizer, steps, grad=1.0):
    with strategy.scope():
        w = ds.Variable(0.0, name="w")
    for _ in range(steps):
        strategy.run(lambda: optimizer.apply_gradients([(grad / strategy.num_replicas_in_sync, w)]))
    return float(w.read_value())


def test_learning_rate_is_a_number_or_a_schedule_readable_and_settable(strategy):
    sgd = ds.SGD(learning_rate=0.5)
    assert sgd.learning_rate == 0.5
    sgd.learning_rate = 0.25
    assert sgd.learning_rate == 0.25 and sgd.current_learning_rate == 0.25
    assert train_one_variable(strategy, sgd, 2) == -0.5
    schedule = ds.PiecewiseConstantDecay([0], [0.5, 0.125])
    sgd.learning_rate = schedule
    assert isinstance(sgd.learning_rate, ds.LearningRateSchedule)
    assert sgd.current_learning_rate == 0.125  # iterations is 2: past the boundary
    decay = ds.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    assert decay(10) == pytest.approx(0.05) and "ExponentialDecay(" in repr(decay)
    assert ds.CosineDecay(1.0, 100, alpha=0.1)(100) == pytest.approx(0.1)
    with pytest.raises(TypeError, match="learning_rate must be a number or a schedule"):
        sgd.learning_rate = "fast"
    with pytest.raises(ds.errors.InvalidArgumentError, match="decay_steps must be > 0"):
        ds.ExponentialDecay(0.1, 0, 0.5)


def test_a_python_callable_is_a_schedule_evaluated_at_iterations(strategy):
    seen = []

    def schedule(step):
        seen.append(step)
        return 1.0 if step == 0 else 0.5

    sgd = ds.SGD(learning_rate=schedule)
    assert sgd.learning_rate is schedule
    assert train_one_variable(strategy, sgd, 3) == -(1.0 + 0.5 + 0.5)
    assert seen == [0, 1, 2]  # once per step, not per replica
    sgd.learning_rate = lambda step: float("nan")
    with pytest.raises(ds.errors.InvalidArgumentError, match="at step 3 is nan"):
        train_one_variable(strategy, sgd, 1)
    assert sgd.iterations == 3  # the failed step is not counted


def adam_first_update(step, lr=0.1, g=1.0, b1=0.9, b2=0.999, eps=1e-7):
    """w after one Adam update from w = 0 and zero slots, taken as step `step` (Keras' formulas, float32)."""
    f = np.float32
    alpha = f(lr * np.sqrt(1 - b2**step) / (1 - b1**step))
    m = (f(g) - f(0)) * (f(1) - f(b1))
    v = (f(g) * f(g) - f(0)) * (f(1) - f(b2))
    return float(f(0) - alpha * m / (np.sqrt(v) + f(eps)))


def test_setting_iterations_continues_adams_bias_correction(strategy):
    # A fresh optimizer told it has taken two steps (as a restore does):
    # its next update uses step 3's bias correction, not step 1's.
    adam = ds.Adam(learning_rate=0.1)
    adam.iterations = 2
    assert adam.iterations == 2
    assert train_one_variable(strategy, adam, 1) == pytest.approx(adam_first_update(3), rel=1e-6)
    assert adam.iterations == 3
    assert train_one_variable(strategy, ds.Adam(learning_rate=0.1), 1) == pytest.approx(adam_first_update(1), rel=1e-6)
    assert adam_first_update(3) != pytest.approx(adam_first_update(1), rel=1e-3)
    with pytest.raises(TypeError, match="iterations must be an int"):
        adam.iterations = 1.5
    with pytest.raises(ds.errors.InvalidArgumentError, match="iterations must be >= 0"):
        adam.iterations = -1


def test_a_none_gradient_is_skipped_with_a_warning(strategy, capfd):
    with strategy.scope():
        w = ds.Variable(1.0, name="w")
        frozen = ds.Variable(1.0, name="frozen")
    sgd = ds.SGD(learning_rate=0.5)
    for _ in range(2):
        strategy.run(lambda: sgd.apply_gradients([(0.5, w), (None, frozen)]))
    assert float(w.read_value()) == 0.0 and float(frozen.read_value()) == 1.0
    err = capfd.readouterr().err
    assert err.count("gradients do not exist for variables ['frozen']") == 1, err
    with pytest.raises(ValueError, match=r"No gradients provided for any variable: \('w', 'frozen'\)"):
        strategy.run(lambda: sgd.apply_gradients([(None, w), (None, frozen)]))
