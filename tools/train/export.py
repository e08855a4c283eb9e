#!/usr/bin/env python3
"""Writes a trained DiffusionLM as a Hugging Face model directory in the real layouts tessera loads.

  export.py --ckpt RUN/best.pt --data tools/train/data --out models/tessera-tiny [--max-shard-mb 14]

llada     -> config.json (model_type "llada", LLaDAModelLM field names), tensors model.transformer.*
llada_moe -> config.json (model_type "lladamoe", LLaDAMoEModelLM field names), tensors model.layers.*
nemotron  -> config.json (model_type "nemotron_labs_diffusion", NemotronLabsDiffusionModel field names,
             default RoPE, block_size), tensors encoder.* + diffusion_head (untied)
Both: bf16 safetensors written here (JSON header + raw little-endian bytes; no `safetensors` package
needed), sharded with model.safetensors.index.json when larger than --max-shard-mb, plus
tokenizer.json, tokenizer_config.json, generation_config.json. Also loads such a directory back
(load_model_dir) so that evaluation runs on exactly the exported weights.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/: the safetensors writer of make_tiny_checkpoint.py
from make_tiny_checkpoint import write_safetensors as write_safetensors_np  # noqa: E402


# ------------------------------------------------------------------------------------------ names
def nemotron_names(c):
    """(internal state_dict name, HF name) of every Nemotron-Labs-Diffusion tensor, in checkpoint order."""
    names = [("embed.weight", "encoder.embed_tokens.weight")]
    for i in range(c["n_layers"]):
        s, b = f"layers.{i}.", f"encoder.layers.{i}."
        names.append((s + "attn_norm.weight", b + "input_layernorm.weight"))
        names += [(s + f"attn.w{x}.weight", b + f"self_attn.{x}_proj.weight") for x in "qkvo"]
        names.append((s + "ffn_norm.weight", b + "post_attention_layernorm.weight"))
        names += [(s + f"ffn.{w}.weight", b + f"mlp.{n}.weight")
                  for w, n in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj"))]
    return names + [("final_norm.weight", "encoder.norm.weight"), ("lm_head.weight", "diffusion_head.weight")]


def hf_tensors(model):
    """{HF name: float32 tensor} in the family's real layout."""
    c, sd = model.c, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    t = {}
    if c["arch"] == "llada":
        p = "model.transformer."
        t[p + "wte.weight"] = sd["embed.weight"]
        for i in range(c["n_layers"]):
            s, b = f"layers.{i}.", f"{p}blocks.{i}."
            t[b + "attn_norm.weight"] = sd[s + "attn_norm.weight"]
            t[b + "q_proj.weight"] = sd[s + "attn.wq.weight"]
            t[b + "k_proj.weight"] = sd[s + "attn.wk.weight"]
            t[b + "v_proj.weight"] = sd[s + "attn.wv.weight"]
            t[b + "attn_out.weight"] = sd[s + "attn.wo.weight"]
            t[b + "ff_norm.weight"] = sd[s + "ffn_norm.weight"]
            t[b + "ff_proj.weight"] = sd[s + "ffn.w_gate.weight"]
            t[b + "up_proj.weight"] = sd[s + "ffn.w_up.weight"]
            t[b + "ff_out.weight"] = sd[s + "ffn.w_down.weight"]
        t[p + "ln_f.weight"] = sd["final_norm.weight"]
        t[p + "ff_out.weight"] = sd["lm_head.weight"]
    elif c["arch"] == "nemotron":
        t = {hf: sd[mine] for mine, hf in nemotron_names(c)}
    else:
        t["model.embed_tokens.weight"] = sd["embed.weight"]
        for i in range(c["n_layers"]):
            s, b = f"layers.{i}.", f"model.layers.{i}."
            t[b + "input_layernorm.weight"] = sd[s + "attn_norm.weight"]
            for x in "qkv":
                t[b + f"self_attn.{x}_proj.weight"] = sd[s + f"attn.w{x}.weight"]
            t[b + "self_attn.o_proj.weight"] = sd[s + "attn.wo.weight"]
            if c.get("qk_norm", True):
                t[b + "self_attn.q_norm.weight"] = sd[s + "attn.q_norm.weight"]
                t[b + "self_attn.k_norm.weight"] = sd[s + "attn.k_norm.weight"]
            t[b + "post_attention_layernorm.weight"] = sd[s + "ffn_norm.weight"]
            t[b + "mlp.gate.weight"] = sd[s + "ffn.gate.weight"]
            for e in range(c["n_experts"]):
                t[b + f"mlp.experts.{e}.gate_proj.weight"] = sd[s + "ffn.w_gate"][e].clone()
                t[b + f"mlp.experts.{e}.up_proj.weight"] = sd[s + "ffn.w_up"][e].clone()
                t[b + f"mlp.experts.{e}.down_proj.weight"] = sd[s + "ffn.w_down"][e].clone()
        t["model.norm.weight"] = sd["final_norm.weight"]
        t["lm_head.weight"] = sd["lm_head.weight"]
    return t


