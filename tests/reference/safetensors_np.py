"""Minimal safetensors reader on numpy, independent of tessera's C++ code and of the checkpoint writer.

  read_file(path)      -> {name: float32 ndarray}       one .safetensors file
  read_dir(model_dir)  -> {name: float32 ndarray}       a checkpoint directory: the shards listed in
                                                        model.safetensors.index.json, else every
                                                        *.safetensors file in it
  read_header(path)    -> the JSON header (dict), without loading data

Supported dtypes: BF16, F16, F32 (all widened to float32 exactly). The format: u64 little-endian
header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": ...},
then the data block; offsets are relative to the start of the data block.
"""
import json
import os
import struct

import numpy as np

_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}


def bf16_bits_to_f32(u16):
    """bfloat16 bit patterns (uint16) -> float32 (exact: bf16 is the top half of a float32)."""
    return (np.asarray(u16, dtype=np.uint32) << np.uint32(16)).view(np.float32)


def read_header(path):
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(hlen))


def read_file(path):
    """Returns {name: float32 ndarray} of one .safetensors file; raises ValueError on a bad file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ValueError(f"{path}: header length {hlen} exceeds the file")
    header = json.loads(raw[8:8 + hlen])
    data = raw[8 + hlen:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dt, shape = t["dtype"], t["shape"]
        b, e = t["data_offsets"]
        if dt not in _ITEMSIZE:
            raise ValueError(f"{path}: unsupported dtype {dt} for {name}")
        n = int(np.prod(shape, dtype=np.int64))
        if e - b != n * _ITEMSIZE[dt] or e > len(data) or b < 0:
            raise ValueError(f"{path}: {name} has offsets [{b}, {e}) for shape {shape} {dt} "
                             f"(data block {len(data)} bytes)")
        buf = data[b:e]
        if dt == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(buf, dtype="<u2"))
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        else:
            arr = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        out[name] = arr.reshape(shape)
    return out


def shard_files(model_dir):
    """The .safetensors files of a checkpoint directory (from the index when there is one)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return sorted(p for p in os.listdir(model_dir) if p.endswith(".safetensors"))


def read_dir(model_dir):
    """All tensors of a checkpoint directory; with an index, checks every listed tensor is found
    in the shard the index names."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    tensors, where = {}, {}
    for fn in shard_files(model_dir):
        for name, arr in read_file(os.path.join(model_dir, fn)).items():
            if name in tensors:
                raise ValueError(f"{model_dir}: tensor {name} appears in {where[name]} and {fn}")
            tensors[name], where[name] = arr, fn
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        for name, fn in wm.items():
            if where.get(name) != fn:
                raise ValueError(f"{model_dir}: index puts {name} in {fn}, found in {where.get(name)}")
    return tensors
