"""The seed's examples (../shared/seed), run through distribute.compat with
only the import line changed, against what the seed prints."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

SEED = pathlib.Path(__file__).resolve().parents[2] / "examples" / "seed.py"


def squash(text):
    return re.sub(r"\s+", "", text)


@pytest.fixture(scope="module")
def printed():
    # The environment is kept (under ASan it preloads the sanitizer's runtime).
    env = dict(os.environ, DISTRIBUTE_GPUS_AS_CPUS="1", PYTHONPATH=":".join(sys.path))
    done = subprocess.run([sys.executable, str(SEED)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_replica_id(printed):
    assert squash(
        """PerReplica:{
      0: <tf.Tensor: shape=(), dtype=int32, numpy=0>,
      1: <tf.Tensor: shape=(), dtype=int32, numpy=1>
    }"""
    ) in squash(printed)


def test_all_gather_one_tensor(printed):
    row = "<tf.Tensor: shape=(6,), dtype=int32, numpy=array([1, 2, 3, 1, 2, 3], dtype=int32)>"
    assert squash(f"PerReplica:{{ 0: {row}, 1: {row} }}") in squash(printed)
    assert squash(f"({row}, {row})") in squash(printed)


def test_all_gather_nest(printed):
    assert "gather_nest: [[1, 2, 3, 1, 2, 3], [[1, 2], [3, 4], [1, 2], [3, 4]]] on every replica" in printed


def test_all_gather_ragged(printed):
    assert "ragged: {'a': [0, 1], 'b': [[0, 1], [2, 3], [4, 5]]} on every replica" in printed


def test_all_reduce(printed):
    scalar = "<tf.Tensor: shape=(), dtype=float32, numpy=2.0>"
    assert squash(f"({scalar}, {scalar})") in squash(printed)
    assert "([2.0, 4.0], [2.0, 4.0])" in printed


def test_merge_call_default(printed):
    assert "merge_call in the default context: 3" in printed
