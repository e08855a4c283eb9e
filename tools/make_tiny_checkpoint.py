#!/usr/bin/env python3
"""Writes a tiny random checkpoint in the exact Hugging Face layout of LLaDA, Dream, LLaDA-MoE, LLaDA2,
Nemotron-Labs-Diffusion or DiffusionGemma.

  make_tiny_checkpoint.py --family llada|dream|llada_moe|llada2|nemotron|diffusion_gemma --out DIR [--seed 0]
      [--hidden 64] [--layers 2] [--heads 4] [--kv-heads N] [--intermediate 160] [--vocab 300] [--max-pos 512]
      [--shards 2] [--dtype bf16|f32] [--qkv-bias | --no-qkv-bias]
      llada_moe only: [--experts 8] [--top-k 2] [--expert-inter 32] [--first-dense 0] [--shared-inter 0]
      [--norm-topk] [--routed-scale 1.0] [--partial-rotary 1.0] [--no-qk-norm]
      llada2: the llada_moe expert options (defaults --experts 16 --top-k 3 --first-dense 1
      --routed-scale 2.5 --partial-rotary 0.5 --layers 3, kv heads = heads / 2) and [--n-group 4]
      [--topk-group 2] [--shared-experts 1] [--bias-scale 0.1]
      nemotron: [--head-dim 24] [--nemotron-mscale] [--nemotron-lora R] (kv heads 2)
      diffusion_gemma: defaults --layers 6 --kv-heads 2 --intermediate 48 --experts 8 --top-k 2
      --expert-inter 24 --head-dim 16, and [--global-kv-heads 1] [--global-head-dim 32] [--sliding-window 8]
      [--canvas-length 8] [--sliding-per-full 2] [--encoder-scalars differ|same] [--no-vision]

Output (same file names, config field names, tensor names and dtypes as the real checkpoints, see
shared/specs/models.md):
  config.json                       real field names of the family (LLaDA: d_model, n_layers, ...;
                                    Dream: hidden_size, num_hidden_layers, ...; LLaDA-MoE: model_type
                                    "lladamoe", num_experts, num_experts_per_tok,
                                    expert_intermediate_size, moe_layer_freq, qk_layernorm, ...)
  model-0000K-of-0000N.safetensors  + model.safetensors.index.json  (--shards N > 1)
  model.safetensors                 (--shards 1, no index)
  tokenizer.json                    byte-level BPE: ids 0..255 = the GPT-2 byte symbols (id == byte
                                    value), then merges learnt greedily from a built-in English text,
                                    then (only if the text runs out of pairs) <|reserved_N|> added
                                    tokens, then the family's special tokens at the top of the vocab
  tokenizer_config.json, generation_config.json
  linear_spec_lora/                 nemotron with --nemotron-lora R only: PEFT's adapter_config.json and
                                    adapter_model.safetensors (the draft-only o_proj LoRA, see below)

Special-token ids (V = --vocab):
  llada: <|endoftext|> V-6 (eos = pad), <|startoftext|> V-5 (bos), <|mdm_mask|> V-4 (mask),
         <|eot_id|> V-3, <|start_header_id|> V-2, <|end_header_id|> V-1
  dream: <|endoftext|> V-4 (eos = pad = bos), <|im_start|> V-3, <|im_end|> V-2, <|mask|> V-1 (mask)
  llada_moe, llada2: <|endoftext|> V-5 (eos = pad), <|mask|> V-4 (mask), <role> V-3, </role> V-2,
         <|role_end|> V-1 (llada2's config.json names no mask / eos id, as the real one)
  nemotron: <unk> V-6, <s> V-5 (bos), </s> V-4 (eos = pad), [INST] V-3, [/INST] V-2, <mask> V-1 (mask)
  diffusion_gemma: <pad> V-9 (pad), <eos> V-8, <bos> V-7 (bos), <|turn> V-6, <turn|> V-5, <|channel> V-4,
         <channel|> V-3, <|think|> V-2, <|tool_response> V-1; eos_token_id [V-8, V-5, V-1] (V = 300: pad 291,
         eos [292, 295, 299], bos 293); no mask token (uniform-noise diffusion)

LLaDA-MoE layout (modeling_lladamoe.py): Qwen2-style names without biases plus
self_attn.{q,k}_norm.weight [head_dim]; MoE layers mlp.gate.weight [E, d] (router) and
mlp.experts.E.{gate,up,down}_proj.weight; dense layers (the first --first-dense, moe_layer_freq 0)
mlp.{gate,up,down}_proj.weight of --intermediate (dense_intermediate_size); with --shared-inter N
a shared expert shared_expert.{gate,up,down}_proj.weight on MoE layers.

LLaDA2.0 layout (modeling_llada2_moe.py, LLaDA2.0-mini): model.word_embeddings.weight; per layer
input_layernorm, attention.query_key_value.weight [(H + 2 KV) * head_dim, d] (q rows, then k, then v),
attention.query_layernorm / key_layernorm [head_dim], attention.dense.weight, post_attention_layernorm;
the first --first-dense layers mlp.{gate,up,down}_proj (intermediate_size), then MoE layers mlp.gate.weight
[E, d], mlp.gate.expert_bias [E] (~N(0, --bias-scale^2): a trained, non-zero bias), mlp.experts.E.*, and
mlp.shared_experts.* of --expert-inter * --shared-experts; model.norm.weight, lm_head.weight.

Nemotron-Labs-Diffusion layout (tiny_nemotron.py; Ministral-3 names under encoder., untied
diffusion_head.weight): explicit head_dim (--head-dim 24: q_proj out 96 != hidden 64), YaRN
rope_parameters (factor 16, original_max_position_embeddings 64 on purpose, llama_4_scaling_beta 0.1;
no mscale keys unless --nemotron-mscale), mask / bos / eos / pad ids in config.json, block_size 32,
dlm_paradigm "bidirectional". --nemotron-lora R (R > 0) writes the draft-only LoRA of linear
self-speculation in linear_spec_lora/: adapter_config.json (r R, lora_alpha 2R, target_modules ["o_proj"])
and adapter_model.safetensors with base_model.model.encoder.layers.i.self_attn.o_proj.lora_A.weight
[R, heads * head_dim] and ...lora_B.weight [hidden, R] per layer (both non-zero), drawn after the LM head.

DiffusionGemma layout (tiny_diffusion_gemma.py; google/diffusiongemma-26B-A4B-it in small): config.json with
text_config (model_type "diffusion_gemma_text", layer_types, sliding / full head dims and kv heads,
rope_parameters per layer type, MoE fields) and a small vision_config; the text weights under
model.decoder.* (tied embed_tokens = LM head, K = V on full layers: no v_proj there, the dense MLP, router,
fused experts.gate_up_proj / down_proj, seven norms and layer_scalar per layer, self_conditioning.*), the
encoder's own model.encoder.language_model.layers.N.layer_scalar (--encoder-scalars differ: other values
than the decoder's, the default), a few vision tensors a loader skips (unless --no-vision);
generation_config.json with max_denoising_steps, sampler_config (EntropyBoundSamplerConfig), t_min / t_max,
stability_threshold, confidence_threshold. No chat_template (the Gemma 4 jinja was not read).

Weights: linears N(0, 1/fan_in) stored [out, in]; embeddings N(0, 1); norm weights 1 + 0.1 N(0, 1);
biases 0.1 N(0, 1). The random draws happen in a fixed order (embedding, then per layer in the order
the tensors are listed, then final norm, then LM head, then nemotron's LoRA), so a given --seed and
geometry always gives the same weights (with or without --nemotron-lora).
"""
import argparse
import json
import os
import re
import struct
from collections import Counter

