#!/usr/bin/env python3
"""Writes a tiny random checkpoint in the exact Hugging Face layout of LLaDA or Dream: config.json
with the real field names, sharded safetensors + model.safetensors.index.json, a byte-level BPE
tokenizer.json with the family's special tokens, tokenizer_config.json, generation_config.json.

  make_tiny_checkpoint.py --family llada|dream --out DIR [--seed 0] [--hidden 64] [--layers 2]
      [--heads 4] [--kv-heads N] [--intermediate 160] [--vocab 300] [--max-pos 512] [--shards 2]
      [--dtype bf16|f32] [--no-qkv-bias]
Special tokens take the top ids of the vocabulary (see SPECIALS).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import safetensors_np  # noqa: E402

SPECIALS = {
    "llada": ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>",
              "<|end_header_id|>"],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"],
}
CORPUS = ("the quick brown fox jumps over the lazy dog. once upon a time there was a little girl who "
          "loved to play in the park with her friends. the model writes text by denoising masked tokens.")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_tokenizer(family, vocab):
    b2u = bytes_to_unicode()
    pieces = [b2u[b] for b in range(256)]
    specials = SPECIALS[family]
    n_merges = vocab - 256 - len(specials)
    if n_merges < 0:
        raise SystemExit(f"--vocab must be at least {256 + len(specials)}")
    # Greedy BPE merges learnt from a tiny built-in corpus (words with their leading space).
    words = [[b2u[b] for b in (" " + w if i else w).encode()] for i, w in enumerate(CORPUS.split(" "))]
    merges = []
    while len(merges) < n_merges:
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        pieces.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                else:
                    i += 1
    reserved = 0
    added = []
    while len(pieces) + len(added) + len(specials) < vocab:
        added.append(f"<|reserved_{reserved}|>")
        reserved += 1
    vocab_map = {p: i for i, p in enumerate(pieces)}
    added_tokens = []
    ids = {}
    for content in added + specials:
        tid = len(pieces) + len(added_tokens)
        added_tokens.append({"id": tid, "content": content, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True})
        ids[content] = tid
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab_map, "merges": [f"{a} {b}" for a, b in merges]},
    }
    return tok, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=["llada", "dream"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--intermediate", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--no-qkv-bias", action="store_true")
    a = ap.parse_args()
    fam = a.family
    kv = a.kv_heads or (a.heads if fam == "llada" else max(1, a.heads // 2))
    d, f, V, hd = a.hidden, a.intermediate, a.vocab, a.hidden // a.heads
    rng = np.random.default_rng(a.seed)

    def lin(o, i):
        return rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    tok, ids = make_tokenizer(fam, V)
    t = {}
    if fam == "llada":
        p = "model.transformer."
        t[p + "wte.weight"] = rng.standard_normal((V, d)).astype(np.float32)
        for i in range(a.layers):
            b = f"{p}blocks.{i}."
            t[b + "attn_norm.weight"] = norm(d)
            t[b + "q_proj.weight"] = lin(a.heads * hd, d)
            t[b + "k_proj.weight"] = lin(kv * hd, d)
            t[b + "v_proj.weight"] = lin(kv * hd, d)
            t[b + "attn_out.weight"] = lin(d, a.heads * hd)
            t[b + "ff_norm.weight"] = norm(d)
            t[b + "ff_proj.weight"] = lin(f, d)
            t[b + "up_proj.weight"] = lin(f, d)
            t[b + "ff_out.weight"] = lin(d, f)
        t[p + "ln_f.weight"] = norm(d)
        t[p + "ff_out.weight"] = lin(V, d)
        cfg = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu",
               "alibi": False, "block_type": "llama", "layer_norm_type": "rms", "rope": True,
               "d_model": d, "n_layers": a.layers, "n_heads": a.heads, "n_kv_heads": kv,
               "mlp_hidden_size": f, "mlp_ratio": 4, "vocab_size": V, "embedding_size": V,
               "max_sequence_length": a.max_pos, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
               "weight_tying": False, "include_bias": False, "include_qkv_bias": False,
               "mask_token_id": ids["<|mdm_mask|>"], "eos_token_id": ids["<|endoftext|>"],
               "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|startoftext|>"],
               "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32"}
        tcfg = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                "mask_token": "<|mdm_mask|>", "add_bos_token": True,
                "chat_template": "{{ '<|startoftext|>' }}{% for m in messages %}<|start_header_id|>...{% endfor %}"}
    else:
        t["model.embed_tokens.weight"] = rng.standard_normal((V, d)).astype(np.float32)
        for i in range(a.layers):
            b = f"model.layers.{i}."
            t[b + "input_layernorm.weight"] = norm(d)
            t[b + "self_attn.q_proj.weight"] = lin(a.heads * hd, d)
            t[b + "self_attn.k_proj.weight"] = lin(kv * hd, d)
            t[b + "self_attn.v_proj.weight"] = lin(kv * hd, d)
            if not a.no_qkv_bias:
                t[b + "self_attn.q_proj.bias"] = bias(a.heads * hd)
                t[b + "self_attn.k_proj.bias"] = bias(kv * hd)
                t[b + "self_attn.v_proj.bias"] = bias(kv * hd)
            t[b + "self_attn.o_proj.weight"] = lin(d, a.heads * hd)
            t[b + "post_attention_layernorm.weight"] = norm(d)
            t[b + "mlp.gate_proj.weight"] = lin(f, d)
            t[b + "mlp.up_proj.weight"] = lin(f, d)
            t[b + "mlp.down_proj.weight"] = lin(d, f)
        t["model.norm.weight"] = norm(d)
        t["lm_head.weight"] = lin(V, d)
        cfg = {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_size": d,
               "intermediate_size": f, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
               "num_key_value_heads": kv, "vocab_size": V, "max_position_embeddings": a.max_pos,
               "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
               "hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False,
               "attention_dropout": 0.0, "mask_token_id": ids["<|mask|>"], "pad_token_id": ids["<|endoftext|>"],
               "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"],
               "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32"}
        if a.no_qkv_bias:
            cfg["attention_bias"] = False
        tcfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                "mask_token": "<|mask|>", "add_bos_token": False,
                "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}

    os.makedirs(a.out, exist_ok=True)
    dt = "BF16" if a.dtype == "bf16" else "F32"
    names = list(t.keys())
    if a.shards <= 1:
        safetensors_np.write_file(os.path.join(a.out, "model.safetensors"), t, dt)
    else:
        per = (len(names) + a.shards - 1) // a.shards
        weight_map, total = {}, 0
        for s in range(a.shards):
            fn = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            part = {n: t[n] for n in names[s * per:(s + 1) * per]}
            total += safetensors_np.write_file(os.path.join(a.out, fn), part, dt)
            weight_map.update({n: fn for n in part})
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as fh:
        json.dump(tok, fh, ensure_ascii=False)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as fh:
        json.dump(tcfg, fh, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                   "pad_token_id": cfg["pad_token_id"]}, fh, indent=2)
    print(f"wrote {a.out}: {fam}, {sum(v.size for v in t.values())} parameters")


if __name__ == "__main__":
    main()