def from_hf_tensors(c, t):
    """Inverse of hf_tensors: {internal state_dict name: tensor}."""
    sd = {}
    if c["arch"] == "llada":
        p = "model.transformer."
        sd["embed.weight"] = t[p + "wte.weight"]
        for i in range(c["n_layers"]):
            s, b = f"layers.{i}.", f"{p}blocks.{i}."
            for mine, theirs in (("attn_norm.weight", "attn_norm"), ("attn.wq.weight", "q_proj"),
                                 ("attn.wk.weight", "k_proj"), ("attn.wv.weight", "v_proj"),
                                 ("attn.wo.weight", "attn_out"), ("ffn_norm.weight", "ff_norm"),
                                 ("ffn.w_gate.weight", "ff_proj"), ("ffn.w_up.weight", "up_proj"),
                                 ("ffn.w_down.weight", "ff_out")):
                sd[s + mine] = t[b + theirs + ".weight"]
        sd["final_norm.weight"] = t[p + "ln_f.weight"]
        sd["lm_head.weight"] = t[p + "ff_out.weight"]
    elif c["arch"] == "nemotron":
        sd = {mine: t[hf] for mine, hf in nemotron_names(c)}
    else:
        sd["embed.weight"] = t["model.embed_tokens.weight"]
        for i in range(c["n_layers"]):
            s, b = f"layers.{i}.", f"model.layers.{i}."
            sd[s + "attn_norm.weight"] = t[b + "input_layernorm.weight"]
            for x in "qkvo":
                sd[s + f"attn.w{x}.weight"] = t[b + f"self_attn.{x}_proj.weight"]
            if c.get("qk_norm", True):
                sd[s + "attn.q_norm.weight"] = t[b + "self_attn.q_norm.weight"]
                sd[s + "attn.k_norm.weight"] = t[b + "self_attn.k_norm.weight"]
            sd[s + "ffn_norm.weight"] = t[b + "post_attention_layernorm.weight"]
            sd[s + "ffn.gate.weight"] = t[b + "mlp.gate.weight"]
            for w, n in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
                sd[s + f"ffn.{w}"] = torch.stack([t[b + f"mlp.experts.{e}.{n}.weight"]
                                                  for e in range(c["n_experts"])])
        sd["final_norm.weight"] = t["model.norm.weight"]
        sd["lm_head.weight"] = t["lm_head.weight"]
    return sd