import numpy as np

import tiny_diffusion_gemma  # the --family diffusion_gemma builder (beside this file)
import tiny_nemotron  # the --family nemotron builder (beside this file)

# Special tokens of each family, in the order they take the top ids of the vocabulary.
SPECIALS = {
    "llada": ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>",
              "<|end_header_id|>"],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"],
    "llada_moe": ["<|endoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"],
    "llada2": ["<|endoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"],
    "nemotron": tiny_nemotron.SPECIALS,
    "diffusion_gemma": tiny_diffusion_gemma.SPECIALS,
}

# Built-in English text the BPE merges are learnt from.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little girl who loved to play in the park with her friends.",
    "She saw a big red ball and ran to get it, but the ball rolled into the water.",
    "The model writes text by denoising masked tokens in parallel.",
    "Every day the sun rises in the east and sets in the west.",
    "He said that the weather would be nice, so they went for a walk.",
    "There is nothing better than a good book and a cup of tea on a rainy evening.",
    "The children were happy when their mother made them a cake for the party.",
    "In the morning the birds sing and the flowers open to the light.",
    "What is the answer to the question? Let me think about it for a moment.",
    "They are going to the store to buy some bread, milk and eggs.",
    "It was the best of times, it was the worst of times.",
    "I think that the cat is sleeping on the bed in the other room.",
    "We can learn a lot from the things that happen to us every day.",
    "The teacher asked the students to read the story and write about it.",
]

