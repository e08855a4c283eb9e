#!/usr/bin/env python3
"""Numpy reference for Nemotron-Labs-Diffusion (NVIDIA; Ministral-3 backbone): the fp32 forward pass with
its two attention modes and the three temperature-0 decoding loops (AR, block diffusion, linear
self-speculation), written from shared/specs/nemotron-labs-diffusion.md only (never from tessera's C++
code). Checkpoints: tools/make_tiny_checkpoint.py --family nemotron. Checks: selftest_nemotron.py.

  ref_nemotron.py logits --model DIR --tokens 5,9,3 [--rows 0,2] [--bidir-from N] [--lora] --out FILE
      Raw little-endian float32 logits [len(rows), vocab] (rows default: every position, in order; listed
      rows in the order given). --bidir-from defaults to the number of tokens (a plain causal pass).
      --lora: the draft rows (>= --bidir-from) use the checkpoint's linear_spec_lora/ adapter (an error
      when it has none); a causal pass has no draft rows, so --lora leaves it unchanged.
  ref_nemotron.py generate --model DIR --prompt 5,9,3 --gen-length N --mode ar|diffusion|spec
                           [--block-length 32] [--threshold T] [--eos ID] [--no-lora] [--check-ar]
                           [--out FILE.json]
      Writes {"tokens": [N generated ids, the mask id where never decided], "trace": [...], "forwards": n}
      (stdout without --out). --threshold defaults to 0.9 (diffusion) and 0.0 (spec). --check-ar (spec):
      exit 1 unless the tokens equal ar's for the same prompt and N (temperature 0 is lossless). spec's
      draft passes use the linear_spec_lora/ adapter whenever the checkpoint has one (--no-lora: never);
      prefill and verify never do, nor do ar and diffusion.

Forward (fp32; weights widened from bf16 exactly; positions 0..n-1):
  x = embed[tokens]; per layer: h = RMSNorm(x) (eps rms_norm_eps); q, k, v = h W^T (head_dim explicit,
  q_proj out = heads * head_dim may differ from hidden); RoPE rotate-half (pairs (i, i + hd/2)) with the
  YaRN table below, cos and sin both times attention_factor; q *= 1 + beta ln(1 + floor(pos / orig_max))
  after RoPE (llama_4_scaling_beta; q only); GQA attention, scale 1/sqrt(head_dim); x += attn Wo^T;
  m = RMSNorm(x); x += down(silu(gate(m)) * up(m)); logits = RMSNorm(x) diffusion_head^T.
  Draft-only LoRA (spec section 2; PEFT folder linear_spec_lora/: adapter_config.json and
  adapter_model.safetensors with base_model.model.encoder.layers.i.self_attn.o_proj.lora_{A,B}.weight,
  A [r, heads * head_dim], B [hidden, r]; target_modules must be o_proj only): when on, the draft rows'
  (>= bidir_from) o_proj output gets + scale (attn A^T) B^T, scale = lora_alpha / r (lora_alpha / sqrt(r)
  with use_rslora). The rows before bidir_from are the causal KV cache, written with the adapter off, so
  they never get it. Only spec's draft passes turn it on.
  YaRN as transformers' _compute_yarn_parameters: pos_freqs = theta^(arange(0, hd, 2) / hd), extrapolation
  1 / pos_freqs, interpolation 1 / (factor pos_freqs); find_correction_dim(r) = hd ln(orig / (2 pi r)) /
  (2 ln theta); low = floor(fcd(beta_fast)), high = ceil(fcd(beta_slow)) (no rounding with "truncate":
  false), clamped to [0, hd - 1]; ramp = clip((i - low) / (high - low), 0, 1) over i < hd / 2 (high +=
  0.001 when equal); extra = 1 - ramp; inv_freq = interp (1 - extra) + extrap extra. Table in float64,
  rounded to fp32 once; angles = fp32(pos) * inv_freq in fp32, cos / sin in fp32.
  attention_factor: "attention_factor" if set, else get_mscale(factor, mscale) / get_mscale(factor,
  mscale_all_dim) when both are set and non-zero, else get_mscale(factor); get_mscale(s, m=1) = 1 if s
  <= 1 else 0.1 m ln(s) + 1. factor missing: max_position_embeddings / orig_max. rope_type "default"
  (or no rope_parameters): plain theta^(-2i/hd), attention_factor 1.
  Mask (logits(tokens, bidir_from=b)): row i sees keys j <= i when i < b, every key when i >= b. b = n:
  causal (prefill, AR step, verify, block commit); b = c: the draft pass of a block starting at c (the
  rows before c are the causal KV cache); b = 0: fully bidirectional. Causal row i predicts position i + 1,
  draft row i predicts position i (no shift).

Loops (temperature 0; the canvas is the prompt's P tokens + N positions; blocks clipped at P + N):
  token = argmax of the fp32 logits (lowest id on ties; the mask id is NOT excluded, as the HF remote
  code); confidence = float64 softmax probability of that token. A separate decided flag per position: a
  position decided to the mask id counts as decided. Threshold rule (draft passes): rank the block's
  undecided positions by confidence, descending, ties to the lower position; decide the first always and
  every other with conf >= threshold.
  trace: one entry per forward {"kind": "causal" | "draft" | "verify", "rows": [lo, hi) the engine
  computes, "decided": [[pos, token], ...] ascending}.
  ar: a causal pass over the prompt (rows [0, P)) decides P from row P - 1; then for p = P+1 .. P+N-1 a
    causal pass (rows [p-1, p), the rest cached) decides p from row p - 1. N forwards.
  diffusion: the prompt's causal pass decides P (the seed, slot 0 of block 0). Block b = [c, e) = [P + bB,
    P + (b+1)B) clipped: draft passes (bidir_from c, over x[:e], rows [c, e)) until every position is
    decided; then, unless it is the last block, a causal pass over x[:e] (rows [c, e)) decides the next
    block's seed at e from row e - 1.
  spec (spec 4c): the prompt's causal pass decides P, the seed. Loop, seed at c (its K/V not yet
    written): e = min(c + B, P + N); stop if e == c + 1. Draft passes over x[:e] (bidir_from c; with the
    LoRA when the checkpoint has one, unless --no-lora) until (c, e) is filled (threshold 0: one pass).
    Verify: a causal pass over x[:e] (rows [c, e)), ar[i] = argmax of row c + i; a = 1 + the longest run
    i = 0.. with c + i + 1 < e and ar[i] == x[c + i + 1], capped at c + a <= P + N - 1; positions c+1 ..
    c+a take ar[0 .. a-1] (traced as the verify's decisions), the other drafts go back to mask; the next
    seed is c + a. Drafts are tentative: EOS is checked only after causal and verify passes.
  EOS (--eos): stop as soon as the positions from P up to and including the first EOS are all decided;
  the positions after that EOS are reported as the mask id.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
from ref_layers import rms_norm, silu  # noqa: E402
from ref_loops import softmax64  # noqa: E402

LORA_DIR = "linear_spec_lora"  # the draft-only adapter's subfolder (spec section 2)


# ---------------------------------------------------------------------------------------------
# RoPE: YaRN table, attention factor, Llama-4 query scale
# ---------------------------------------------------------------------------------------------

def get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_parameters(rope, head_dim, max_position_embeddings=None):
    """(inv_freq float64 [head_dim / 2], attention_factor) of a rope_parameters dict with rope_type yarn."""
    base, dim = float(rope["rope_theta"]), int(head_dim)
    orig = rope["original_max_position_embeddings"]
    factor = rope.get("factor")
    if factor is None:
        factor = max_position_embeddings / orig
    attention_factor = rope.get("attention_factor")
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extra = 1.0 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1.0 - extra) + (1.0 / pos_freqs) * extra
    return inv, float(attention_factor)


def rope_table(config, head_dim):
    """(inv_freq float32 [head_dim / 2], attention_factor float32, rope dict) from config.json."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "yarn":
        inv, af = yarn_parameters(rope, head_dim, config.get("max_position_embeddings"))
    elif kind == "default":
        inv, af = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, head_dim, 2) / head_dim)), 1.0
    else:
        raise SystemExit(f"rope_type {kind!r} is not supported (yarn, default)")
    return inv.astype(np.float32), np.float32(af), rope


