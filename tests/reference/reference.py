#!/usr/bin/env python3
"""Independent numpy forward pass and temperature-0 reference samplers for LLaDA, Dream and LLaDA-MoE.

Written from shared/specs/models.md and shared/specs/algorithms.md only (never from tessera's C++ code).
All math is fp32 (weights widened from bf16 exactly); sampler probabilities are computed in float64, as
LLaDA's reference code does. This file holds the model and the command line; the building blocks are in
ref_layers.py, the unmasking loops in ref_loops.py (both re-exported here).

  reference.py logits --model DIR --tokens 5,9,3 [--rows 0,2] --out FILE [--margins FILE2]
      Writes raw little-endian float32 logits [len(rows), vocab] (rows default: every position, in
      order; listed rows are written in the order given). Dream logits are already shifted.
      --margins: float32 [len(rows)], each row's smallest router margin over the MoE layers (k-th
      minus (k+1)-th router logit; inf for dense models): rows near a routing tie.
      --des seq|vote|off --des-rows LO,HI [--des-k 2] [--des-beta 0.4] [--des-scope block|all]
      [--des-stats FILE]: Dynamic Expert Sharing in every MoE layer (des_route); FILE receives per MoE
      layer [unique experts of all rows, of rows LO..HI-1, coreset size].
  reference.py generate --model DIR --prompt 5,9,3 --gen-length 16 --steps 8 --block-length 8
                        --alg low_confidence|entropy|maskgit_plus|topk_margin
      LLaDA2 checkpoints: the LLaDA2 loop instead (generate_llada2: blocks on the attention-block grid,
      --steps per block, --threshold 0.95); prints the canvas trimmed to prompt + gen-length.
      Temperature-0 sampler; prints JSON {"tokens": [...final canvas incl. prompt (and suffix)...],
      "order": [[positions unmasked at step 0], [step 1], ...]} (one sorted list per step that runs a
      forward; steps whose count is 0 run none and are not listed).
      --window W_EX,W_IN,REFRESH [--early-eos IDS]: Window-Diffusion (generate_window).
      --cache prefix|dual: Fast-dLLM KV cache (generate(cache=...)); --suffix IDS: infilling (canvas =
      prompt + masks + suffix; also with --window); --sparse [--sparse-block 32 --sparse-rho 0.5
      --sparse-skip 0.2]: SparseD over the whole generation (generate(sparse=...)); --cfg S:
      classifier-free guidance (low_confidence; with a cache or the window too); --des seq|vote [--des-k
      2] [--des-beta 0.4] [--des-scope block|all]: DES (MoE models; with the caches, the window, cfg);
      --logprobs: also "logprobs", per generated position the log-probability of its token under the
      logits of the forward that decided it. --sparse combines with --window (generate_window(sparse=...))
      and with --cfg. LLaDA2 (ref_combos.py): --window W_EX,W_IN,REFRESH (generate_llada2_window);
      --sparse [--cache prefix] (generate_llada2_sparse: SparseD per block; --cache prefix alone: the
      exact KV cache).
      --edit | --joint [--threshold 0.95 --edit-threshold 0.9 --max-post-steps 16 --min-transfer 1
      --edit-penalty 0 --no-eos-early-stop]: LLaDA2.1's joint-threshold loop with token editing (--joint:
      editing off; ref_editing.py; LLaDA2 block-causal or bidirectional by family; --steps unused);
      prints {"tokens", "order", "edits": [[order index, position, old, new], ...], "forwards"}.

Model (models.md): family from config.json model_type ("llada", "Dream"/"dream", or "lladamoe"/"llada_moe";
"llada" with num_experts and no d_model is LLaDA-MoE too).
  x = embed(tokens); per layer: h = x + o(Attn(RoPE(q(n)), RoPE(k(n)), v(n))), n = RMSNorm(x);
  x = h + down(silu(gate(m)) * up(m)), m = RMSNorm(h); logits = RMSNorm(x) @ head^T.
  - RMSNorm: x / sqrt(mean(x^2) + eps) * w, in fp32.
  - RoPE: rotate-half (NeoX) on absolute positions 0..L-1, inv_freq_i = theta^(-2i/head_dim);
    angles computed in float64 and rounded to fp32, then cos/sin in fp32.
    Config "rope_interleaved": true (tessera's llama2.c conversions) rotates pairs (2i, 2i+1) instead.
  - Attention: scale 1/sqrt(head_dim), GQA (kv head j serves query heads j*H/KV .. (j+1)*H/KV-1),
    bidirectional unless config "is_causal": true. Optional q/k/v biases (Dream; LLaDA include_qkv_bias).
  - LM head: untied, or the embedding when LLaDA "weight_tying" / Dream "tie_word_embeddings".
  - Dream logit shift: logits[i] = head(hidden[i-1]) for i >= 1, logits[0] = head(hidden[0]).
  - LLaDA-MoE: Dream-style names, no biases; qk-norm (qk_layernorm, default true): RMSNorm over each
    head's head_dim values of q and k (weights self_attn.q_norm / k_norm) before RoPE; RoPE on the first
    partial_rotary_factor * head_dim dims of each head (inv_freq over that rotary dim). FFN of a layer with
    moe_layer_freq[i] != 0 (default: every layer): p = softmax(m @ gate^T) in fp32; the top
    num_experts_per_tok experts by p (ties: lower expert id); weights w = p of those experts, NOT
    renormalised unless norm_topk_prob is true, times routed_scaling_factor (default 1);
    out = sum_e w_e * down_e(silu(gate_e(m)) * up_e(m)), plus shared_expert.* (a SwiGLU MLP on every
    row) when shared_expert_intermediate_size is set. moe_layer_freq[i] == 0: the dense mlp.* SwiGLU.

  - LLaDA2 (model_type "llada2_moe", models.md "LLaDA2.0-mini"): model.word_embeddings, fused
    attention.query_key_value (q heads, k heads, v heads), qk-norm (attention.query_layernorm /
    key_layernorm), attention.dense, RoPE on partial_rotary_factor (default 0.5) of each head;
    BLOCK-CAUSAL attention: key j visible to query i iff j // B <= i // B (logits --block B, default 32);
    layers < first_k_dense_replace: dense mlp.*; others: s = sigmoid(m @ gate^T), b = s + expert_bias,
    n_group groups scored by the sum of their top-2 b, topk_group groups kept, top-k experts by b
    inside them, weights s / (sum s + 1e-20) * routed_scaling_factor (UNBIASED s), plus
    mlp.shared_experts.* on every row. Margins: the smaller of the kept-group gap and the expert gap
    in b. Mask / EOS ids from config.json, else tokenizer.json's <|mask|> / <|endoftext|>.

Samplers (algorithms.md 1A/1B), temperature 0. The schedule follows the algorithm:
  - low_confidence: 1A. Blocks of --block-length (must divide gen-length; blocks must divide steps);
    per block n = #masked, step i unmasks n // S + (i < n % S) positions; confidence = softmax(L)[argmax].
  - entropy | maskgit_plus | topk_margin: 1B. ts = linspace(1, 1e-3, S + 1); step i unmasks
    k = int(#masked * (1 - ts[i+1]/ts[i])) positions (all of them on the last step); confidence =
    max prob | sum p log(p + 1e-10) | p1 - p2. With --block-length < gen-length the generation is split
    into blocks the same way as 1A (steps / blocks steps each) and 1B runs inside each block on that
    block's masked positions; with --block-length = gen-length (or 0) it is plain Dream over everything.
  - Candidates are only the masked positions of the current block (never prompt positions).
  - x0 = argmax of the logits; equal logits -> the lowest token id.
  - TIE-BREAKING: positions with equal confidence are ranked lower position first (a stable sort by
    descending confidence). The C++ sampler must do the same.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
from ref_layers import (  # noqa: E402,F401 (re-exported for selftest.py)
    rms_norm, rope_cos_sin, apply_rope, attention, sparse_patterns, shift_logits, silu, swiglu_mlp,
    route_margin, moe_route, sigmoid_group_route, moe_ffn, des_route)
from ref_loops import (  # noqa: E402,F401 (re-exported for selftest.py)
    softmax64, confidence, top_positions, llada_schedule, dream_count, log_softmax64, generate,
    generate_window, generate_llada2, des_setup, guided_logits)
from ref_combos import generate_llada2_window, generate_llada2_sparse  # noqa: E402,F401 (LLaDA2 combinations)
from ref_editing import (  # noqa: E402,F401 (re-exported for selftest.py)
    edit_step, penalised_logits, generate_llada21, generate_edit_bidirectional)


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

class Model:
    """A LLaDA, Dream or LLaDA-MoE checkpoint directory, loaded into fp32 numpy arrays."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.config = c
        w = safetensors_np.read_dir(model_dir)
        self.causal = bool(c.get("is_causal", False))
        self.interleaved = bool(c.get("rope_interleaved", False))
        mt = c["model_type"]
        self.moe = mt in ("lladamoe", "llada_moe") or (mt == "llada" and "num_experts" in c and "d_model" not in c)
        self.qk_norm = self.moe and c.get("qk_layernorm", True) is not False
        self.block = 0
        if mt == "llada2_moe":
            self._load_llada2(model_dir, c, w)
            return
        if self.moe:
            self.family, self.shift = "llada_moe", False
            d, nl, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
            KV = c.get("num_key_value_heads") or H
            self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-5)
            self.emb, self.norm_f = w["model.embed_tokens.weight"], w["model.norm.weight"]
            self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
            names = dict(an="input_layernorm", q="self_attn.q_proj", k="self_attn.k_proj",
                         v="self_attn.v_proj", o="self_attn.o_proj", fn="post_attention_layernorm")
            prefix = lambda i: f"model.layers.{i}."  # noqa: E731
        elif mt == "llada":
            self.family, self.shift = "llada", False
            d, nl, H = c["d_model"], c["n_layers"], c["n_heads"]
            KV = c.get("n_kv_heads") or H
            self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-5)
            p = "model.transformer."
            self.emb, self.norm_f = w[p + "wte.weight"], w[p + "ln_f.weight"]
            self.head = self.emb if c.get("weight_tying", False) else w[p + "ff_out.weight"]
            names = dict(an="attn_norm", q="q_proj", k="k_proj", v="v_proj", o="attn_out", fn="ff_norm",
                         g="ff_proj", u="up_proj", dn="ff_out")
            prefix = lambda i: f"{p}blocks.{i}."  # noqa: E731
        elif mt in ("Dream", "dream"):
            self.family, self.shift = "dream", True
            d, nl, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
            KV = c.get("num_key_value_heads") or H
            self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-6)
            self.emb, self.norm_f = w["model.embed_tokens.weight"], w["model.norm.weight"]
            self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
            names = dict(an="input_layernorm", q="self_attn.q_proj", k="self_attn.k_proj",
                         v="self_attn.v_proj", o="self_attn.o_proj", fn="post_attention_layernorm",
                         g="mlp.gate_proj", u="mlp.up_proj", dn="mlp.down_proj")
            prefix = lambda i: f"model.layers.{i}."  # noqa: E731
        else:
            raise SystemExit(f"unsupported model_type {mt!r}")
        if "mask_token_id" not in c:
            raise SystemExit("config.json has no mask_token_id")
        self.mask_id = int(c["mask_token_id"])
        self.layers = []
        for i in range(nl):
            b = prefix(i)
            ly = {key: w[b + n + ".weight"] for key, n in names.items()}
            for key in ("q", "k", "v"):
                ly["b" + key] = w.get(b + names[key] + ".bias")
            if self.moe:
                self._load_moe_layer(c, w, b, i, ly)
            self.layers.append(ly)
        self.d, self.H, self.KV = d, H, KV
        self.hd = c.get("head_dim") or d // H
        self.rotary_dim = int(round(self.hd * (c.get("partial_rotary_factor") or 1.0)))
        self.vocab = self.head.shape[0]

    def _load_llada2(self, model_dir, c, w):
        """LLaDA2.0 (models.md "LLaDA2.0-mini"): fused attention.query_key_value rows (H q heads, then KV
        k heads, then KV v heads), qk-norm (attention.query_layernorm / key_layernorm), RoPE on
        partial_rotary_factor (default 0.5) of each head, block-causal attention (block = the
        generation's block length, default 32), dense FFN below first_k_dense_replace, else the grouped
        sigmoid router with mlp.gate.expert_bias plus mlp.shared_experts (moe_intermediate_size *
        num_shared_experts). Mask / EOS ids: config.json, else tokenizer.json's <|mask|> / <|endoftext|>."""
        self.family, self.shift, self.moe, self.block = "llada2", False, True, 32
        d, nl, H, KV = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or d // H
        self.theta, self.eps = c.get("rope_theta", 10000.0), c.get("rms_norm_eps", 1e-5)
        self.emb, self.norm_f = w["model.word_embeddings.weight"], w["model.norm.weight"]
        self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
        self.qk_norm = c.get("use_qk_norm", True)
        specials = {}
        with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
            for t in json.load(f).get("added_tokens", []):
                specials[t["content"]] = t["id"]
        self.mask_id = int(c.get("mask_token_id", specials.get("<|mask|>", -1)))
        self.eos_id = int(c.get("eos_token_id", specials.get("<|endoftext|>", -1)))
        self.top_k, self.scale = c["num_experts_per_tok"], c.get("routed_scaling_factor", 2.5)
        self.n_group, self.topk_group = c.get("n_group", 8), c.get("topk_group", 4)
        mlp = lambda p: tuple(w[f"{p}{n}_proj.weight"] for n in ("gate", "up", "down"))  # noqa: E731
        self.layers = []
        for i in range(nl):
            b = f"model.layers.{i}."
            qkv = w[b + "attention.query_key_value.weight"]
            ly = {"an": w[b + "input_layernorm.weight"], "q": qkv[: H * hd], "k": qkv[H * hd:(H + KV) * hd],
                  "v": qkv[(H + KV) * hd:], "o": w[b + "attention.dense.weight"],
                  "fn": w[b + "post_attention_layernorm.weight"], "bq": None}
            if c.get("use_qkv_bias", False):
                bias = w[b + "attention.query_key_value.bias"]
                ly["bq"], ly["bk"], ly["bv"] = bias[: H * hd], bias[H * hd:(H + KV) * hd], bias[(H + KV) * hd:]
            if self.qk_norm:
                ly["qn"], ly["kn"] = w[b + "attention.query_layernorm.weight"], w[b + "attention.key_layernorm.weight"]
            if i < c.get("first_k_dense_replace", 0):
                ly["dense"] = mlp(b + "mlp.")
            else:
                ly["router"], ly["bias"] = w[b + "mlp.gate.weight"], w[b + "mlp.gate.expert_bias"]
                ly["experts"] = [mlp(f"{b}mlp.experts.{e}.") for e in range(c["num_experts"])]
                ly["shared"] = mlp(b + "mlp.shared_experts.") if c.get("num_shared_experts") else None
            self.layers.append(ly)
        self.d, self.H, self.KV, self.hd = d, H, KV, hd
        self.rotary_dim = int(round(hd * c.get("partial_rotary_factor", 0.5)))
        self.interleaved, self.causal = False, False
        self.vocab = self.head.shape[0]

    def _load_moe_layer(self, c, w, b, i, ly):
        """LLaDA-MoE: q/k norms and the FFN of layer i (experts + router, or the dense MLP)."""
        mlp = lambda p: tuple(w[f"{p}{n}_proj.weight"] for n in ("gate", "up", "down"))  # noqa: E731
        if self.qk_norm:
            ly["qn"], ly["kn"] = w[b + "self_attn.q_norm.weight"], w[b + "self_attn.k_norm.weight"]
        freq = c.get("moe_layer_freq") or [1] * c["num_hidden_layers"]
        if freq[i] == 0:
            ly["dense"] = mlp(b + "mlp.")
            return
        ly["router"] = w[b + "mlp.gate.weight"]
        ly["experts"] = [mlp(f"{b}mlp.experts.{e}.") for e in range(c["num_experts"])]
        ly["shared"] = mlp(b + "shared_expert.") if c.get("shared_expert_intermediate_size") else None
        self.top_k = c["num_experts_per_tok"]
        self.norm_topk = bool(c.get("norm_topk_prob") or False)
        self.scale = c.get("routed_scaling_factor") or 1.0

    def ffn(self, m, ly):
        """The FFN of one layer on the normed rows m (MoE layers also lower self.margins; with self.des
        set, DES routing, and self.des_stats receives the layer's counts)."""
        des = self.des_rows
        if "router" in ly and "bias" in ly:  # LLaDA2
            z = m @ ly["router"].T
            ids, wts, margin = sigmoid_group_route(z, ly["bias"], self.top_k, self.n_group,
                                                   self.topk_group, self.scale)
            self.margins = np.minimum(self.margins, margin)
            if des:
                s = (np.float32(1.0) / (np.float32(1.0) + np.exp(-z))).astype(np.float32)
                b = (s + ly["bias"][None, :]).astype(np.float32)

                def w_fn(ids_):
                    w = np.take_along_axis(s, ids_, axis=-1)
                    if self.top_k > 1:
                        w = w / (w.sum(axis=-1, keepdims=True) + np.float32(1e-20))
                    return (w * np.float32(self.scale)).astype(np.float32)
                ids, w2, st = des_route(z, s, b, ids, w_fn, des)
                wts = w2 if w2 is not None else wts
                self.des_stats.append(st)
            return moe_ffn(m, ly, self.top_k, ids_w=(ids, wts))
        if "router" in ly:
            z = m @ ly["router"].T
            self.margins = np.minimum(self.margins, route_margin(z, self.top_k))
            if des:
                ids, wts = moe_route(z, self.top_k, self.norm_topk, self.scale)
                zz = np.asarray(z, dtype=np.float32)
                s = np.exp(zz - zz.max(axis=-1, keepdims=True))
                s = (s / s.sum(axis=-1, keepdims=True)).astype(np.float32)

                def w_fn(ids_):
                    w = np.take_along_axis(s, ids_, axis=-1)
                    if self.norm_topk:
                        w = w / w.sum(axis=-1, keepdims=True)
                    return (w * np.float32(self.scale)).astype(np.float32)
                ids, w2, st = des_route(z, s, s, ids, w_fn, des)
                self.des_stats.append(st)
                return moe_ffn(m, ly, self.top_k, ids_w=(ids, w2 if w2 is not None else wts))
            return moe_ffn(m, ly, self.top_k, self.norm_topk, self.scale)
        if "dense" in ly:
            return swiglu_mlp(m, *ly["dense"])
        return swiglu_mlp(m, ly["g"], ly["u"], ly["dn"])

    def hidden(self, tokens, record=None, cached=None, record_q=None, patterns=None, sparse_block=0):
        """Final-norm hidden states [L, d] (before the LM head). record: a list that receives every
        layer's post-RoPE (K, V) of all rows. cached = (rows, kv): a KV-cache step, computing only the
        ascending rows `rows` (returns their hidden states); the other rows' K / V come from kv (a record
        of at least len(tokens) rows).
        With self.des set (DES), the rows decoded in parallel are the computed rows at canvas positions
        [des lo, des hi).
        record_q: a list that receives every layer's post-RoPE Q. patterns [layers, H, nqb, nkb] (SparseD
        tiles of sparse_block rows): attention sees only the kept tiles; a computed row at position p uses
        the pattern row p // sparse_block and key j the column j // sparse_block (also in a cached step)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.min() < 0 or tokens.max() >= self.emb.shape[0]:
            raise SystemExit("token id outside the vocabulary")
        pos = np.asarray(cached[0], dtype=np.int64) if cached else np.arange(len(tokens))
        n = len(pos)
        # DES: self.des's lo, hi are canvas positions; des_route votes with the computed rows inside them.
        des = getattr(self, "des", None)
        self.des_rows = dict(des, lo=int(np.searchsorted(pos, des["lo"])),
                             hi=int(np.searchsorted(pos, des["hi"]))) if des else None
        self.margins = np.full(n, np.inf, dtype=np.float32)  # smallest router margin of each row
        x = self.emb[tokens[pos]].astype(np.float32)
        for li, ly in enumerate(self.layers):
            h = rms_norm(x, ly["an"], self.eps)
            q, k, v = h @ ly["q"].T, h @ ly["k"].T, h @ ly["v"].T
            if ly["bq"] is not None:
                q, k, v = q + ly["bq"], k + ly["bk"], v + ly["bv"]
            q, k = q.reshape(n, self.H, self.hd), k.reshape(n, self.KV, self.hd)
            if "qn" in ly:
                q, k = rms_norm(q, ly["qn"], self.eps), rms_norm(k, ly["kn"], self.eps)
            q = apply_rope(q, pos, self.theta, self.interleaved, self.rotary_dim)
            k = apply_rope(k, pos, self.theta, self.interleaved, self.rotary_dim)
            v = v.reshape(n, self.KV, self.hd).astype(np.float32)
            if cached:
                k_all, v_all = cached[1][li][0][:len(tokens)].copy(), cached[1][li][1][:len(tokens)].copy()
                k_all[pos], v_all[pos] = k, v
                k, v = k_all, v_all
            if record is not None:
                record.append((k, v))
            if record_q is not None:
                record_q.append(q)
            keep = None
            if patterns is not None:
                tiles = (patterns[li] != 0)[:, pos // sparse_block]  # by position (uncached: pos = 0 .. n-1)
                keep = np.ascontiguousarray(tiles[:, :, np.arange(k.shape[0]) // sparse_block])
            att = attention(q, k, v, self.causal, self.block, pos, keep).reshape(n, self.H * self.hd)
            x = x + att @ ly["o"].T
            x = x + self.ffn(rms_norm(x, ly["fn"], self.eps), ly)
        return rms_norm(x, self.norm_f, self.eps)

    def forward(self, tokens):
        """Logits [L, vocab] in fp32 (Dream: shifted)."""
        logits = (self.hidden(tokens) @ self.head.T).astype(np.float32)
        return shift_logits(logits) if self.shift else logits


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def ids(s):
    return [int(t) for t in s.split(",") if t.strip()]


def main():
    ap = argparse.ArgumentParser(description="numpy reference for tessera (LLaDA / Dream / LLaDA-MoE)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("logits")
    a.add_argument("--model", required=True)
    a.add_argument("--tokens", required=True)
    a.add_argument("--rows", default="")
    a.add_argument("--out", required=True)
    a.add_argument("--margins", default="", help="also write each row's smallest router margin (f32)")
    a.add_argument("--block", type=int, default=32, help="LLaDA2: the attention block (generation block length)")
    a.add_argument("--cache-tokens", default="",
                   help="KV-cache step: the canvas whose full forward filled the cache (same length as --tokens)")
    a.add_argument("--compute", default="", help="KV-cache step: LO,HI, the rows of --tokens computed")
    a.add_argument("--compute-rows", default="", help="KV-cache step: the (ascending) rows of --tokens computed")
    a.add_argument("--sparse-patterns", default="",
                   help="SparseD: attend only to the kept tiles of this uint8 file [layers, H, nqb, nkb]")
    a.add_argument("--sparse-block", type=int, default=32, help="SparseD: the tile side")
    a.add_argument("--des", default="", help="DES: off | seq | vote (MoE models; des_route)")
    a.add_argument("--des-k", type=int, default=2, help="DES-Seq: experts per voting row in the union")
    a.add_argument("--des-beta", type=float, default=0.4, help="DES-Vote: coreset size floor(beta * E)")
    a.add_argument("--des-rows", default="", help="DES: LO,HI, the rows decoded in parallel")
    a.add_argument("--des-scope", default="block", help="DES: block | all")
    a.add_argument("--des-stats", default="", help="DES: write JSON [[unique, unique of voting rows, |C|], ...] per MoE layer")
    sp = sub.add_parser("patterns", help="SparseD patterns of every layer from the forward over --tokens")
    sp.add_argument("--model", required=True)
    sp.add_argument("--tokens", required=True)
    sp.add_argument("--block", type=int, required=True)
    sp.add_argument("--rho", type=float, required=True)
    sp.add_argument("--prompt-len", type=int, required=True)
    sp.add_argument("--out", required=True, help="uint8 [layers, H, nqb, nkb]")
    sp.add_argument("--clear", required=True, help="uint8 [layers, H, nqb]: 0 where the selection is a near tie")
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--gen-length", type=int, required=True)
    g.add_argument("--steps", type=int, default=None, help="required except with --edit / --joint")
    g.add_argument("--block-length", type=int, default=0)
    g.add_argument("--alg", default="low_confidence")
    g.add_argument("--threshold", type=float, default=0.95, help="LLaDA2, --edit, --joint: the confidence threshold")
    g.add_argument("--window", default="", help="Window-Diffusion: W_EX,W_IN,REFRESH (generate_window)")
    g.add_argument("--early-eos", default="", help="Window-Diffusion early stop at these token ids")
    g.add_argument("--cache", default="", help="KV cache (Fast-dLLM, algorithms.md 1D): prefix | dual")
    g.add_argument("--suffix", default="", help="infilling: token ids after the generated span")
    g.add_argument("--sparse", action="store_true", help="SparseD (algorithms.md 2) with the three below")
    g.add_argument("--sparse-block", type=int, default=32, help="SparseD: the tile side")
    g.add_argument("--sparse-rho", type=float, default=0.5, help="SparseD: the kept ratio of each key set")
    g.add_argument("--sparse-skip", type=float, default=0.2, help="SparseD: floor(steps * skip) exact forwards")
    g.add_argument("--logprobs", action="store_true",
                   help="also print \"logprobs\": per generated position, log_softmax of its deciding logits")
    g.add_argument("--cfg", type=float, default=0.0, help="classifier-free guidance scale (low_confidence)")
    g.add_argument("--des", default="", help="DES: seq | vote (MoE models)")
    g.add_argument("--des-k", type=int, default=2, help="DES-Seq: experts per voting row in the union")
    g.add_argument("--des-beta", type=float, default=0.4, help="DES-Vote: coreset size floor(beta * E)")
    g.add_argument("--des-scope", default="block", help="DES: block | all")
    g.add_argument("--edit", action="store_true", help="LLaDA2.1 joint threshold with token editing (ref_editing)")
    g.add_argument("--joint", action="store_true", help="the --edit loop with editing disabled (M2T only)")
    g.add_argument("--edit-threshold", type=float, default=0.9, help="--edit: T2T confidence threshold (strict >)")
    g.add_argument("--max-post-steps", type=int, default=16, help="--edit / --joint: post-fill forward cap")
    g.add_argument("--min-transfer", type=int, default=1, help="--edit / --joint: masks filled per step at least")
    g.add_argument("--edit-penalty", type=float, default=0.0, help="--edit / --joint: SGLang's 2-gram penalty lambda")
    g.add_argument("--no-eos-early-stop", action="store_true", help="--edit / --joint: decode every block")
    args = ap.parse_args()
    m = Model(args.model)
    if args.cmd == "patterns":
        qs, kv = [], []
        m.hidden(ids(args.tokens), record=kv, record_q=qs)
        out = [sparse_patterns(q, k, args.block, args.rho, args.prompt_len) for q, (k, _) in zip(qs, kv)]
        np.stack([o[0] for o in out]).tofile(args.out)
        np.stack([o[1] for o in out]).tofile(args.clear)
        return
    if args.cmd == "logits":
        if m.family == "llada2":
            m.block = args.block
        if args.des:
            lo, hi = ids(args.des_rows)
            E = m.config.get("num_experts")
            m.des = dict(mode=args.des, k=args.des_k, m=max(1, min(E, int(np.floor(args.des_beta * E)))),
                         lo=lo, hi=hi, scope=args.des_scope)
            m.des_stats = []
        toks = ids(args.tokens)
        rows = ids(args.rows)
        if args.cache_tokens:  # logits of positions `rows`, from a KV-cache step over rows [lo, hi)
            if args.compute_rows:
                comp = ids(args.compute_rows)
            else:
                lo, hi = ids(args.compute)
                comp = list(range(lo, hi))
            kv = []
            m.hidden(ids(args.cache_tokens), record=kv)
            H = m.hidden(toks, cached=(comp, kv))
            src = [max(r - 1, 0) if m.shift else r for r in rows]
            if any(r not in comp for r in src):
                raise SystemExit("a row's hidden state is outside the computed rows")
            L = (H[[comp.index(r) for r in src]] @ m.head.T).astype(np.float32)
            np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
            return
        if args.sparse_patterns:
            n, nb = len(toks), -(-len(toks) // args.sparse_block)
            pat = np.fromfile(args.sparse_patterns, dtype=np.uint8).reshape(len(m.layers), m.H, nb, nb)
            L = (m.hidden(toks, patterns=pat, sparse_block=args.sparse_block) @ m.head.T).astype(np.float32)
            L = shift_logits(L) if m.shift else L
        else:
            L = m.forward(toks)
        if rows:
            if min(rows) < 0 or max(rows) >= len(toks):
                raise SystemExit("row outside the token list")
            L = L[rows]
        np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
        if args.des_stats:
            with open(args.des_stats, "w") as f:
                json.dump(m.des_stats, f)
        if args.margins:
            mg = m.margins[rows] if rows else m.margins
            np.ascontiguousarray(mg, dtype="<f4").tofile(args.margins)
    elif args.edit or args.joint:  # LLaDA2.1 draft and edit (ref_editing.py)
        if args.edit and args.joint:
            raise SystemExit("--edit and --joint exclude each other (--joint = editing disabled)")
        if (args.cache or args.window or args.sparse or args.cfg or args.des or args.suffix or args.logprobs
                or args.early_eos):
            raise SystemExit("--edit / --joint: --cache, --window, --sparse, --cfg, --des, --suffix, --logprobs "
                             "and --early-eos are not supported")
        fn = generate_llada21 if m.family == "llada2" else generate_edit_bidirectional
        bl = args.block_length or (32 if m.family == "llada2" else 0)
        x, order, edits, forwards = fn(m, ids(args.prompt), args.gen_length, bl, args.threshold,
                                       args.edit_threshold, args.edit, args.max_post_steps, args.min_transfer,
                                       args.edit_penalty, not args.no_eos_early_stop)
        print(json.dumps({"tokens": x, "order": order, "edits": edits, "forwards": forwards}))
    else:
        if args.steps is None:
            raise SystemExit("generate: --steps is required (except with --edit / --joint)")
        lp = {} if args.logprobs else None
        prompt = ids(args.prompt)
        des = dict(mode=args.des, k=args.des_k, beta=args.des_beta, scope=args.des_scope) if args.des else None
        sparse = dict(block=args.sparse_block, rho=args.sparse_rho, skip=args.sparse_skip) if args.sparse else None
        if m.family == "llada2":  # ref_combos.py: --window, or --sparse and / or --cache prefix
            if (args.suffix or args.logprobs or args.cfg or des or args.cache not in ("", "prefix")
                    or (args.window and (args.sparse or args.cache or args.early_eos))):
                raise SystemExit("LLaDA2: --suffix, --cfg, --des and --logprobs are not supported, --cache is "
                                 "prefix only, --window not with --sparse, --cache or --early-eos")
            bl = args.block_length or 32
            if args.window:
                w_ex, w_in, refresh = ids(args.window)
                x, order = generate_llada2_window(m, prompt, args.gen_length, args.steps, bl, args.threshold,
                                                  w_ex, w_in, refresh)
            elif args.sparse or args.cache:
                x, order = generate_llada2_sparse(m, prompt, args.gen_length, args.steps, bl, args.threshold,
                                                  sparse, args.cache or None)
            else:
                x, order = generate_llada2(m, prompt, args.gen_length, args.steps, bl, args.threshold)
        elif args.window:
            if args.cache:
                raise SystemExit("--window does not combine with --cache")
            w_ex, w_in, refresh = ids(args.window)
            x, order = generate_window(m, prompt, args.gen_length, args.steps, args.block_length,
                                       args.alg, w_ex, w_in, refresh, tuple(ids(args.early_eos)), logprobs=lp,
                                       suffix=ids(args.suffix), cfg=args.cfg, des=des, sparse=sparse)
        else:
            if args.early_eos:
                raise SystemExit("--early-eos needs --window")
            x, order = generate(m, prompt, args.gen_length, args.steps, args.block_length, args.alg,
                                cache=args.cache or None, suffix=ids(args.suffix), sparse=sparse, logprobs=lp,
                                cfg=args.cfg, des=des)
        out = {"tokens": x, "order": order}
        if lp is not None:
            out["logprobs"] = [lp.get(p) for p in range(len(prompt), len(prompt) + args.gen_length)]
        print(json.dumps(out))


if __name__ == "__main__":
    main()