# GPT-2 pre-tokenizer regex restricted to ASCII (Python's re has no \p{L}); the corpus is ASCII.
PRETOK = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


# ---------------------------------------------------------------------------------------------
# safetensors writer
# ---------------------------------------------------------------------------------------------

def f32_to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even (NaN kept NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    rounded = ((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    rounded[nan] = np.uint16(0x7FC0)
    return rounded


def write_safetensors(path, tensors, dtype):
    """Writes {name: float32 ndarray} with every tensor stored as `dtype` ("BF16" or "F32").

    Layout: u64 little-endian header length, JSON header (padded with spaces to a multiple of 8),
    then the raw little-endian tensor bytes in header order. Returns the number of data bytes."""
    header = {"__metadata__": {"format": "pt"}}
    blobs, off = [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr, dtype=np.float32)
        blob = f32_to_bf16_bits(arr).astype("<u2").tobytes() if dtype == "BF16" else arr.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hs = json.dumps(header, separators=(",", ":")).encode()
    hs += b" " * ((8 - len(hs) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hs)))
        f.write(hs)
        for b in blobs:
            f.write(b)
    return off


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode symbol map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def learn_merges(n_pieces, b2u):
    """Greedy BPE on CORPUS: repeatedly merge the most frequent adjacent pair (ties: the
    lexicographically largest pair, so the result is deterministic). Returns (merges, new_pieces);
    stops at n_pieces new pieces or when no pair is left."""
    words = Counter()
    for line in CORPUS:
        for w in PRETOK.findall(line):
            words[tuple(b2u[b] for b in w.encode())] += 1
    words = {tuple(w): c for w, c in words.items()}
    merges, pieces, seen = [], [], set()
    while len(pieces) < n_pieces:
        counts = Counter()
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                counts[pair] += c
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        if a + b not in seen:  # two merge paths can spell the same string: one vocab entry
            seen.add(a + b)
            pieces.append(a + b)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words
    return merges, pieces


def make_tokenizer(family, vocab):
    """Returns (tokenizer.json dict, {special string: id}); the vocabulary has exactly `vocab` ids."""
    b2u = bytes_to_unicode()
    specials = SPECIALS[family]
    n_free = vocab - 256 - len(specials)
    if n_free < 0:
        raise SystemExit(f"--vocab must be at least {256 + len(specials)} for {family}")
    merges, merged = learn_merges(n_free, b2u)
    pieces = [b2u[b] for b in range(256)] + merged
    reserved = [f"<|reserved_{i}|>" for i in range(n_free - len(merged))]
    vocab_map = {p: i for i, p in enumerate(pieces)}
    assert len(vocab_map) == len(pieces), "duplicate BPE piece"
    added_tokens, ids = [], {}
    for content in reserved + specials:
        tid = len(pieces) + len(added_tokens)
        added_tokens.append({"id": tid, "content": content, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True})
        ids[content] = tid
    assert len(pieces) + len(added_tokens) == vocab
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab_map, "merges": [f"{a} {b}" for a, b in merges]},
    }
    return tok, ids


# Chat templates of the real instruct checkpoints (Jinja), abridged only where noted.
LLADA_CHAT = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
              "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
              "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
              "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