def llama4_scale(positions, beta, orig_max):
    """1 + beta ln(1 + floor(pos / orig_max)) per position, fp32 (exactly 1 below orig_max)."""
    p = np.asarray(positions, dtype=np.int64)
    return (1.0 + beta * np.log1p(np.floor_divide(p, orig_max).astype(np.float64))).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# draft-only LoRA (PEFT)
# ---------------------------------------------------------------------------------------------

def load_lora(lora_dir, layers):
    """(scale, [(A [r, in], B [out, r]) or None per layer]) of a PEFT LoRA folder on o_proj; scale = lora_alpha
    / r, or lora_alpha / sqrt(r) with use_rslora. Refuses other target modules and unknown tensors."""
    with open(os.path.join(lora_dir, "adapter_config.json")) as f:
        c = json.load(f)
    if c.get("peft_type", "LORA") != "LORA":
        raise SystemExit(f"{lora_dir}: peft_type {c.get('peft_type')!r} is not supported (LORA)")
    mods = c.get("target_modules")
    mods = [mods] if isinstance(mods, str) else list(mods or [])
    if not mods or any(t.split(".")[-1] != "o_proj" for t in mods):
        raise SystemExit(f"{lora_dir}: target_modules {c.get('target_modules')!r} is not supported: the draft "
                         "LoRA of linear self-speculation targets o_proj only")
    if c.get("rank_pattern") or c.get("alpha_pattern"):
        raise SystemExit(f"{lora_dir}: rank_pattern / alpha_pattern are not supported")
    r, alpha = int(c["r"]), float(c.get("lora_alpha", c["r"]))
    scale = alpha / math.sqrt(r) if c.get("use_rslora") else alpha / r
    w = safetensors_np.read_file(os.path.join(lora_dir, "adapter_model.safetensors"))
    out = []
    for i in range(layers):
        b = f"base_model.model.encoder.layers.{i}.self_attn.o_proj."
        a_w, b_w = w.pop(b + "lora_A.weight", None), w.pop(b + "lora_B.weight", None)
        if (a_w is None) != (b_w is None):
            raise SystemExit(f"{lora_dir}: layer {i} has only one of lora_A / lora_B")
        if a_w is not None and (a_w.shape[0] != r or b_w.shape[1] != r):
            raise SystemExit(f"{lora_dir}: layer {i}: lora_A {a_w.shape}, lora_B {b_w.shape} for r = {r}")
        out.append(None if a_w is None else (a_w, b_w))
    if w:
        raise SystemExit(f"{lora_dir}: unexpected tensors {sorted(w)[:3]} (o_proj lora_A / lora_B only)")
    return scale, out


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

