"""Minimal safetensors reader/writer on numpy (bf16/f16/f32), independent of tessera's C++ code."""
import json
import os
import struct

import numpy as np


def bf16_bits_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def read_file(path):
    """Returns {name: float32 ndarray} of one .safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    data = raw[8 + hlen:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = data[b:e]
        shape = t["shape"]
        if t["dtype"] == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(buf, dtype=np.uint16))
        elif t["dtype"] == "F16":
            arr = np.frombuffer(buf, dtype=np.float16).astype(np.float32)
        elif t["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype=np.float32).copy()
        else:
            raise ValueError(f"{path}: unsupported dtype {t['dtype']} for {name}")
        out[name] = arr.reshape(shape)
    return out


def read_dir(model_dir):
    """All tensors of a checkpoint directory (sharded via the index, or every .safetensors file)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = []
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(p for p in os.listdir(model_dir) if p.endswith(".safetensors"))
    tensors = {}
    for fn in files:
        tensors.update(read_file(os.path.join(model_dir, fn)))
    return tensors


def write_file(path, tensors, dtype="BF16"):
    """Writes {name: float32 ndarray} with every tensor in `dtype` (BF16 or F32)."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        arr = np.asarray(arr, dtype=np.float32)
        blob = f32_to_bf16_bits(arr).tobytes() if dtype == "BF16" else arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hs = json.dumps(header).encode()
    hs += b" " * ((8 - len(hs) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hs)))
        f.write(hs)
        for b in blobs:
            f.write(b)
    return off