DREAM_CHAT = ("{% if messages[0]['role'] != 'system' %}"  # Qwen2.5 ChatML without tool calls
              "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
              "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
              " + '<|im_end|>' + '\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLADA_MOE_CHAT = ("{% if messages[0]['role'] != 'system' %}"  # abridged: roles and markers only
                  "{{ '<role>SYSTEM</role>detailed thinking off<|role_end|>' }}{% endif %}"
                  "{% for message in messages %}{% set role = {'system': 'SYSTEM', 'user': 'HUMAN',"
                  " 'assistant': 'ASSISTANT'}[message['role']] %}"
                  "{{ '<role>' + role + '</role>' + message['content'] + '<|role_end|>' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}")


# ---------------------------------------------------------------------------------------------
# weights and configs
# ---------------------------------------------------------------------------------------------

def check_moe_args(a):
    if not 1 <= a.top_k <= a.experts:
        raise SystemExit("--top-k must be in [1, --experts]")
    if not 0 <= a.first_dense <= a.layers:
        raise SystemExit("--first-dense must be in [0, --layers]")


def add_swiglu(t, lin, prefix, inter, d):
    """The gate_proj / up_proj / down_proj weights of a SwiGLU FFN of width `inter` under `prefix`."""
    for proj, shape in (("gate_proj", (inter, d)), ("up_proj", (inter, d)), ("down_proj", (d, inter))):
        t[prefix + f"{proj}.weight"] = lin(*shape)


def build_llada_moe(a, rng, lin, norm, ids, kv, torch_dtype):
    """LLaDA-MoE tensors (in draw order), config.json and tokenizer_config.json."""
    d, f, V, hd, E = a.hidden, a.intermediate, a.vocab, a.hidden // a.heads, a.experts
    check_moe_args(a)
    freq = [0 if i < a.first_dense else 1 for i in range(a.layers)]
    t = {"model.embed_tokens.weight": rng.standard_normal((V, d)).astype(np.float32)}
    for i in range(a.layers):
        b = f"model.layers.{i}."
        t[b + "input_layernorm.weight"] = norm(d)
        t[b + "self_attn.q_proj.weight"] = lin(a.heads * hd, d)
        t[b + "self_attn.k_proj.weight"] = lin(kv * hd, d)
        t[b + "self_attn.v_proj.weight"] = lin(kv * hd, d)
        t[b + "self_attn.o_proj.weight"] = lin(d, a.heads * hd)
        if a.qk_norm:
            t[b + "self_attn.q_norm.weight"] = norm(hd)
            t[b + "self_attn.k_norm.weight"] = norm(hd)
        t[b + "post_attention_layernorm.weight"] = norm(d)
        if freq[i] == 0:
            add_swiglu(t, lin, b + "mlp.", f, d)
            continue
        t[b + "mlp.gate.weight"] = lin(E, d)
        for e in range(E):
            add_swiglu(t, lin, b + f"mlp.experts.{e}.", a.expert_inter, d)
        if a.shared_inter:
            add_swiglu(t, lin, b + "shared_expert.", a.shared_inter, d)
    t["model.norm.weight"] = norm(d)
    t["lm_head.weight"] = lin(V, d)
    cfg = {"architectures": ["LLaDAMoEModelLM"], "model_type": "lladamoe", "hidden_size": d,
           "dense_intermediate_size": f, "expert_intermediate_size": a.expert_inter,
           "shared_expert_intermediate_size": a.shared_inter or None, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": kv, "hidden_act": "silu",
           "max_position_embeddings": a.max_pos, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
           "partial_rotary_factor": a.partial_rotary, "rope_scaling": None, "attention_bias": False,
           "attention_dropout": 0.0, "clip_qkv": None, "num_experts": E, "num_experts_per_tok": a.top_k,
           "norm_topk_prob": bool(a.norm_topk), "qk_layernorm": bool(a.qk_norm), "moe_layer_freq": freq,
           "moe_router_enable_expert_bias": False, "moe_router_score_function": "softmax",
           "routed_scaling_factor": a.routed_scale, "router_aux_loss_coef": 0.01, "output_router_logits": False,
           "tie_word_embeddings": False, "vocab_size": V, "use_cache": False,
           "mask_token_id": ids["<|mask|>"], "eos_token_id": ids["<|endoftext|>"],
           "pad_token_id": ids["<|endoftext|>"], "bos_token_id": None, "torch_dtype": torch_dtype}
    tcfg = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
            "add_bos_token": False, "model_max_length": a.max_pos, "chat_template": LLADA_MOE_CHAT}
    return t, cfg, tcfg