class NemotronModel:
    """A Nemotron-Labs-Diffusion checkpoint directory in fp32 numpy arrays; lora = (scale, per-layer (A, B) or
    None) of its linear_spec_lora/ folder, None without one."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.config = c
        w = safetensors_np.read_dir(model_dir)
        self.H, self.d = c["num_attention_heads"], c["hidden_size"]
        self.KV = c.get("num_key_value_heads") or self.H
        self.hd = c.get("head_dim") or self.d // self.H
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.mask_id = c["mask_token_id"]
        self.eos_id = c.get("eos_token_id")
        self.inv_freq, self.attn_factor, rope = rope_table(c, self.hd)
        self.beta = float(rope.get("llama_4_scaling_beta") or 0.0)
        self.orig_max = int(rope.get("original_max_position_embeddings") or c.get("max_position_embeddings"))
        self.emb, self.norm_f = w["encoder.embed_tokens.weight"], w["encoder.norm.weight"]
        self.head = self.emb if c.get("tie_word_embeddings", False) else w["diffusion_head.weight"]
        self.V = self.head.shape[0]
        self.layers = []
        for i in range(c["num_hidden_layers"]):
            b = f"encoder.layers.{i}."
            self.layers.append({k: w[b + n + ".weight"] for k, n in (
                ("an", "input_layernorm"), ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"),
                ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"), ("fn", "post_attention_layernorm"),
                ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"))})
        self.lora = None
        if os.path.isdir(os.path.join(model_dir, LORA_DIR)):
            scale, ab = load_lora(os.path.join(model_dir, LORA_DIR), len(self.layers))
            for i, p in enumerate(ab):
                if p is not None and (p[0].shape[1] != self.H * self.hd or p[1].shape[0] != self.d):
                    raise SystemExit(f"{LORA_DIR}: layer {i}: lora_A {p[0].shape}, lora_B {p[1].shape} do not "
                                     f"fit o_proj [{self.d}, {self.H * self.hd}]")
            self.lora = (np.float32(scale), ab)

    def rope(self, x, positions):
        """x [n, heads, hd] rotate-half, angles fp32(pos) * inv_freq (fp32), cos / sin times attention_factor."""
        ang = np.asarray(positions, dtype=np.float32)[:, None] * self.inv_freq[None, :]
        cos = (np.cos(ang) * self.attn_factor)[:, None, :]
        sin = (np.sin(ang) * self.attn_factor)[:, None, :]
        h = self.hd // 2
        a, b = x[..., :h], x[..., h:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def logits(self, tokens, bidir_from=None, rows=None, lora=False):
        """fp32 logits [n, V] (or of the listed rows); rows >= bidir_from (default n: causal) see every key and,
        with lora, get the adapter on o_proj (the rows before are the causal cache, written without it)."""
        if lora and self.lora is None:
            raise SystemExit(f"lora: the checkpoint has no {LORA_DIR}/ adapter")
        toks = np.asarray(tokens, dtype=np.int64)
        n, H, KV, hd = len(toks), self.H, self.KV, self.hd
        bf = n if bidir_from is None else bidir_from
        pos = np.arange(n)
        visible = (pos[None, :] <= pos[:, None]) | (pos[:, None] >= bf)
        qscale = llama4_scale(pos, self.beta, self.orig_max)[:, None, None]
        scale = np.float32(1.0 / math.sqrt(hd))
        x = self.emb[toks]
        for li, L in enumerate(self.layers):
            h = rms_norm(x, L["an"], self.eps)
            q = self.rope((h @ L["q"].T).reshape(n, H, hd), pos) * qscale
            k = np.repeat(self.rope((h @ L["k"].T).reshape(n, KV, hd), pos), H // KV, axis=1)
            v = np.repeat((h @ L["v"].T).reshape(n, KV, hd), H // KV, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k).astype(np.float32) * scale
            s = np.where(visible[None], s, np.float32(-np.inf))
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", p, v).astype(np.float32).reshape(n, H * hd)
            o = att @ L["o"].T
            if lora and self.lora[1][li] is not None:
                A, B = self.lora[1][li]
                o[bf:] += self.lora[0] * ((att[bf:] @ A.T) @ B.T)
            x = x + o
            m = rms_norm(x, L["fn"], self.eps)
            x = x + (silu(m @ L["gate"].T) * (m @ L["up"].T)) @ L["down"].T
        x = x if rows is None else x[rows]
        return (rms_norm(x, self.norm_f, self.eps) @ self.head.T).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# decoding loops
# ---------------------------------------------------------------------------------------------

def pick(logits_rows):
    """(tokens, confidences) of fp32 logit rows: argmax (lowest id on ties), float64 softmax prob."""
    tok = np.argmax(logits_rows, axis=-1)
    conf = softmax64(logits_rows)[np.arange(len(tok)), tok]
    return [int(t) for t in tok], [float(c) for c in conf]


def threshold_choice(positions, conf, threshold):
    """Indices into positions: the most confident (ties: lower position) plus every other >= threshold."""
    order = sorted(range(len(positions)), key=lambda r: (-conf[r], positions[r]))
    return [order[0]] + [r for r in order[1:] if conf[r] >= threshold]


class Canvas:
    """The prompt + N positions, per-position decided flags, the trace and the EOS stop."""

    def __init__(self, m, prompt, n, eos=None, lora=False):
        if not prompt or n < 1:
            raise SystemExit("the prompt must be non-empty and --gen-length >= 1")
        self.m, self.P, self.end, self.eos, self.lora = m, len(prompt), len(prompt) + n, eos, lora
        self.x = [int(t) for t in prompt] + [m.mask_id] * n
        self.dec = [True] * self.P + [False] * n
        self.trace, self.stop_at = [], None

    @property
    def done(self):
        return self.stop_at is not None

    def undecided(self, lo, hi):
        return [p for p in range(lo, hi) if not self.dec[p]]

    def set(self, pos, tok):
        self.x[pos], self.dec[pos] = tok, True

    def check_eos(self):
        if self.eos is None:
            return
        for p in range(self.P, self.end):
            if not self.dec[p]:
                return
            if self.x[p] == self.eos:
                self.stop_at = p
                return

    def causal(self, upto, lo):
        """A causal pass over x[:upto] (trace rows [lo, upto)); decides position upto from row upto - 1."""
        tok, _ = pick(self.m.logits(self.x[:upto], rows=[upto - 1]))
        decided = []
        if upto < self.end:
            self.set(upto, tok[0])
            decided = [[upto, tok[0]]]
        self.trace.append({"kind": "causal", "rows": [lo, upto], "decided": decided})
        self.check_eos()

    def draft(self, c, e, threshold, final=True):
        """A draft pass over x[:e] (bidir_from c, the LoRA when self.lora); decides undecided positions of [c, e)
        by the threshold."""
        cand = self.undecided(c, e)
        tok, conf = pick(self.m.logits(self.x[:e], bidir_from=c, rows=cand, lora=self.lora))
        chosen = sorted(threshold_choice(cand, conf, threshold), key=lambda r: cand[r])
        for r in chosen:
            self.set(cand[r], tok[r])
        self.trace.append({"kind": "draft", "rows": [c, e], "decided": [[cand[r], tok[r]] for r in chosen]})
        if final:
            self.check_eos()

    def result(self):
        last = self.end - 1 if self.stop_at is None else self.stop_at
        gen = [self.x[p] if self.dec[p] and p <= last else self.m.mask_id for p in range(self.P, self.end)]
        return gen, self.trace


def generate_ar(m, prompt, n, eos=None):
    st = Canvas(m, prompt, n, eos)
    st.causal(st.P, 0)
    for p in range(st.P + 1, st.end):
        if st.done:
            break
        st.causal(p, p - 1)
    return st.result()


def generate_diffusion(m, prompt, n, block, threshold=0.9, eos=None):
    st = Canvas(m, prompt, n, eos)
    st.causal(st.P, 0)
    c = st.P
    while not st.done:
        e = min(c + block, st.end)
        while not st.done and st.undecided(c, e):
            st.draft(c, e, threshold)
        if st.done or e == st.end:
            break
        st.causal(e, c)
        c = e
    return st.result()


def generate_spec(m, prompt, n, block, threshold=0.0, eos=None, lora=None):
    """lora None: the draft passes use the checkpoint's adapter when it has one; False: never."""
    if block < 2:
        raise SystemExit("spec: --block-length must be >= 2")
    st = Canvas(m, prompt, n, eos, getattr(m, "lora", None) is not None if lora is None else lora)
    st.causal(st.P, 0)
    c = st.P
    while not st.done:
        e = min(c + block, st.end)
        if e == c + 1:
            break
        while st.undecided(c + 1, e):
            st.draft(c, e, threshold, final=False)
        ar, _ = pick(m.logits(st.x[:e], rows=list(range(c, e))))
        r = 0
        while c + r + 1 < e and ar[r] == st.x[c + r + 1]:
            r += 1
        a = min(r + 1, st.end - 1 - c)
        for p in range(c + 1, e):
            st.x[p], st.dec[p] = m.mask_id, False
        for i in range(a):
            st.set(c + 1 + i, ar[i])
        st.trace.append({"kind": "verify", "rows": [c, e], "decided": [[c + 1 + i, ar[i]] for i in range(a)]})
        st.check_eos()
        c += a
    return st.result()


