#!/usr/bin/env python3
"""Numpy reference for DiffusionGemma (google/diffusiongemma-26B-A4B-it, text model): the fp32 forward in its two
modes (causal encoder over a KV cache, bidirectional decoder canvas with self-conditioning) and the entropy-bound
sampling loop with a counter RNG, written from shared/specs/diffusion-gemma.md sections 1-4, 6 and 10 only (never
from tessera's C++ code). Checkpoints: tools/make_tiny_checkpoint.py --family diffusion_gemma. Checks:
selftest_diffusion_gemma.py. Batch 1, fp32 (weights widened from bf16 exactly).

  ref_diffusion_gemma.py logits --model DIR --mode enc --tokens 5,9,3 [--rows 2,0] --out FILE
      Causal encoder forward of the tokens from an empty cache (positions 0..T-1): logits [T, V] (or the listed
      rows, in the order given) as raw little-endian float32.
  ref_diffusion_gemma.py logits --model DIR --mode dec --prompt 5,9,3 --canvas 7,8,9,10
                                [--prev-canvas 1,2,3,4 --prev-temperature 0.8] [--rows ...] --out FILE
      Encodes the prompt (positions 0..P-1), then the decoder forward of the canvas at positions P..P+C-1:
      logits [C, V]. With --prev-canvas (same length): first a decoder forward of that canvas (no SC) whose
      logits / T (fp32) give the self-conditioning of the --canvas forward.
  ref_diffusion_gemma.py generate --model DIR --prompt 5,9,3 [--gen-length G] [--seed S] [--steps N]
                                  [--t-min] [--t-max] [--entropy-bound] [--stability] [--confidence]
                                  [--canvas-length C] [--eos 292,295] [--out FILE.json]
      Prints {"tokens": generated ids (cut before the first EOS, at most G), "forwards": n, "trace": [{"t",
      "canvas_in", "T", "accepted", "argmax", "sampled", "mean_entropy", "stop"} per denoising forward],
      "canvases": n}. Defaults from generation_config.json (max_new_tokens, max_denoising_steps,
      sampler_config.entropy_bound, t_min, t_max, stability_threshold, confidence_threshold), canvas_length and
      eos_token_id from config.json, seed 0.

Forward (one backbone, two modes; H = hidden, eps = rms_norm_eps):
  rms(x; w) = x / sqrt(mean(x^2) + eps) * w  (plain w, not 1 + w); NoScale omits w. gelu = tanh approximation.
  Embedding E[id] * sqrt(H) in fp32 (no bf16 rounding of the scale). Per layer (sliding: head_dim, kv heads
  num_key_value_heads, rope "default" theta; full: global_head_dim, num_global_key_value_heads, "proportional"):
    a = rms(h; input_layernorm); q = RoPE(rms_per_head(a Wq^T; q_norm)); kraw = a Wk^T; vraw = a Wv^T on sliding
    layers, vraw = kraw on full layers (attention_k_eq_v: no v_proj); k = RoPE(rms_per_head(kraw; k_norm));
    v = rms_per_head_NoScale(vraw). Attention scale 1.0, GQA (kv head j serves query heads j*nh/kv ..), fp32
    softmax; h += rms(ctx Wo^T; post_attention_layernorm).
    dense = rms(down(gelu(gate(x1)) * up(x1)); post_feedforward_layernorm_1), x1 = rms(h; pre_feedforward_layernorm).
    Router on h: s = softmax_fp32((rmsNoScale(h) * router.scale * H^-0.5) router.proj^T) over E; the top_k by s
    (ties: lower id), w = s_top / sum(s_top) * per_expert_scale[id]. x2 = rms(h; pre_feedforward_layernorm_2);
    moe = rms(sum_k w_k down_k(gelu(x2 G_k^T) * (x2 U_k^T)); post_feedforward_layernorm_2) (experts.gate_up_proj
    rows [0, Ie) = G, [Ie, 2 Ie) = U; experts.down_proj [E, H, Ie]).
    h = (h + rms(dense + moe; post_feedforward_layernorm)) * layer_scalar of the mode (encoder:
    model.encoder.language_model.layers.N.layer_scalar, the decoder's when the checkpoint has none; decoder:
    model.decoder.layers.N.layer_scalar).
  logits = c tanh((rms(h; norm) E^T) / c), c = final_logit_softcapping (fp32; no cap when it is null).
  RoPE rotate-half, pairs (i, i + d/2): inv_freq[i] = theta^(-2i/d) for i < d/2 (default) or for
  i < int(partial_rotary_factor * d / 2) and 0 beyond (proportional: the exponent keeps d, the head dim);
  angles pos * inv_freq in float64 rounded to fp32, cos / sin in fp32.
  encoder mode: tokens at positions [L, L+T) after a cache of L; query q sees key k iff k <= q (sliding layers
    also q - k < sliding_window); appends its K / V (post-norm, post-RoPE) to the cache.
  decoder mode: a canvas of C at positions L..L+C-1 over the read-only cache: every canvas key; full layers the
    whole cache, sliding layers the cached positions >= L - (sliding_window - 1), the same for every canvas
    query. Input = rmsNoScale(E[x] sqrt(H) + SC), SC = down(gelu(gate(n)) * up(n)) (self_conditioning.*),
    n = rms(soft; pre_norm), soft = softmax(z_prev) E sqrt(H) (softmax in float64, then fp32),
    z_prev = previous forward's fp32 logits / T_prev (fp32); the first forward of a canvas has SC = 0.

Loop (spec section 6 with a counter RNG; u64 arithmetic wraps mod 2^64):
  rng_mix(x) = splitmix64's finaliser of x + 0x9e3779b97f4a7c15; rng_uniform(seed, a, b) = ((h >> 11) + 0.5) /
  2^53 with h = rng_mix(seed ^ rng_mix(a ^ rng_mix(b + 0x632be59bd9b4e019))), in double.
  Denoising forwards are numbered t = 0, 1, ... over the whole generation (encoder passes are not);
  seed_t = rng_mix(seed + t). noise(t, p) = min(V - 1, floor(rng_uniform(seed_t, p, V + 2) V)), p absolute.
  The prompt is encoded first (positions 0..P-1, L = P). Per canvas (ceil(G / C) canvases): x = noise of its first
  forward's t at L..L+C-1; history = stability_threshold canvases of -1; for s = N .. 1:
    T = float32(t_min + (t_max - t_min) * s / N) (float64, left to right, then rounded); logits = decoder(x);
    d_p = argmax_v (logits[v] - T log(-log(rng_uniform(seed_t, p, v)))) in float64 (Gumbel-max: a draw from
    softmax(logits / T)); a_p = argmax_v logits (ties: lowest v); H_p = entropy of softmax(logits / T) in
    float64 (logits / T in float64; 0 log 0 = 0). Accept: rank the positions by H ascending (ties: lower
    position); rank j is accepted iff the float64 sum, in rank order, of the H of ranks < j is <= entropy_bound
    (rank 0 always). stable = every stored history canvas equals a (none stored: stable); push a, keep the last
    stability_threshold. confident = (sequential float64 sum of H) / C < confidence_threshold. SC of the next
    forward: logits / T (fp32). x for forward t + 1: accepted positions take d, the others noise(t + 1, p).
    Stop after the forward when stable and confident, or after N forwards.
  Committed canvas = a of its last forward. If it holds an EOS (config eos_token_id list) the output ends before
  the first one and generation stops; otherwise, unless it is the last canvas, it is encoded (encoder mode,
  positions L..L+C-1), L += C. Output: the committed tokens, cut at G.
  trace entry per forward: t, canvas_in (x entering it), T (the float32 value), accepted (canvas indices
  0..C-1, ascending), argmax (a), sampled (d), mean_entropy, stop (stable and confident).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

SKIP_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")  # vision: not used by the text model
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------------------------
# counter RNG (python ints for scalars, numpy uint64 arrays for grids; both wrap mod 2^64)
# ---------------------------------------------------------------------------------------------

def rng_mix(x):
    x = (int(x) + 0x9e3779b97f4a7c15) & MASK64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK64
    return x ^ (x >> 31)


def rng_uniform(seed, a, b):
    h = rng_mix(int(seed) ^ rng_mix(int(a) ^ rng_mix((int(b) + 0x632be59bd9b4e019) & MASK64)))
    return (float(h >> 11) + 0.5) * (1.0 / 9007199254740992.0)


def _mix_np(x):
    x = x + np.uint64(0x9e3779b97f4a7c15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return x ^ (x >> np.uint64(31))


def rng_uniform_np(seed, a, b):
    """rng_uniform over broadcast arrays a, b (non-negative ints) for one seed: float64 array."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = _mix_np(np.uint64(int(seed) & MASK64) ^ _mix_np(a ^ _mix_np(b + np.uint64(0x632be59bd9b4e019))))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