# ------------------------------------------------------------------------------------------ configs
def hf_config(c, meta):
    ids = {"mask_token_id": meta["mask_token_id"], "eos_token_id": meta["eos_token_id"],
           "pad_token_id": meta["pad_token_id"], "bos_token_id": meta["bos_token_id"]}
    if c["arch"] == "llada":
        return {"architectures": ["LLaDAModelLM"], "model_type": "llada", "activation_type": "silu",
                "alibi": False, "block_type": "llama", "layer_norm_type": "rms", "rope": True,
                "attention_layer_norm": False, "include_bias": False, "include_qkv_bias": False,
                "d_model": c["d_model"], "n_layers": c["n_layers"], "n_heads": c["n_heads"],
                "n_kv_heads": c["n_kv_heads"], "mlp_hidden_size": c["mlp_hidden"],
                "mlp_ratio": round(c["mlp_hidden"] / c["d_model"], 4),
                "vocab_size": c["vocab_size"], "embedding_size": c["vocab_size"],
                "max_sequence_length": c["max_seq_len"], "rope_theta": float(c["rope_theta"]),
                "rms_norm_eps": c["rms_norm_eps"], "weight_tying": False, **ids,
                "torch_dtype": "bfloat16", "use_cache": False}
    if c["arch"] == "nemotron":
        return {"architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
                "hidden_size": c["d_model"], "intermediate_size": c["mlp_hidden"],
                "num_hidden_layers": c["n_layers"], "num_attention_heads": c["n_heads"],
                "num_key_value_heads": c["n_kv_heads"], "head_dim": c["head_dim"],
                "vocab_size": c["vocab_size"], "rms_norm_eps": c["rms_norm_eps"], "hidden_act": "silu",
                "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
                "max_position_embeddings": c["max_seq_len"],
                "rope_parameters": {"rope_type": "default", "rope_theta": float(c["rope_theta"])},
                **ids, "block_size": c["block_size"], "dlm_paradigm": "bidirectional",
                "torch_dtype": "bfloat16", "use_cache": False}
    return {"architectures": ["LLaDAMoEModelLM"], "model_type": "lladamoe",
            "hidden_size": c["d_model"], "num_hidden_layers": c["n_layers"],
            "num_attention_heads": c["n_heads"], "num_key_value_heads": c["n_kv_heads"],
            "head_dim": c["head_dim"], "expert_intermediate_size": c["expert_hidden"],
            "intermediate_size": c["expert_hidden"], "moe_intermediate_size": c["expert_hidden"],
            "num_experts": c["n_experts"], "num_experts_per_tok": c["top_k"],
            "num_shared_experts": 0, "norm_topk_prob": False, "qk_layernorm": c.get("qk_norm", True),
            "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": False,
            "routed_scaling_factor": 1.0, "partial_rotary_factor": 1.0, "hidden_act": "silu",
            "rope_theta": float(c["rope_theta"]), "rope_scaling": None, "rms_norm_eps": c["rms_norm_eps"],
            "max_position_embeddings": c["max_seq_len"], "vocab_size": c["vocab_size"],
            "tie_word_embeddings": False, "attention_bias": False, **ids,
            "torch_dtype": "bfloat16", "use_cache": False}


def generation_config(meta, gen_length=64, block_length=32):
    return {"bos_token_id": meta["bos_token_id"], "eos_token_id": meta["eos_token_id"],
            "pad_token_id": meta["pad_token_id"], "mask_token_id": meta["mask_token_id"],
            "gen_length": gen_length, "steps": gen_length, "block_length": block_length,
            "alg": "low_confidence", "temperature": 0.0}


# ------------------------------------------------------------------------------------------ files
def write_safetensors(path, tensors):
    """bf16 safetensors of float tensors, in the order given (the writer of tools/make_tiny_checkpoint.py:
    round to nearest even, an 8-byte-aligned JSON header); returns the number of data bytes."""
    return write_safetensors_np(path, {k: t.detach().float().cpu().numpy() for k, t in tensors.items()}, "BF16")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        if h["dtype"] == "BF16":
            u = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif h["dtype"] == "F32":
            arr = np.frombuffer(data[a:b], dtype="<f4")
        else:
            raise ValueError(f"{path}: dtype {h['dtype']} not handled")
        out[name] = torch.from_numpy(arr.reshape(h["shape"]).copy())
    return out


