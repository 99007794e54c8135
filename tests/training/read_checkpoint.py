"""Reads a checkpoint of distribute with nothing of distribute.

The shards are read from the safetensors format's own description (an 8-byte
little-endian header length, a JSON header of dtype, shape and data_offsets,
then the bytes, with no gap), the manifest and the index as plain JSON, and
each tensor's CRC32C is checked with python3-crc32c, an implementation
independent of the C++ writer.

usage: read_checkpoint.py DIR "w = W, b = B after N steps; saved PATH"
(the last line of examples/resumable_training, whose values must be those saved).
"""
import json
import os
import re
import struct
import sys

import crc32c
import numpy as np

DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32,
    "I64": np.int64, "F16": np.float16, "F32": np.float32, "F64": np.float64,
}


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert (8 + n) % 8 == 0, "the data should start 8-aligned"
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__")
    assert all(isinstance(v, str) for v in meta.values()), meta
    body = data[8 + n:]
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    end = 0
    for begin, stop in spans:
        assert begin == end, f"{path}: a gap or overlap at byte {begin}"
        end = stop
    assert end == len(body), f"{path}: {len(body) - end} bytes after the last tensor"
    tensors = {}
    for key, v in header.items():
        begin, stop = v["data_offsets"]
        raw = body[begin:stop]
        array = np.frombuffer(raw, dtype=np.dtype(DTYPES[v["dtype"]]).newbyteorder("<")).reshape(v["shape"])
        tensors[key] = (v, array, raw)
    return tensors


def main(directory, line):
    with open(os.path.join(directory, "checkpoint.json")) as f:
        index = json.load(f)
    prefix = os.path.join(directory, index["model_checkpoint_path"])
    assert index["all_model_checkpoint_paths"][-1] == index["model_checkpoint_path"]
    with open(prefix + ".index.json") as f:
        manifest = json.load(f)
    assert manifest["format"] == "distribute.checkpoint" and manifest["version"] == 1

    values = {}
    for shard_no, shard in enumerate(manifest["shards"]):
        path = os.path.join(directory, shard["file"])
        assert os.path.getsize(path) == shard["size"], path
        for key, (header, array, raw) in read_shard(path).items():
            entry = manifest["tensors"][key]
            assert entry["shard"] == shard_no, key
            assert entry["dtype"] == header["dtype"] and entry["shape"] == header["shape"], key
            assert entry["offset"] == header["data_offsets"][0] and entry["size"] == len(raw), key
            assert crc32c.crc32c(raw) == entry["crc32c"], f"{key}: CRC32C differs"
            values[key] = array
    assert set(values) == set(manifest["tensors"]), "every tensor of the manifest is in a shard"

    m = re.match(r"w = (\S+), b = (\S+) after (\d+) steps; saved (\S+)", line)
    assert m, line
    assert os.path.samefile(m.group(4) + ".index.json", prefix + ".index.json")
    value = "/.ATTRIBUTES/VARIABLE_VALUE"
    w, b = values["model/w" + value], values["model/b" + value]
    assert w.dtype == np.float32 and w.shape == () and w == np.float32(m.group(1)), (w, m.group(1))
    assert b == np.float32(m.group(2)), (b, m.group(2))
    assert values["optimizer/iter" + value] == int(m.group(3))
    assert values["epoch" + value].dtype == np.int64
    for var in ("model/w", "model/b"):
        for slot in ("m", "v"):
            key = f"{var}/.OPTIMIZER_SLOT/optimizer/{slot}{value}"
            assert values[key].dtype == np.float32 and np.isfinite(values[key]), key
    assert values["save_counter" + value] == manifest["save_counter"]
    print(f"read {len(values)} tensors of {prefix} without distribute: values and CRC32C agree")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