def forward_seed(seed, t):
    return rng_mix((int(seed) + int(t)) & MASK64)


def noise_tokens(seed, t, positions, V):
    """The noise token of each absolute position entering forward t."""
    u = rng_uniform_np(forward_seed(seed, t), np.asarray(positions, dtype=np.int64), V + 2)
    return np.minimum(V - 1, np.floor(u * V)).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# building blocks
# ---------------------------------------------------------------------------------------------

def rms(x, w=None, eps=1e-6):
    """RMSNorm over the last axis in fp32: plain w (None: no scale)."""
    x = np.asarray(x, dtype=np.float32)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))
    return y if w is None else y * np.asarray(w, dtype=np.float32)


def gelu_tanh(x):
    x = np.asarray(x, dtype=np.float32)
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def softmax32(x):
    x = np.asarray(x, dtype=np.float32)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rope_inv_freq(d, rope):
    """float64 inv_freq [d / 2] of one layer type's rope_parameters (default / proportional)."""
    kind, theta, half = rope.get("rope_type", "default"), float(rope["rope_theta"]), d // 2
    inv = theta ** (-2.0 * np.arange(half, dtype=np.float64) / d)
    if kind == "proportional":
        n_rot = int(float(rope.get("partial_rotary_factor", 1.0)) * d / 2)
        inv[n_rot:] = 0.0
    elif kind != "default":
        raise SystemExit(f"rope_type {kind!r} is not supported (default, proportional)")
    return inv