def write_model_dir(model, data_dir, out, max_shard_mb=14.0, gen_length=64, block_length=32):
    c = model.c
    with open(os.path.join(data_dir, "tokens", "meta.json")) as f:
        meta = json.load(f)
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out, fn))
    t = hf_tensors(model)
    limit = int(max_shard_mb * 1e6)
    shards, cur, size = [], {}, 0
    for name, x in t.items():
        nb = x.numel() * 2
        if cur and size + nb > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = x
        size += nb
    shards.append(cur)
    files = []
    if len(shards) == 1:
        write_safetensors(os.path.join(out, "model.safetensors"), shards[0])
        files.append("model.safetensors")
    else:
        weight_map, total = {}, 0
        for s, part in enumerate(shards):
            fn = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
            total += write_safetensors(os.path.join(out, fn), part)
            weight_map.update({n: fn for n in part})
            files.append(fn)
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(c, meta), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(generation_config(meta, gen_length, block_length), f, indent=2)
        f.write("\n")
    shutil.copyfile(os.path.join(data_dir, "tokenizer", "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(data_dir, "tokenizer", "tokenizer_config.json")) as f:
        tc = json.load(f)
    tc["model_max_length"] = c["max_seq_len"]
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
        f.write("\n")
    # the training-side hyper-parameters, for load_model_dir and the model card
    return files


def model_config_from_hf(cfg):
    """Internal config dict from an exported config.json."""
    if cfg["model_type"] == "llada":
        d, H = cfg["d_model"], cfg["n_heads"]
        return {"arch": "llada", "d_model": d, "n_layers": cfg["n_layers"], "n_heads": H,
                "n_kv_heads": cfg.get("n_kv_heads", H), "head_dim": d // H,
                "mlp_hidden": cfg["mlp_hidden_size"], "vocab_size": cfg["embedding_size"],
                "max_seq_len": cfg["max_sequence_length"], "rope_theta": cfg["rope_theta"],
                "rms_norm_eps": cfg["rms_norm_eps"], "qk_norm": False}
    if cfg["model_type"] == "nemotron_labs_diffusion":
        return {"arch": "nemotron", "d_model": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"],
                "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg["num_key_value_heads"],
                "head_dim": cfg["head_dim"], "mlp_hidden": cfg["intermediate_size"], "vocab_size": cfg["vocab_size"],
                "max_seq_len": cfg["max_position_embeddings"], "rope_theta": cfg["rope_parameters"]["rope_theta"],
                "rms_norm_eps": cfg["rms_norm_eps"], "qk_norm": False, "block_size": cfg["block_size"]}
    return {"arch": "llada_moe", "d_model": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"],
            "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg["num_key_value_heads"],
            "head_dim": cfg["head_dim"], "expert_hidden": cfg["expert_intermediate_size"],
            "n_experts": cfg["num_experts"], "top_k": cfg["num_experts_per_tok"],
            "vocab_size": cfg["vocab_size"], "max_seq_len": cfg["max_position_embeddings"],
            "rope_theta": cfg["rope_theta"], "rms_norm_eps": cfg["rms_norm_eps"],
            "qk_norm": cfg.get("qk_layernorm", True)}


def load_model_dir(path, device="cpu"):
    """DiffusionLM with the (bf16) weights of an exported directory, in float32."""
    from model import DiffusionLM
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    c = model_config_from_hf(cfg)
    files = [f for f in sorted(os.listdir(path)) if f.endswith(".safetensors")]
    t = {}
    for fn in files:
        t.update(read_safetensors(os.path.join(path, fn)))
    m = DiffusionLM(c)
    m.load_state_dict(from_hf_tensors(c, t), strict=True)
    return m.to(device).eval()


def main():
    import sys
    sys.path.insert(0, HERE)
    from model import DiffusionLM
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True, help="a checkpoint written by train.py (best.pt / last.pt)")
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-shard-mb", type=float, default=14.0)
    a = ap.parse_args()
    ck = torch.load(a.ckpt, map_location="cpu")
    m = DiffusionLM(ck["config"])
    m.load_state_dict(ck["model"])
    files = write_model_dir(m, a.data, a.out, a.max_shard_mb)
    print(f"export: {a.out}: {', '.join(files)}")


if __name__ == "__main__":
    main()
