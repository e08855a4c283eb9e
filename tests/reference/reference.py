#!/usr/bin/env python3
"""Independent numpy forward pass and reference samplers for LLaDA and Dream, written from
shared/specs/models.md and shared/specs/algorithms.md (fp32 math).

  reference.py logits --model DIR --tokens 5,9,3 [--rows 0,2] --out FILE
      writes float32 logits [len(rows), vocab] (rows default: all positions), little-endian.
  reference.py generate --model DIR --prompt 5,9,3 --gen-length 16 --steps 8 --block-length 8
                        --alg low_confidence|entropy|maskgit_plus|topk_margin
      temperature-0 sampler; prints JSON {"tokens": [...], "order": [[positions per step]...]}.
      Ties in confidence go to the lower position.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402


class Model:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        self.c = c
        w = safetensors_np.read_dir(model_dir)
        self.causal = bool(c.get("is_causal", False))
        self.interleaved = bool(c.get("rope_interleaved", False))
        mt = c["model_type"]
        if mt == "llada":
            self.family = "llada"
            d, L, H = c["d_model"], c["n_layers"], c["n_heads"]
            KV = c.get("n_kv_heads") or H
            self.theta = c.get("rope_theta", 10000.0)
            self.eps = c.get("rms_norm_eps", 1e-5)
            p = "model.transformer."
            self.emb = w[p + "wte.weight"]
            self.norm_f = w[p + "ln_f.weight"]
            self.head = self.emb if c.get("weight_tying", False) else w[p + "ff_out.weight"]
            self.layers = []
            for i in range(L):
                b = f"{p}blocks.{i}."
                self.layers.append(dict(
                    an=w[b + "attn_norm.weight"], q=w[b + "q_proj.weight"], k=w[b + "k_proj.weight"],
                    v=w[b + "v_proj.weight"], o=w[b + "attn_out.weight"], fn=w[b + "ff_norm.weight"],
                    g=w[b + "ff_proj.weight"], u=w[b + "up_proj.weight"], dn=w[b + "ff_out.weight"],
                    bq=w.get(b + "q_proj.bias"), bk=w.get(b + "k_proj.bias"), bv=w.get(b + "v_proj.bias")))
            self.shift = False
            self.mask_id = c.get("mask_token_id", 126336)
        elif mt in ("Dream", "dream"):
            self.family = "dream"
            d, L, H = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
            KV = c.get("num_key_value_heads", H)
            self.theta = c.get("rope_theta", 10000.0)
            self.eps = c.get("rms_norm_eps", 1e-6)
            self.emb = w["model.embed_tokens.weight"]
            self.norm_f = w["model.norm.weight"]
            self.head = self.emb if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
            self.layers = []
            for i in range(L):
                b = f"model.layers.{i}."
                self.layers.append(dict(
                    an=w[b + "input_layernorm.weight"], q=w[b + "self_attn.q_proj.weight"],
                    k=w[b + "self_attn.k_proj.weight"], v=w[b + "self_attn.v_proj.weight"],
                    o=w[b + "self_attn.o_proj.weight"], fn=w[b + "post_attention_layernorm.weight"],
                    g=w[b + "mlp.gate_proj.weight"], u=w[b + "mlp.up_proj.weight"],
                    dn=w[b + "mlp.down_proj.weight"], bq=w.get(b + "self_attn.q_proj.bias"),
                    bk=w.get(b + "self_attn.k_proj.bias"), bv=w.get(b + "self_attn.v_proj.bias")))
            self.shift = True
            self.mask_id = c.get("mask_token_id", 151666)
        else:
            raise SystemExit(f"unsupported model_type {mt}")
        self.d, self.H, self.KV = d, H, KV
        self.hd = c.get("head_dim", d // H)
        self.vocab = self.emb.shape[0]

    def rms(self, x, w):
        x = x.astype(np.float32)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x [L, heads, hd]; rotate-half (NeoX) unless rope_interleaved
        hd = self.hd
        inv = 1.0 / (self.theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        ang = (pos[:, None].astype(np.float64) * inv[None, :]).astype(np.float32)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = b * cos + a * sin
            return out
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def forward(self, tokens):
        """Logits [L, vocab] (Dream: already shifted)."""
        tokens = np.asarray(tokens)
        n = len(tokens)
        pos = np.arange(n)
        x = self.emb[tokens].astype(np.float32)
        grp = self.H // self.KV
        for ly in self.layers:
            h = self.rms(x, ly["an"])
            q, k, v = h @ ly["q"].T, h @ ly["k"].T, h @ ly["v"].T
            if ly["bq"] is not None:
                q, k, v = q + ly["bq"], k + ly["bk"], v + ly["bv"]
            q = self.rope(q.reshape(n, self.H, self.hd), pos)
            k = self.rope(k.reshape(n, self.KV, self.hd), pos)
            v = v.reshape(n, self.KV, self.hd)
            k = np.repeat(k, grp, axis=1)
            v = np.repeat(v, grp, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.hd)
            if self.causal:
                s = np.where(np.tril(np.ones((n, n), dtype=bool))[None], s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", p, v).reshape(n, self.H * self.hd)
            x = x + att @ ly["o"].T
            m = self.rms(x, ly["fn"])
            g, u = m @ ly["g"].T, m @ ly["u"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ ly["dn"].T
        logits = self.rms(x, self.norm_f) @ self.head.T
        if self.shift:
            logits = np.concatenate([logits[:1], logits[:-1]], axis=0)
        return logits.astype(np.float32)


def softmax(l):
    l = l - l.max(axis=-1, keepdims=True)
    p = np.exp(l)
    return p / p.sum(axis=-1, keepdims=True)


def topk_positions(conf, k):
    """Indices of the k largest confidences; ties go to the lower position."""
    order = sorted(range(len(conf)), key=lambda i: (-conf[i], i))
    return [i for i in order[:k] if conf[i] != -np.inf]


def generate(m, prompt, gen_length, steps, block_length, alg):
    x = list(prompt) + [m.mask_id] * gen_length
    P = len(prompt)
    order = []
    if alg in ("low_confidence",):
        nb = gen_length // block_length
        spb = steps // nb
        for b in range(nb):
            lo, hi = P + b * block_length, P + (b + 1) * block_length
            n = sum(1 for i in range(lo, hi) if x[i] == m.mask_id)
            sched = [n // spb + (1 if i < n % spb else 0) for i in range(spb)]
            for i in range(spb):
                L = m.forward(x)
                x0 = L.argmax(axis=-1)
                pr = softmax(L.astype(np.float64))
                conf = [pr[j, x0[j]] if (lo <= j < hi and x[j] == m.mask_id) else -np.inf for j in range(len(x))]
                sel = topk_positions(conf, sched[i])
                for j in sel:
                    x[j] = int(x0[j])
                order.append(sorted(sel))
    else:
        eps = 1e-3
        ts = np.linspace(1, eps, steps + 1)
        for i in range(steps):
            masked = [j for j in range(len(x)) if x[j] == m.mask_id]
            if not masked:
                break
            t, s = ts[i], ts[i + 1]
            L = m.forward(x)
            pr = softmax(L[masked].astype(np.float64))
            x0 = pr.argmax(axis=-1)
            if alg == "maskgit_plus":
                c = pr.max(axis=-1)
            elif alg == "topk_margin":
                srt = np.sort(pr, axis=-1)
                c = srt[:, -1] - srt[:, -2]
            elif alg == "entropy":
                c = (pr * np.log(pr + 1e-10)).sum(axis=-1)
            else:
                raise SystemExit(f"unsupported alg {alg}")
            k = len(masked) if i == steps - 1 else int(len(masked) * (1 - s / t))
            sel = topk_positions(list(c), k)
            chosen = []
            for r in sel:
                x[masked[r]] = int(x0[r])
                chosen.append(masked[r])
            order.append(sorted(chosen))
    return x, order


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("logits")
    a.add_argument("--model", required=True)
    a.add_argument("--tokens", required=True)
    a.add_argument("--rows", default="")
    a.add_argument("--out", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--gen-length", type=int, required=True)
    g.add_argument("--steps", type=int, required=True)
    g.add_argument("--block-length", type=int, default=0)
    g.add_argument("--alg", default="low_confidence")
    args = ap.parse_args()
    m = Model(args.model)
    if args.cmd == "logits":
        toks = [int(t) for t in args.tokens.split(",")]
        L = m.forward(toks)
        if args.rows:
            L = L[[int(r) for r in args.rows.split(",")]]
        np.ascontiguousarray(L, dtype="<f4").tofile(args.out)
    else:
        prompt = [int(t) for t in args.prompt.split(",") if t]
        bl = args.block_length or args.gen_length
        x, order = generate(m, prompt, args.gen_length, args.steps, bl, args.alg)
        print(json.dumps({"tokens": x, "order": order}))


if __name__ == "__main__":
    main()