def build_llada2(a, rng, lin, norm, ids, kv, torch_dtype):
    """LLaDA2.0 tensors (in draw order), config.json and tokenizer_config.json (LLaDA2.0-mini layout)."""
    d, f, V, hd, E = a.hidden, a.intermediate, a.vocab, a.hidden // a.heads, a.experts
    check_moe_args(a)
    if E % a.n_group or E // a.n_group < 2 or not 1 <= a.topk_group <= a.n_group:
        raise SystemExit("--n-group must divide --experts into groups of >= 2; --topk-group in [1, --n-group]")
    qkv = (a.heads + 2 * kv) * hd
    shared = a.shared_experts * a.expert_inter
    t = {"model.word_embeddings.weight": rng.standard_normal((V, d)).astype(np.float32)}
    for i in range(a.layers):
        b = f"model.layers.{i}."
        t[b + "input_layernorm.weight"] = norm(d)
        t[b + "attention.query_key_value.weight"] = lin(qkv, d)  # rows: q heads, then k heads, then v heads
        t[b + "attention.query_layernorm.weight"] = norm(hd)
        t[b + "attention.key_layernorm.weight"] = norm(hd)
        t[b + "attention.dense.weight"] = lin(d, a.heads * hd)
        t[b + "post_attention_layernorm.weight"] = norm(d)
        if i < a.first_dense:
            add_swiglu(t, lin, b + "mlp.", f, d)
            continue
        t[b + "mlp.gate.weight"] = lin(E, d)
        t[b + "mlp.gate.expert_bias"] = (a.bias_scale * rng.standard_normal(E)).astype(np.float32)
        for e in range(E):
            add_swiglu(t, lin, b + f"mlp.experts.{e}.", a.expert_inter, d)
        if shared:
            add_swiglu(t, lin, b + "mlp.shared_experts.", shared, d)
    t["model.norm.weight"] = norm(d)
    t["lm_head.weight"] = lin(V, d)
    # The field set of LLaDA2.0-mini's config.json; like the real one it names no mask or eos token
    # (LLaDA2MoeModelLM.generate takes mask_id / eos_id arguments: the tokenizer's <|mask|> and
    # <|endoftext|>).
    cfg = {"architectures": ["LLaDA2MoeModelLM"],
           "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
           "model_type": "llada2_moe", "attention_dropout": 0.0, "embedding_dropout": 0.0,
           "output_dropout": 0.0, "first_k_dense_replace": a.first_dense, "head_dim": hd, "hidden_act": "silu",
           "hidden_size": d, "initializer_range": 0.02, "intermediate_size": f,
           "max_position_embeddings": a.max_pos, "max_window_layers": a.layers,
           "moe_intermediate_size": a.expert_inter, "moe_router_enable_expert_bias": True,
           "n_group": a.n_group, "norm_head": False, "norm_topk_prob": True, "num_attention_heads": a.heads,
           "num_experts": E, "num_experts_per_tok": a.top_k, "num_hidden_layers": a.layers,
           "num_key_value_heads": kv, "num_shared_experts": a.shared_experts or None,
           "output_router_logits": False, "pad_token_id": ids["<|endoftext|>"],
           "partial_rotary_factor": a.partial_rotary, "rms_norm_eps": 1e-6, "rope_scaling": None,
           "rope_theta": 600000, "routed_scaling_factor": a.routed_scale, "router_dtype": "fp32",
           "score_function": "sigmoid", "tie_word_embeddings": False, "topk_group": a.topk_group,
           "torch_dtype": torch_dtype, "transformers_version": "4.52.3", "use_bias": False,
           "use_cache": False, "use_qk_norm": True, "use_qkv_bias": False, "use_rmsnorm": True,
           "use_sliding_window": False, "vocab_size": V}
    tcfg = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
            "add_bos_token": False, "model_max_length": a.max_pos, "chat_template": LLADA_MOE_CHAT}
    return t, cfg, tcfg


DG_OPTIONS = ("global_kv_heads", "global_head_dim", "sliding_window", "canvas_length", "sliding_per_full",
              "encoder_scalars", "no_vision")