def apply_rope(x, positions, inv):
    """x [T, heads, d] rotate-half (pairs (i, i + d/2)); angles pos * inv in float64 rounded to fp32."""
    ang = (np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]).astype(np.float32)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(np.float32)


def encoder_mask(L, T, window=None):
    """[T, L + T] bool: query at L + i sees key k iff k <= L + i (and L + i - k < window when given)."""
    q = L + np.arange(T)[:, None]
    k = np.arange(L + T)[None, :]
    m = k <= q
    return m if window is None else m & (q - k < window)


def decoder_mask(L, C, window=None):
    """[C, L + C] bool: every canvas key; cached keys all (full) or those >= L - (window - 1) (sliding)."""
    k = np.arange(L + C)
    row = np.ones(L + C, dtype=bool) if window is None else k >= L - (window - 1)
    return np.repeat(row[None, :], C, axis=0)


def attention(q, K, V, mask):
    """q [T, nh, d], K / V [S, kv, d], mask [T, S] bool -> [T, nh * d]; scale 1, GQA, fp32 softmax."""
    T, nh, d = q.shape
    rep = nh // K.shape[1]
    K, V = np.repeat(K, rep, axis=1), np.repeat(V, rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, K).astype(np.float32)
    s = np.where(mask[None], s, np.float32(-np.inf))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, V).astype(np.float32).reshape(T, nh * d)


# ---------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------

class Cache:
    """Per layer the post-norm, post-RoPE K and the V of every encoded position."""

    def __init__(self, layers):
        self.K = [None] * layers
        self.V = [None] * layers
        self.length = 0


