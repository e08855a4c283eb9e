#!/usr/bin/env python3
"""Writes tests/data/gguf/quant_vectors.bin: ggml's own quantization and dequantization of test data,
the reference for tessera's ggml_dequantize (tests/unit/gguf_quant_test.cpp).

  /usr/bin/python3 tools/gguf/make_quant_vectors.py LIBGGML_BASE_SO [--out tests/data/gguf/quant_vectors.bin]

LIBGGML_BASE_SO is the real ggml library, libggml-base.so, as shipped prebuilt for Linux x64 in the npm
package of node-llama-cpp (it exports ggml_quantize_chunk, ggml_get_type_traits and dequantize_row_*):

  npm pack @node-llama-cpp/linux-x64@3.22.1 && tar xzf node-llama-cpp-linux-x64-3.22.1.tgz
  # -> package/bins/linux-x64/libggml-base.so (its llama.cpp build is named in _nlcBuildMetadata.json)

It is built for baseline x86-64 (no FMA), so every product and sum in its dequantization is rounded
separately. The script is deterministic: the inputs come from a fixed-seed numpy generator, and the
output depends only on them and on the library.

File format (all little-endian):
  header   : magic b"TQV1", u32 n_types, u32 n_input, u32 n_records
  types    : n_types x (u32 type, u32 block, u32 block_bytes, char name[16] NUL-padded), ggml's own
             table for every type number it names (blck_size > 0)
  input    : n_input f32, the values quantized by the kind-0 records (rows of ROW values)
  records  : n_records x (u32 type, u32 kind, u32 n, u32 nbytes, u8 data[nbytes], f32 ggml[n])
             kind 0: data = ggml_quantize_chunk(type, input, rows of ROW) (n == n_input)
             kind 1: data = pseudo-random block bytes (all quant and sub-block scale bits random)
                     with finite f16 scales from 2^-20 to 2 (random non-NaN bits for f16/bf16);
                     no input
             ggml = ggml's to_float (ggml_get_type_traits(type)->to_float) of data
"""
import argparse
import ctypes
import os
import struct
import sys

import numpy as np

ROW = 256  # values per row: one k-quant super-block, 8 blocks of the 32-value types
RANDOM_N = 512  # values per kind-1 record

# ggml type numbers (ggml.h enum ggml_type) of the types tessera converts.
TYPES = {
    "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q2_K": 10, "q3_K": 11,
    "q4_K": 12, "q5_K": 13, "q6_K": 14, "iq4_nl": 20, "iq4_xs": 23, "bf16": 30, "mxfp4": 39,
}
# Byte offsets of the f16 scale fields in one block (ggml-common.h), for the random records.
F16_FIELDS = {
    "q4_0": [0], "q4_1": [0, 2], "q5_0": [0], "q5_1": [0, 2], "q8_0": [0], "q2_K": [80, 82],
    "q3_K": [108], "q4_K": [0, 2], "q5_K": [0, 2], "q6_K": [208], "iq4_nl": [0], "iq4_xs": [0],
}
# GGML_TYPE_COUNT of the library (ggml.h): ggml_get_type_traits does not check its argument in release
# builds, so the table is read for 0 .. GGML_TYPE_COUNT - 1 only.
GGML_TYPE_COUNT = 43


class TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def load(path):
    lib = ctypes.CDLL(os.path.abspath(path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def type_table(lib):
    """ggml's (type, block, block_bytes, name) for every type number it names."""
    table = []
    for t in range(GGML_TYPE_COUNT):
        tr = lib.ggml_get_type_traits(t).contents
        if tr.blck_size > 0:  # retired numbers have blck_size 0 and a "... REMOVED" name
            table.append((t, tr.blck_size, tr.type_size, tr.type_name.decode()))
    return table


def inputs():
    """6 rows of ROW values, each a different regime for the scale and min fitting."""
    rng = np.random.default_rng(20240611)
    g = lambda: rng.standard_normal(ROW)
    rows = []
    rows.append(g())  # plain gaussian
    r = g() * 0.1
    r[rng.choice(ROW, 6, replace=False)] = np.array([15.0, -22.0, 9.5, -7.0, 30.0, -0.01])
    rows.append(r)  # small values with a few large outliers
    r = np.zeros(ROW)
    r[128:] = np.where(rng.random(128) < 0.2, g()[:128], 0.0)
    rows.append(r)  # first half exactly zero (all-zero blocks), then sparse
    rows.append(-np.abs(g()) - 0.5)  # negative only (minimum far from zero)
    rows.append(g() * 5e-4)  # tiny: f16 scales land in the subnormal range
    rows.append(rng.uniform(10.0, 300.0, ROW))  # positive, large, offset
    return np.concatenate(rows).astype(np.float32)


def to_float(lib, t, data, n):
    fn = TO_FLOAT(lib.ggml_get_type_traits(t).contents.to_float)
    src = ctypes.create_string_buffer(bytes(data), len(data))
    out = np.zeros(n, dtype=np.float32)
    fn(ctypes.cast(src, ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), n)
    return out


def quantize(lib, t, x):
    nrows = x.size // ROW
    size = lib.ggml_row_size(t, ROW) * nrows
    dst = ctypes.create_string_buffer(size)
    lib.ggml_quantize_init(t)
    got = lib.ggml_quantize_chunk(t, x.ctypes.data_as(ctypes.c_void_p), dst, 0, nrows, ROW, None)
    assert got == size, (t, got, size)
    return dst.raw


def random_bytes(name, t, block, block_bytes, seed):
    rng = np.random.default_rng(seed)
    if name in ("f16", "bf16"):
        v = rng.integers(0, 1 << 16, RANDOM_N, dtype=np.uint32)
        exp = (v >> 10) & 31 if name == "f16" else (v >> 7) & 255
        # No NaN patterns: ggml quiets signalling NaNs on conversion and tessera keeps the bits.
        v = np.where(exp == (31 if name == "f16" else 255), v & ~np.uint32(1 << 14), v)
        v[:4] = [0x7C00, 0xFC00, 0x0001, 0x8000] if name == "f16" else [0x7F80, 0xFF80, 0x0001, 0x8000]
        return v.astype("<u2").tobytes()
    nblocks = RANDOM_N // block
    data = rng.integers(0, 256, (nblocks, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS.get(name, []):
        # Finite scales of both signs from 2^-20 (subnormal f16) to about 2.
        mag = np.exp2(rng.uniform(-20.0, 1.0, nblocks)) * np.where(rng.random(nblocks) < 0.5, -1.0, 1.0)
        h = mag.astype(np.float16).view(np.uint16)
        data[:, off] = h & 0xFF
        data[:, off + 1] = h >> 8
    if name == "mxfp4":  # E8M0 exponents around 2^0, plus the subnormal cases 0 and 1
        data[:, 0] = rng.integers(110, 140, nblocks)
        data[0, 0], data[1, 0] = 0, 1
    return data.tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", help="path of libggml-base.so (see the module docstring)")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "data", "gguf", "quant_vectors.bin"))
    args = ap.parse_args()
    lib = load(args.lib)

    table = type_table(lib)
    info = {t: (b, bb, name) for t, b, bb, name in table}
    x = inputs()
    records = []
    for name, t in TYPES.items():
        block, block_bytes, ggml_name = info[t]
        assert ggml_name == name, (t, ggml_name, name)
        data = quantize(lib, t, x)
        y = to_float(lib, t, data, x.size)
        records.append((t, 0, data, y))
        err = [float(np.sqrt(np.mean((y[r:r + ROW] - x[r:r + ROW]) ** 2) / np.mean(x[r:r + ROW] ** 2)))
               for r in range(0, x.size, ROW)]
        print(f"{name:7s} relative rms error per row: " + " ".join(f"{e:.4f}" for e in err))
        data = random_bytes(name, t, block, block_bytes, seed=1000 + t)
        records.append((t, 1, data, to_float(lib, t, data, RANDOM_N)))

    out = bytearray(b"TQV1" + struct.pack("<III", len(table), x.size, len(records)))
    for t, b, bb, name in table:
        out += struct.pack("<III16s", t, b, bb, name.encode())
    out += x.astype("<f4").tobytes()
    for t, kind, data, y in records:
        out += struct.pack("<IIII", t, kind, y.size, len(data)) + data + y.astype("<f4").tobytes()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(out)
    print(f"wrote {args.out}: {len(table)} types, {len(records)} records, {len(out)} bytes")


if __name__ == "__main__":
    sys.exit(main())