def build(a):
    """Returns (tensors {name: float32}, config.json, tokenizer.json, tokenizer_config.json,
    generation_config.json, lora) for the parsed arguments; lora is None, or (adapter tensors,
    adapter_config.json) of nemotron's --nemotron-lora."""
    fam = a.family
    dg_only = [k for k in DG_OPTIONS if getattr(a, k) is not None]
    if fam != "diffusion_gemma" and dg_only:
        raise SystemExit(f"--{dg_only[0].replace('_', '-')} is a diffusion_gemma option")
    if fam not in ("nemotron", "diffusion_gemma") and a.hidden % a.heads:
        raise SystemExit("--hidden must be a multiple of --heads")
    if fam != "nemotron" and (a.nemotron_mscale or a.nemotron_lora or (a.head_dim and fam != "diffusion_gemma")):
        raise SystemExit("--head-dim, --nemotron-mscale and --nemotron-lora are nemotron options "
                         "(others: head_dim = hidden / heads, no LoRA)")
    if a.nemotron_lora < 0:
        raise SystemExit("--nemotron-lora R needs R > 0 (the LoRA rank)")
    if a.kv_heads:
        kv = a.kv_heads
    elif fam in ("llada", "llada_moe"):
        kv = a.heads
    elif fam == "llada2":
        kv = a.heads // 2 if a.heads % 2 == 0 else a.heads
    else:
        kv = 2 if a.heads % 2 == 0 else 1
    if a.heads % kv:
        raise SystemExit("--heads must be a multiple of --kv-heads")
    qkv_bias = (fam == "dream") if a.qkv_bias is None else a.qkv_bias
    if fam in ("llada_moe", "llada2", "nemotron") and qkv_bias:
        raise SystemExit(f"{fam}: q/k/v biases are not written (attention_bias / use_qkv_bias false)")
    d, f, V, hd = a.hidden, a.intermediate, a.vocab, a.hidden // a.heads
    rng = np.random.default_rng(a.seed)

    def lin(o, i):
        return rng.standard_normal((o, i)).astype(np.float32) / np.float32(np.sqrt(i))

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)

    tok, ids = make_tokenizer(fam, V)
    torch_dtype = "bfloat16" if a.dtype == "bf16" else "float32"
    t, lora, gen = {}, None, None
    if fam == "llada":
        p = "model.transformer."
        t[p + "wte.weight"] = rng.standard_normal((V, d)).astype(np.float32)
        for i in range(a.layers):
            b = f"{p}blocks.{i}."
            t[b + "attn_norm.weight"] = norm(d)
            t[b + "q_proj.weight"] = lin(a.heads * hd, d)
            t[b + "k_proj.weight"] = lin(kv * hd, d)
            t[b + "v_proj.weight"] = lin(kv * hd, d)
            if qkv_bias:
                t[b + "q_proj.bias"] = bias(a.heads * hd)
                t[b + "k_proj.bias"] = bias(kv * hd)
                t[b + "v_proj.bias"] = bias(kv * hd)
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
               "weight_tying": False, "include_bias": False, "include_qkv_bias": bool(qkv_bias),
               "mask_token_id": ids["<|mdm_mask|>"], "eos_token_id": ids["<|endoftext|>"],
               "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|startoftext|>"],
               "eot_token_id": ids["<|eot_id|>"], "torch_dtype": torch_dtype}
        tcfg = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                "mask_token": "<|mdm_mask|>", "add_bos_token": True, "add_eos_token": False,
                "model_max_length": a.max_pos, "chat_template": LLADA_CHAT}
    elif fam == "llada_moe":
        t, cfg, tcfg = build_llada_moe(a, rng, lin, norm, ids, kv, torch_dtype)
    elif fam == "llada2":
        t, cfg, tcfg = build_llada2(a, rng, lin, norm, ids, kv, torch_dtype)
    elif fam == "diffusion_gemma":
        t, cfg, tcfg, gen = tiny_diffusion_gemma.build_diffusion_gemma(a, rng, lin, norm, ids, torch_dtype)
    elif fam == "nemotron":
        a.head_dim = a.head_dim or 24
        t, cfg, tcfg = tiny_nemotron.build_nemotron(a, rng, lin, norm, ids, kv, torch_dtype)
        if a.nemotron_lora:
            lora = tiny_nemotron.build_lora(a, lin)  # after every base weight
    else:
        t["model.embed_tokens.weight"] = rng.standard_normal((V, d)).astype(np.float32)
        for i in range(a.layers):
            b = f"model.layers.{i}."
            t[b + "input_layernorm.weight"] = norm(d)
            t[b + "self_attn.q_proj.weight"] = lin(a.heads * hd, d)
            t[b + "self_attn.k_proj.weight"] = lin(kv * hd, d)
            t[b + "self_attn.v_proj.weight"] = lin(kv * hd, d)
            if qkv_bias:
                t[b + "self_attn.q_proj.bias"] = bias(a.heads * hd)
                t[b + "self_attn.k_proj.bias"] = bias(kv * hd)
                t[b + "self_attn.v_proj.bias"] = bias(kv * hd)
            t[b + "self_attn.o_proj.weight"] = lin(d, a.heads * hd)
            t[b + "post_attention_layernorm.weight"] = norm(d)
            add_swiglu(t, lin, b + "mlp.", f, d)
        t["model.norm.weight"] = norm(d)
        t["lm_head.weight"] = lin(V, d)
        cfg = {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_size": d,
               "intermediate_size": f, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
               "num_key_value_heads": kv, "vocab_size": V, "max_position_embeddings": a.max_pos,
               "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
               "hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False,
               "sliding_window": None, "attention_dropout": 0.0,
               "mask_token_id": ids["<|mask|>"], "pad_token_id": ids["<|endoftext|>"],
               "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"],
               "torch_dtype": torch_dtype}
        if not qkv_bias:
            cfg["attention_bias"] = False
        tcfg = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                "mask_token": "<|mask|>", "add_bos_token": False, "model_max_length": a.max_pos,
                "chat_template": DREAM_CHAT}
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    gen = gen or {"bos_token_id": cfg.get("bos_token_id"),
                  "eos_token_id": cfg.get("eos_token_id", ids.get("<|endoftext|>")),
                  "pad_token_id": cfg["pad_token_id"], "transformers_version": "4.46.0"}
    return t, cfg, tok, tcfg, gen, lora


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=["llada", "dream", "llada_moe", "llada2", "nemotron", "diffusion_gemma"],
                    required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0, help="default: heads (llada), 2 (dream, nemotron)")
    ap.add_argument("--intermediate", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=300)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--qkv-bias", dest="qkv_bias", action="store_true", default=None,
                    help="biases on q/k/v (default: on for dream, off for llada)")
    ap.add_argument("--no-qkv-bias", dest="qkv_bias", action="store_false")
    ap.add_argument("--experts", type=int, default=8, help="llada_moe: routed experts per MoE layer")
    ap.add_argument("--top-k", type=int, default=2, help="llada_moe: experts per token")
    ap.add_argument("--expert-inter", type=int, default=32, help="llada_moe: expert intermediate size")
    ap.add_argument("--first-dense", type=int, default=0, help="llada_moe: leading dense layers")
    ap.add_argument("--shared-inter", type=int, default=0, help="llada_moe: shared expert size (0 = none)")
    ap.add_argument("--norm-topk", action="store_true", help="llada_moe: norm_topk_prob true")
    ap.add_argument("--routed-scale", type=float, default=1.0, help="llada_moe: routed_scaling_factor")
    ap.add_argument("--partial-rotary", type=float, default=1.0, help="llada_moe: partial_rotary_factor")
    ap.add_argument("--no-qk-norm", dest="qk_norm", action="store_false", help="llada_moe: qk_layernorm false")
    ap.add_argument("--n-group", type=int, default=4, help="llada2: router groups")
    ap.add_argument("--topk-group", type=int, default=2, help="llada2: groups kept per token")
    ap.add_argument("--shared-experts", type=int, default=1, help="llada2: num_shared_experts (0 = none)")
    ap.add_argument("--bias-scale", type=float, default=0.1, help="llada2: expert_bias ~ N(0, scale^2)")
    ap.add_argument("--head-dim", type=int, default=0,
                    help="nemotron: explicit head_dim (default 24); diffusion_gemma: sliding layers' (default 16)")
    ap.add_argument("--nemotron-mscale", action="store_true", help="nemotron: mscale = mscale_all_dim = 1.0")
    ap.add_argument("--nemotron-lora", type=int, default=0, metavar="R",
                    help="nemotron: write the draft-only o_proj LoRA of rank R in linear_spec_lora/ (default: none)")
    ap.add_argument("--global-kv-heads", type=int, default=None, help="diffusion_gemma: full layers' kv heads (1)")
    ap.add_argument("--global-head-dim", type=int, default=None, help="diffusion_gemma: full layers' head_dim (32)")
    ap.add_argument("--sliding-window", type=int, default=None, help="diffusion_gemma: sliding_window (8)")
    ap.add_argument("--canvas-length", type=int, default=None, help="diffusion_gemma: canvas_length (8)")
    ap.add_argument("--sliding-per-full", type=int, default=None,
                    help="diffusion_gemma: sliding layers before each full one in layer_types (2)")
    ap.add_argument("--encoder-scalars", choices=["differ", "same"], default=None,
                    help="diffusion_gemma: encoder layer_scalar values other than the decoder's (default) or equal")
    ap.add_argument("--no-vision", action="store_const", const=True, default=None,
                    help="diffusion_gemma: write no vision tensors")
    a = ap.parse_args()
    if a.family == "diffusion_gemma":  # diffusiongemma-26B-A4B's shape in small (tiny_diffusion_gemma.py)
        for key, value in tiny_diffusion_gemma.DEFAULTS.items():
            if getattr(a, key) in (None, ap.get_default(key)):
                setattr(a, key, value)
        a.encoder_scalars = a.encoder_scalars or "differ"
        a.no_vision = bool(a.no_vision)
    if a.family == "llada2":  # LLaDA2.0-mini's shape in small: GQA, a dense first layer, half rotary
        for key, value in (("experts", 16), ("top_k", 3), ("first_dense", 1), ("routed_scale", 2.5),
                           ("partial_rotary", 0.5), ("layers", 3)):
            if getattr(a, key) == ap.get_default(key):
                setattr(a, key, value)

    t, cfg, tok, tcfg, gen, lora = build(a)
    os.makedirs(a.out, exist_ok=True)
    dt = "BF16" if a.dtype == "bf16" else "F32"
    names = list(t.keys())
    if a.shards <= 1:
        write_safetensors(os.path.join(a.out, "model.safetensors"), t, dt)
    else:
        if a.shards > len(names):
            raise SystemExit(f"--shards {a.shards} exceeds the {len(names)} tensors")
        # Contiguous runs of tensors, as evenly as possible; every shard gets at least one.
        bounds = [round(s * len(names) / a.shards) for s in range(a.shards + 1)]
        weight_map, total = {}, 0
        for s in range(a.shards):
            fn = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            part = {n: t[n] for n in names[bounds[s]:bounds[s + 1]]}
            total += write_safetensors(os.path.join(a.out, fn), part, dt)
            weight_map.update({n: fn for n in part})
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    for name, obj, ascii_only in (("config.json", cfg, True), ("tokenizer.json", tok, False),
                                  ("tokenizer_config.json", tcfg, True), ("generation_config.json", gen, True)):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=None if name == "tokenizer.json" else 2, ensure_ascii=ascii_only)
            fh.write("\n")
    if lora:
        lora_dir = os.path.join(a.out, tiny_nemotron.LORA_DIR)
        os.makedirs(lora_dir, exist_ok=True)
        write_safetensors(os.path.join(lora_dir, "adapter_model.safetensors"), lora[0], dt)
        with open(os.path.join(lora_dir, "adapter_config.json"), "w") as fh:
            json.dump(lora[1], fh, indent=2)
            fh.write("\n")
    print(f"wrote {a.out}: {a.family}, {sum(v.size for v in t.values())} parameters, "
          f"{a.shards if a.shards > 1 else 1} file(s), {dt}"
          + (f", LoRA rank {a.nemotron_lora} in {tiny_nemotron.LORA_DIR}/" if lora else ""))


if __name__ == "__main__":
    main()