class DiffusionGemma:
    """A DiffusionGemma checkpoint directory in fp32 numpy arrays (text model; vision tensors skipped)."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        tc = c.get("text_config", c)
        self.config, self.tc = c, tc
        gpath = os.path.join(model_dir, "generation_config.json")
        self.gen = json.load(open(gpath)) if os.path.exists(gpath) else {}
        w = {k: v for k, v in safetensors_np.read_dir(model_dir).items() if not k.startswith(SKIP_PREFIXES)}
        self.H, self.nh = tc["hidden_size"], tc["num_attention_heads"]
        self.eps = float(tc.get("rms_norm_eps", 1e-6))
        self.window = int(tc["sliding_window"])
        self.softcap = tc.get("final_logit_softcapping")
        self.top_k = int(tc["top_k_experts"])
        self.types = list(tc["layer_types"])
        eos = c.get("eos_token_id", tc.get("eos_token_id"))
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.canvas_length = int(c.get("canvas_length", 256))
        if tc.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise SystemExit(f"hidden_activation {tc.get('hidden_activation')!r} is not supported")
        self.emb = w.pop("model.decoder.embed_tokens.weight")
        self.V = self.emb.shape[0]
        self.emb_scale = np.float32(math.sqrt(self.H))
        self.norm_f = w.pop("model.decoder.norm.weight")
        s = "model.decoder.self_conditioning."
        self.sc = {k: w.pop(s + k + ".weight") for k in ("pre_norm", "gate_proj", "up_proj", "down_proj")}
        ropes = tc["rope_parameters"]
        k_eq_v = tc.get("attention_k_eq_v", True)  # not in the released config, but its weights need it (spec 1)
        self.layers, self.dec_scalar, self.enc_scalar = [], [], []
        for i, lt in enumerate(self.types):
            if lt not in ("full_attention", "sliding_attention"):
                raise SystemExit(f"layer {i}: layer type {lt!r} is not supported")
            full = lt == "full_attention"
            b = f"model.decoder.layers.{i}."
            L = {k: w.pop(b + n) for k, n in (
                ("in_ln", "input_layernorm.weight"), ("q", "self_attn.q_proj.weight"),
                ("k", "self_attn.k_proj.weight"), ("o", "self_attn.o_proj.weight"),
                ("qn", "self_attn.q_norm.weight"), ("kn", "self_attn.k_norm.weight"),
                ("post_attn", "post_attention_layernorm.weight"), ("pre_ff", "pre_feedforward_layernorm.weight"),
                ("gate", "mlp.gate_proj.weight"), ("up", "mlp.up_proj.weight"), ("down", "mlp.down_proj.weight"),
                ("post_ff1", "post_feedforward_layernorm_1.weight"), ("wr", "router.proj.weight"),
                ("r_scale", "router.scale"), ("pes", "router.per_expert_scale"),
                ("pre_ff2", "pre_feedforward_layernorm_2.weight"), ("gu", "experts.gate_up_proj"),
                ("ed", "experts.down_proj"), ("post_ff2", "post_feedforward_layernorm_2.weight"),
                ("post_ff", "post_feedforward_layernorm.weight"))}
            L["v"] = None if full and k_eq_v else w.pop(b + "self_attn.v_proj.weight")
            L["full"] = full
            L["d"] = tc["global_head_dim"] if full else tc["head_dim"]
            L["kv"] = tc["num_global_key_value_heads"] if full else tc["num_key_value_heads"]
            L["inv"] = rope_inv_freq(L["d"], ropes[lt])
            L["window"] = None if full else self.window
            self.layers.append(L)
            dec = w.pop(b + "layer_scalar")
            enc = w.pop(f"model.encoder.language_model.layers.{i}.layer_scalar", dec)
            self.dec_scalar.append(np.float32(dec.reshape(-1)[0]))
            self.enc_scalar.append(np.float32(enc.reshape(-1)[0]))
        if w:
            raise SystemExit(f"{model_dir}: unexpected tensors {sorted(w)[:4]}")

    def new_cache(self):
        return Cache(len(self.layers))

    # --- inputs -------------------------------------------------------------------------------
    def embed(self, tokens):
        return self.emb[np.asarray(tokens, dtype=np.int64)] * self.emb_scale

    def self_cond(self, soft):
        """The self-conditioning MLP of soft embeddings [C, H] (exactly 0 for soft = 0)."""
        n = rms(soft, self.sc["pre_norm"], self.eps)
        return (gelu_tanh(n @ self.sc["gate_proj"].T) * (n @ self.sc["up_proj"].T)) @ self.sc["down_proj"].T

    def soft_embedding(self, z):
        """softmax(z) E sqrt(H): the probabilities in float64, rounded to fp32, the product in fp32."""
        return (softmax64(z).astype(np.float32) @ self.emb) * self.emb_scale

    def decoder_input(self, canvas, z_prev=None):
        e = self.embed(canvas)
        sc = np.zeros_like(e) if z_prev is None else self.self_cond(self.soft_embedding(z_prev))
        return rms(e + sc, None, self.eps)

    # --- one layer ----------------------------------------------------------------------------
    def qkv(self, i, h, positions):
        """q [T, nh, d], k, v [T, kv, d] of layer i for its input h (before the input norm)."""
        L, T = self.layers[i], h.shape[0]
        a = rms(h, L["in_ln"], self.eps)
        q = apply_rope(rms((a @ L["q"].T).reshape(T, self.nh, L["d"]), L["qn"], self.eps), positions, L["inv"])
        kraw = (a @ L["k"].T).reshape(T, L["kv"], L["d"])
        vraw = kraw if L["v"] is None else (a @ L["v"].T).reshape(T, L["kv"], L["d"])
        k = apply_rope(rms(kraw, L["kn"], self.eps), positions, L["inv"])
        return q, k, rms(vraw, None, self.eps)

    def route(self, i, h):
        """(expert ids [T, k], weights [T, k]) of layer i's router on the residual h."""
        L = self.layers[i]
        z = rms(h, None, self.eps) * L["r_scale"] * np.float32(self.H ** -0.5)
        s = softmax32(z @ L["wr"].T)
        idx = np.argsort(-s, axis=-1, kind="stable")[:, :self.top_k]
        top = np.take_along_axis(s, idx, axis=-1)
        return idx, (top / top.sum(axis=-1, keepdims=True)) * L["pes"][idx]

    def ffn(self, i, h):
        """rms(dense + moe; post_feedforward_layernorm) of layer i (h after the attention residual)."""
        L = self.layers[i]
        x1 = rms(h, L["pre_ff"], self.eps)
        dense = rms((gelu_tanh(x1 @ L["gate"].T) * (x1 @ L["up"].T)) @ L["down"].T, L["post_ff1"], self.eps)
        idx, wts = self.route(i, h)
        x2 = rms(h, L["pre_ff2"], self.eps)
        Ie = L["gu"].shape[1] // 2
        moe = np.zeros_like(h)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            g, u = x2[rows] @ L["gu"][e, :Ie].T, x2[rows] @ L["gu"][e, Ie:].T
            moe[rows] += wts[rows, slot][:, None] * ((gelu_tanh(g) * u) @ L["ed"][e].T)
        moe = rms(moe, L["post_ff2"], self.eps)
        return rms(dense + moe, L["post_ff"], self.eps)

    def layer(self, i, h, positions, past_k, past_v, mask, scalar):
        """(h out, k, v) of layer i: keys = [past ; new], mask [T, S]; scalar: fp32 scalar or [T, 1]."""
        L = self.layers[i]
        q, k, v = self.qkv(i, h, positions)
        K = k if past_k is None else np.concatenate([past_k, k])
        V = v if past_v is None else np.concatenate([past_v, v])
        o = attention(q, K, V, mask) @ L["o"].T
        h = h + rms(o, L["post_attn"], self.eps)
        h = (h + self.ffn(i, h)) * np.asarray(scalar, dtype=np.float32)
        return h.astype(np.float32), k, v

    def head(self, h):
        z = (rms(h, self.norm_f, self.eps) @ self.emb.T).astype(np.float32)
        if self.softcap:
            cap = np.float32(self.softcap)
            z = (cap * np.tanh(z / cap)).astype(np.float32)
        return z

    # --- the two modes ------------------------------------------------------------------------
    def encode(self, tokens, cache, want_logits=True):
        """Encoder mode: appends the tokens at positions [L, L + T) to the cache; logits [T, V] (or None)."""
        L, T = cache.length, len(tokens)
        if T == 0:
            return np.zeros((0, self.V), dtype=np.float32) if want_logits else None
        pos = np.arange(L, L + T)
        h = self.embed(tokens)
        for i, ly in enumerate(self.layers):
            h, k, v = self.layer(i, h, pos, cache.K[i], cache.V[i], encoder_mask(L, T, ly["window"]),
                                 self.enc_scalar[i])
            cache.K[i] = k if cache.K[i] is None else np.concatenate([cache.K[i], k])
            cache.V[i] = v if cache.V[i] is None else np.concatenate([cache.V[i], v])
        cache.length = L + T
        return self.head(h) if want_logits else None

    def decode(self, canvas, cache, z_prev=None):
        """Decoder mode: logits [C, V] of the canvas at positions [L, L + C) over the read-only cache;
        z_prev: the previous forward's logits / T_prev (fp32), None on a canvas' first forward."""
        L, C = cache.length, len(canvas)
        pos = np.arange(L, L + C)
        h = self.decoder_input(canvas, z_prev)
        for i, ly in enumerate(self.layers):
            h, _, _ = self.layer(i, h, pos, cache.K[i], cache.V[i], decoder_mask(L, C, ly["window"]),
                                 self.dec_scalar[i])
        return self.head(h)


