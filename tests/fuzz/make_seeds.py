#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets (tests/fuzz/corpus/TARGET/seed-*), small valid inputs the
fuzzer mutates from; the unit tests check that each is accepted.

  make_seeds.py [--out tests/fuzz/corpus]

model: tiny checkpoints of the four families (tools/make_tiny_checkpoint.py: hidden 8 or 32, one or two
layers, vocabularies of 264-272 tokens) as Hugging Face directories packed in the target's container
(targets.h), and as GGUF files written by tools/gguf/hf_to_gguf.py (f32, f16, bf16, q8_0).
tokenize: a few texts (ASCII, mixed scripts with combining marks, special-token markers, invalid UTF-8).
llama2c: a llama2.c checkpoint with stories260K's 512-token vocabulary, dim 8, one layer.
request: requests to tessera serve using every option it takes, on tessera-tiny and tessera-tiny-moe.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG = b"#tessera-fuzz-file "
HF_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"]


def run(*args):
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)


def pack(d):
    out = b""
    for name in HF_FILES:
        p = os.path.join(d, name)
        if os.path.exists(p):
            out += TAG + name.encode() + b"\n" + open(p, "rb").read()
    return out


def llama2c_seed():
    rng = np.random.default_rng(0)
    dim, hidden, layers, heads, kv, vocab, seq = 8, 16, 1, 2, 2, 512, 32
    hd = dim // heads
    sizes = [vocab * dim, layers * dim, layers * dim * dim, layers * dim * kv * hd, layers * dim * kv * hd,
             layers * dim * dim, layers * dim, layers * dim * hidden, layers * hidden * dim,
             layers * dim * hidden, dim, seq * hd]
    w = np.concatenate([rng.normal(0, 0.5, n) for n in sizes]).astype("<f4")
    return struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + w.tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests/fuzz/corpus"))
    a = ap.parse_args()
    for t in ("model", "tokenize", "llama2c", "request"):
        os.makedirs(os.path.join(a.out, t), exist_ok=True)
    make = os.path.join(REPO, "tools/make_tiny_checkpoint.py")
    to_gguf = os.path.join(REPO, "tools/gguf/hf_to_gguf.py")
    common = ["--layers", "1", "--heads", "2", "--intermediate", "16", "--max-pos", "128", "--shards", "1"]
    moe = ["--experts", "4", "--top-k", "2", "--expert-inter", "8"]
    models = {
        "llada": ["--family", "llada", "--hidden", "8", "--vocab", "264", "--dtype", "f32", *common],
        "llada32": ["--family", "llada", "--hidden", "32", "--vocab", "264", "--dtype", "f32", *common],
        "dream": ["--family", "dream", "--hidden", "8", "--kv-heads", "1", "--vocab", "264", "--dtype", "bf16",
                  *common],
        "moe": ["--family", "llada_moe", "--hidden", "8", "--vocab", "264", "--dtype", "bf16", *common, *moe],
        "llada2": ["--family", "llada2", "--hidden", "8", "--vocab", "272", "--dtype", "bf16", *common, *moe,
                   "--layers", "2", "--n-group", "2", "--topk-group", "2"],
    }
    ggufs = [("llada", "f32"), ("llada32", "q8_0"), ("dream", "f16"), ("moe", "bf16")]
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in models.items():
            d = os.path.join(tmp, name)
            run(make, "--out", d, *args)
            if name == "llada":  # tessera's generation defaults (Session reads them)
                gp = os.path.join(d, "generation_config.json")
                g = json.load(open(gp))
                g.update({"gen_length": 16, "steps": 16, "block_length": 16, "alg": "low_confidence",
                          "threshold": 0.0})
                json.dump(g, open(gp, "w"))
            if name != "llada32":
                open(os.path.join(a.out, "model", f"seed-{name}.hf"), "wb").write(pack(d))
        for name, outtype in ggufs:
            dst = os.path.join(a.out, "model", f"seed-{name}-{outtype}.gguf")
            run(to_gguf, os.path.join(tmp, name), dst, "--outtype", outtype, "--quiet")
    texts = {
        "ascii": "Once upon a time, there was a little girl named Lily. She liked 123 apples!\n\n  end",
        "scripts": "naïve café — 東京 🦙 Привет мир नमस्ते e\u0301 A\u030a \u1100\u1161\u11a8\t\r\n",
        "specials": "<|endoftext|>Hi<|im_start|>user\n<think>x</think><|mdm_mask|>>\u0338<|im_end|>",
    }
    for name, text in texts.items():
        open(os.path.join(a.out, "tokenize", f"seed-{name}"), "wb").write(text.encode())
    open(os.path.join(a.out, "tokenize", "seed-invalid-utf8"), "wb").write(b"ab\xff\xfe c\xc3(\xe2\x82 end\x80")
    open(os.path.join(a.out, "llama2c", "seed-dim8"), "wb").write(llama2c_seed())
    # request: route/model byte (bit 0 chat, bit 1 tessera-tiny-moe, bits 2-3: 2 /tokenize, 3 /detokenize),
    # then the body.
    requests = {
        "completion": (0, {"prompt": "Once upon a time", "max_tokens": 8, "steps": 8, "seed": 3}),
        "chat": (1, {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                     "max_tokens": 8, "temperature": 0.7, "stream": True, "stream_options": {"include_usage": True}}),
        "options": (0, {"model": "tessera", "prompt": "A cat", "max_tokens": 16, "steps": 8, "block_length": 8,
                        "alg": "low_confidence", "threshold": 0.9, "cache": "prefix", "n": 1}),
        "sparse": (0, {"prompt": "The sun", "max_tokens": 16, "steps": 16, "sparse_block": 8,
                       "sparse_rho": 0.5, "sparse_skip": 0.25, "sparse": True}),
        "window": (1, {"messages": [{"role": "user", "content": "Go"}], "max_tokens": 16, "steps": 16,
                       "window_ex": 8, "window_in": 4, "window_refresh": 2, "window_early_stop": True,
                       "window": True}),
        "tokenize": (8, {"content": "Once upon a time", "add_special": True, "with_pieces": True}),
        "detokenize": (12, {"tokens": [5, 9, 300, 4090]}),
        "suffix": (0, {"prompt": "The cat", "suffix": " sat down.", "max_tokens": 8, "steps": 8}),
        "moe-des": (3, {"messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 8, "steps": 4,
                        "des": "vote", "des_k": 6, "des_beta": 0.5, "des_scope": "block", "cfg": 0.0,
                        "top_p": 1.0, "top_k": 0, "user": "u", "logprobs": False,
                        "presence_penalty": 0, "frequency_penalty": 0}),
        # OpenAI's fields taken with their no-op values only (serve_request.cpp: noop_fields).
        "openai-noops": (1, {"messages": [{"role": "user", "content": "Hi", "name": "a"}], "max_tokens": 8,
                             "steps": 8, "logit_bias": {}, "response_format": {"type": "text"}, "tools": [],
                             "tool_choice": "none", "parallel_tool_calls": False, "store": False,
                             "metadata": {"k": "v"}, "service_tier": "auto", "modalities": ["text"]}),
        "best-of": (0, {"prompt": "Hi", "max_tokens": 8, "steps": 8, "n": 2, "best_of": 2, "echo": False,
                        "logit_bias": None}),
    }
    for name, (route, body) in requests.items():
        open(os.path.join(a.out, "request", f"seed-{name}"), "wb").write(bytes([route]) + json.dumps(body).encode())


if __name__ == "__main__":
    main()