def generate(m, prompt, n, mode, block=32, threshold=None, eos=None, lora=None):
    """(generated tokens, trace) of one loop; threshold None: 0.9 (diffusion), 0.0 (spec); lora (spec only):
    None = the adapter in the drafts when the checkpoint has one, False = never."""
    if mode == "ar":
        return generate_ar(m, prompt, n, eos)
    if mode == "diffusion":
        return generate_diffusion(m, prompt, n, block, 0.9 if threshold is None else threshold, eos)
    if mode == "spec":
        return generate_spec(m, prompt, n, block, 0.0 if threshold is None else threshold, eos, lora)
    raise SystemExit(f"unknown mode {mode!r} (ar, diffusion, spec)")


def spec_matches_ar(m, prompt, n, block=32, threshold=0.0, eos=None, lora=None):
    """(equal, spec tokens, ar tokens): linear self-speculation is lossless at temperature 0 (with the LoRA too)."""
    s, _ = generate_spec(m, prompt, n, block, threshold, eos, lora)
    a, _ = generate_ar(m, prompt, n, eos)
    return s == a, s, a


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def ids(s):
    return [int(t) for t in s.split(",") if t.strip()] if s else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("--model", required=True)
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--rows", default="")
    lg.add_argument("--bidir-from", type=int, default=None, help="rows >= N attend to every key (default: causal)")
    lg.add_argument("--lora", action="store_true", help=f"the rows >= --bidir-from use {LORA_DIR}/ (the draft LoRA)")
    lg.add_argument("--out", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--gen-length", type=int, required=True)
    g.add_argument("--mode", choices=["ar", "diffusion", "spec"], required=True)
    g.add_argument("--block-length", type=int, default=32)
    g.add_argument("--threshold", type=float, default=None, help="default 0.9 (diffusion), 0.0 (spec)")
    g.add_argument("--eos", type=int, default=None, help="stop at this token id (default: never)")
    g.add_argument("--no-lora", action="store_true", help=f"spec: drafts without the checkpoint's {LORA_DIR}/")
    g.add_argument("--check-ar", action="store_true", help="spec: exit 1 unless the tokens equal ar's")
    g.add_argument("--out", default="", help="JSON output file (default: stdout)")
    args = ap.parse_args()
    m = NemotronModel(args.model)
    if args.cmd == "logits":
        toks, rows = ids(args.tokens), ids(args.rows)
        bf = len(toks) if args.bidir_from is None else args.bidir_from
        if not 0 <= bf <= len(toks):
            raise SystemExit("--bidir-from must be in [0, number of tokens]")
        if args.lora and m.lora is None:
            raise SystemExit(f"--lora: {args.model} has no {LORA_DIR}/ adapter (make_tiny_checkpoint.py "
                             "--family nemotron --nemotron-lora R writes one)")
        L = m.logits(toks, bf, lora=args.lora)
        if rows:
            if min(rows) < 0 or max(rows) >= len(toks):
                raise SystemExit("row outside the token list")
            L = L[rows]
        np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
        return 0
    if args.block_length < 1:
        raise SystemExit("--block-length must be >= 1")
    prompt = ids(args.prompt)
    tokens, trace = generate(m, prompt, args.gen_length, args.mode, args.block_length, args.threshold, args.eos,
                             False if args.no_lora else None)
    text = json.dumps({"tokens": tokens, "trace": trace, "forwards": len(trace)})
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.check_ar:
        if args.mode != "spec":
            raise SystemExit("--check-ar needs --mode spec")
        want, _ = generate_ar(m, prompt, args.gen_length, args.eos)
        if want != tokens:
            print(f"spec differs from ar:\n spec {tokens}\n ar   {want}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