# ---------------------------------------------------------------------------------------------
# sampling loop
# ---------------------------------------------------------------------------------------------

def temperature(s, n_steps, t_min, t_max):
    """float32(t_min + (t_max - t_min) * s / N), the float64 expression evaluated left to right."""
    return np.float32(float(t_min) + (float(t_max) - float(t_min)) * s / n_steps)


def step_stats(logits, T, seed_t, positions):
    """(sampled d, argmax a, entropies H float64) of one forward's fp32 logits [C, V] at temperature T."""
    l64 = np.asarray(logits, dtype=np.float64)
    T64 = float(np.float32(T))
    V = l64.shape[1]
    u = rng_uniform_np(seed_t, np.asarray(positions, dtype=np.int64)[:, None], np.arange(V, dtype=np.int64)[None, :])
    d = np.argmax(l64 - T64 * np.log(-np.log(u)), axis=-1)
    a = np.argmax(np.asarray(logits, dtype=np.float32), axis=-1)
    z = l64 / T64
    zs = z - z.max(axis=-1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(axis=-1, keepdims=True))
    with np.errstate(invalid="ignore"):
        H = -np.where(logp > -np.inf, np.exp(logp) * logp, 0.0).sum(axis=-1)  # 0 log 0 = 0
    return d.astype(np.int64), a.astype(np.int64), H


def accept(H, bound):
    """Canvas indices accepted by the entropy bound, ascending: rank by H ascending (ties: lower index); rank j
    is accepted iff the sum of the H of ranks < j is <= bound (rank 0 always)."""
    order = sorted(range(len(H)), key=lambda i: (float(H[i]), i))
    out, cum = [], 0.0
    for j, i in enumerate(order):
        if j == 0 or cum <= bound:
            out.append(i)
        cum += float(H[i])
    return sorted(out)


def params(m, **over):
    """The loop's parameters: generation_config.json / config.json defaults, overridden by non-None values."""
    g = m.gen
    p = {"gen_length": g.get("max_new_tokens", 256), "steps": g.get("max_denoising_steps", 48),
         "t_min": g.get("t_min", 0.4), "t_max": g.get("t_max", 0.8),
         "entropy_bound": (g.get("sampler_config") or {}).get("entropy_bound", 0.1),
         "stability": g.get("stability_threshold", 1), "confidence": g.get("confidence_threshold", 0.005),
         "canvas_length": m.canvas_length, "seed": 0, "eos": m.eos}
    p.update({k: v for k, v in over.items() if v is not None})
    return p


def generate(m, prompt, **over):
    """The sampling loop of spec section 6 with the counter RNG (module docstring). Returns the JSON dict."""
    p = params(m, **over)
    G, N, C, seed = int(p["gen_length"]), int(p["steps"]), int(p["canvas_length"]), int(p["seed"])
    stab, eos = int(p["stability"]), set(int(e) for e in p["eos"])
    if G < 1 or N < 1 or C < 1 or stab < 0:
        raise SystemExit("gen-length, steps and canvas-length must be >= 1, stability >= 0")
    cache = m.new_cache()
    m.encode(list(prompt), cache, want_logits=False)
    t, out, trace, canvases = 0, [], [], 0
    n_canvas = -(-G // C)
    for ci in range(n_canvas):
        L = cache.length
        pos = np.arange(L, L + C)
        x = noise_tokens(seed, t, pos, m.V)
        z_prev, hist = None, [np.full(C, -1, dtype=np.int64)] * stab
        for s in range(N, 0, -1):
            T = temperature(s, N, p["t_min"], p["t_max"])
            logits = m.decode(x, cache, z_prev)
            d, a, H = step_stats(logits, T, forward_seed(seed, t), pos)
            acc = accept(H, float(p["entropy_bound"]))
            stable = all(np.array_equal(h, a) for h in hist)
            hist = (hist + [a])[-stab:] if stab else []
            total = 0.0
            for hv in H:
                total += float(hv)
            mean_h = total / C
            stop = stable and mean_h < float(p["confidence"])
            trace.append({"t": t, "canvas_in": [int(v) for v in x], "T": float(T), "accepted": acc,
                          "argmax": [int(v) for v in a], "sampled": [int(v) for v in d], "mean_entropy": mean_h,
                          "stop": bool(stop)})
            z_prev = (logits / T).astype(np.float32)
            t += 1
            x = noise_tokens(seed, t, pos, m.V)
            x[acc] = d[acc]
            if stop:
                break
        canvases += 1
        committed = [int(v) for v in a]
        hits = [j for j, v in enumerate(committed) if v in eos]
        if hits:
            out += committed[:hits[0]]
            break
        out += committed
        if ci < n_canvas - 1:
            m.encode(committed, cache, want_logits=False)
    return {"tokens": out[:G], "forwards": len(trace), "trace": trace, "canvases": canvases}


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

def ids(s):
    return [int(v) for v in s.split(",") if v.strip()] if s else []


def check_ids(m, toks, what):
    if any(not 0 <= v < m.V for v in toks):
        raise SystemExit(f"{what}: token id outside [0, {m.V})")
    return toks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("--model", required=True)
    lg.add_argument("--mode", choices=["enc", "dec"], required=True)
    lg.add_argument("--tokens", default="", help="enc: the tokens")
    lg.add_argument("--prompt", default="", help="dec: the encoded prompt")
    lg.add_argument("--canvas", default="", help="dec: the canvas")
    lg.add_argument("--prev-canvas", default="", help="dec: the previous forward's canvas (self-conditioning)")
    lg.add_argument("--prev-temperature", type=float, default=None, help="dec: T of the previous forward")
    lg.add_argument("--rows", default="")
    lg.add_argument("--out", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--gen-length", type=int, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--steps", type=int, default=None, help="max_denoising_steps")
    g.add_argument("--t-min", type=float, default=None)
    g.add_argument("--t-max", type=float, default=None)
    g.add_argument("--entropy-bound", type=float, default=None)
    g.add_argument("--stability", type=int, default=None, help="stability_threshold")
    g.add_argument("--confidence", type=float, default=None, help="confidence_threshold")
    g.add_argument("--canvas-length", type=int, default=None)
    g.add_argument("--eos", default=None, help="EOS ids, comma separated (default: config.json's eos_token_id)")
    g.add_argument("--out", default="", help="JSON output file (default: stdout)")
    args = ap.parse_args()
    m = DiffusionGemma(args.model)
    if args.cmd == "logits":
        rows = ids(args.rows)
        if args.mode == "enc":
            toks = check_ids(m, ids(args.tokens), "--tokens")
            if not toks or args.canvas or args.prompt or args.prev_canvas:
                raise SystemExit("--mode enc takes --tokens (non-empty) only")
            out = m.encode(toks, m.new_cache())
        else:
            canvas = check_ids(m, ids(args.canvas), "--canvas")
            prev = check_ids(m, ids(args.prev_canvas), "--prev-canvas")
            if not canvas or args.tokens:
                raise SystemExit("--mode dec takes --prompt and a non-empty --canvas")
            if bool(prev) != (args.prev_temperature is not None) or (prev and len(prev) != len(canvas)):
                raise SystemExit("--prev-canvas (as long as --canvas) and --prev-temperature go together")
            if args.prev_temperature is not None and not args.prev_temperature > 0:
                raise SystemExit("--prev-temperature must be > 0")
            cache = m.new_cache()
            m.encode(check_ids(m, ids(args.prompt), "--prompt"), cache, want_logits=False)
            z = None
            if prev:
                z = (m.decode(prev, cache) / np.float32(args.prev_temperature)).astype(np.float32)
            out = m.decode(canvas, cache, z)
        if rows:
            if min(rows) < 0 or max(rows) >= out.shape[0]:
                raise SystemExit("row outside the logits")
            out = out[rows]
        np.ascontiguousarray(out, dtype="<f4").tofile(args.out)
        return 0
    over = {"gen_length": args.gen_length, "seed": args.seed, "steps": args.steps, "t_min": args.t_min,
            "t_max": args.t_max, "entropy_bound": args.entropy_bound, "stability": args.stability,
            "confidence": args.confidence, "canvas_length": args.canvas_length,
            "eos": None if args.eos is None else ids(args.eos)}
    if args.seed is not None and args.seed < 0:
        raise SystemExit("--seed must be >= 0 (a u64)")
    res = generate(m, check_ids(m, ids(args.prompt), "--prompt"), **over)
    text = json.dumps(res)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
