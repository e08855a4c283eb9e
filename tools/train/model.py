"""PyTorch masked-diffusion transformers in the LLaDA (dense), LLaDA-MoE and Nemotron-Labs-Diffusion layouts.

Runs on torch 1.13 (CPU) and torch 2.x (CUDA): F.scaled_dot_product_attention only where it exists.
Both families: bidirectional attention, RMSNorm (fp32, cast back, times weight), rotate-half RoPE on
positions 0..T-1 (fp32), SwiGLU FFN, no biases, untied LM head, logits not shifted.
LLaDA-MoE adds per-head RMSNorm on q and k before RoPE (qk-norm) and replaces the FFN by a
softmax router (fp32) over E experts, top-k WITHOUT renormalisation: out = sum_e w_e * expert_e(x).
Nemotron-Labs-Diffusion ("nemotron", tri-mode) is the dense block with explicit positions and an attention
mask (True = may attend): train.py's joint objective runs a causal stream and a block-diffusion stream in
one sequence (tri_mask).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight.to(x.dtype)


def rope_tables(T, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    f = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x [B, H, T, hd]; rotate-half ("NeoX") RoPE computed in fp32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return (xf * cos + rot * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, H, KV, hd = c["d_model"], c["n_heads"], c["n_kv_heads"], c["head_dim"]
        self.H, self.KV, self.hd = H, KV, hd
        self.wq = nn.Linear(d, H * hd, bias=False)
        self.wk = nn.Linear(d, KV * hd, bias=False)
        self.wv = nn.Linear(d, KV * hd, bias=False)
        self.wo = nn.Linear(H * hd, d, bias=False)
        self.qk_norm = c.get("qk_norm", False)
        if self.qk_norm:
            self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
            self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin, mask=None):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.H, self.hd)
        k = self.wk(x).view(B, T, self.KV, self.hd)
        v = self.wv(x).view(B, T, self.KV, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.KV != self.H:
            k = k.repeat_interleave(self.H // self.KV, dim=1)
            v = v.repeat_interleave(self.H // self.KV, dim=1)
        if HAVE_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        else:
            att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
            att = att.float()
            if mask is not None:
                att = att.masked_fill(~mask, float("-inf"))
            o = torch.matmul(att.softmax(-1).to(v.dtype), v)
        return self.wo(o.transpose(1, 2).reshape(B, T, self.H * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.w_gate = nn.Linear(d, h, bias=False)
        self.w_up = nn.Linear(d, h, bias=False)
        self.w_down = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class MoE(nn.Module):
    """Softmax router in fp32, top-k without renormalisation, SwiGLU experts."""

    def __init__(self, c):
        super().__init__()
        d, E, h = c["d_model"], c["n_experts"], c["expert_hidden"]
        self.E, self.k = E, c["top_k"]
        self.gate = nn.Linear(d, E, bias=False)
        # stacked expert weights, used whole by three batched matmuls over a [E, capacity, d] buffer
        # (one bmm instead of E small GEMMs; capacity = the busiest expert's token count)
        self.w_gate = nn.Parameter(torch.empty(E, h, d))
        self.w_up = nn.Parameter(torch.empty(E, h, d))
        self.w_down = nn.Parameter(torch.empty(E, d, h))
        self.last_aux = None
        self.last_counts = None

    def forward(self, x):
        shp = x.shape
        flat = x.reshape(-1, shp[-1])
        N = flat.shape[0]
        with torch.autocast(device_type=x.device.type, enabled=False):  # the router runs in fp32
            logits = F.linear(flat.float(), self.gate.weight.float())
        probs = logits.softmax(-1)
        topw, topi = probs.topk(self.k, dim=-1)  # no renormalisation
        fi = topi.reshape(-1)
        counts = torch.bincount(fi, minlength=self.E)
        # Switch-style load-balancing loss: E * sum_e (fraction of slots to e) * (mean prob of e)
        frac = counts.float() / fi.numel()
        self.last_aux = self.E * (frac * probs.mean(0)).sum()
        self.last_z = logits.logsumexp(-1).pow(2).mean()
        self.last_counts = counts.detach()
        order = fi.argsort()
        se = fi[order]  # expert of each sorted slot
        tok = torch.arange(N, device=x.device).repeat_interleave(self.k)[order]
        pos = torch.arange(fi.numel(), device=x.device) - (counts.cumsum(0) - counts)[se]
        cap = int(counts.max())
        buf = flat.new_zeros(self.E, cap, shp[-1])
        buf[se, pos] = flat[tok]
        g = torch.bmm(buf, self.w_gate.transpose(1, 2))
        u = torch.bmm(buf, self.w_up.transpose(1, 2))
        y = torch.bmm(F.silu(g) * u, self.w_down.transpose(1, 2))
        ws = topw.reshape(-1)[order]
        ys = y[se, pos].float() * ws[:, None]
        out = torch.zeros(N, shp[-1], device=x.device, dtype=torch.float32).index_add_(0, tok, ys)
        return out.to(x.dtype).reshape(shp)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c["d_model"], c["rms_norm_eps"])
        self.attn = Attention(c)
        self.ffn_norm = RMSNorm(c["d_model"], c["rms_norm_eps"])
        self.ffn = MoE(c) if c["arch"] == "llada_moe" else SwiGLU(c["d_model"], c["mlp_hidden"])

    def forward(self, x, cos, sin, mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.ffn(self.ffn_norm(x))


class DiffusionLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = dict(c)
        d = c["d_model"]
        self.embed = nn.Embedding(c["vocab_size"], d)
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.final_norm = RMSNorm(d, c["rms_norm_eps"])
        self.lm_head = nn.Linear(d, c["vocab_size"], bias=False)
        self._rope = {}
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        out_std = std / math.sqrt(2 * self.c["n_layers"])
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w_down.weight", "ffn.w_down")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def rope(self, T, device):
        key = (T, str(device))
        if key not in self._rope:
            self._rope[key] = rope_tables(T, self.c["head_dim"], self.c["rope_theta"], device)
        return self._rope[key]

    def hidden(self, ids, pos=None, mask=None):
        """ids [B, T]; pos [T] (default 0..T-1); mask [T, T] bool, True = may attend (default: all)."""
        if pos is None:
            cos, sin = self.rope(ids.shape[1], ids.device)
        else:
            cos, sin = self.rope(int(pos.max()) + 1, ids.device)
            cos, sin = cos[pos], sin[pos]
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.final_norm(x)

    def forward(self, ids, pos=None, mask=None):
        return self.lm_head(self.hidden(ids, pos, mask))

    def moe_layers(self):
        return [layer.ffn for layer in self.layers if isinstance(layer.ffn, MoE)]

    def aux_loss(self):
        m = self.moe_layers()
        if not m:
            return None, None
        return sum(x.last_aux for x in m) / len(m), sum(x.last_z for x in m) / len(m)


def tri_mask(L, block, device):
    """The joint objective's attention over [clean x0 (L) ; noisy xt (L)] (2L positions, both at 0..L-1):
    clean i sees clean j <= i (causal: the AR stream, and the K / V a causal pass writes to the cache);
    noisy i in block b sees the clean positions before the block (the cache) and its own noisy block
    bidirectionally, which is how the engine's drafts attend (shared/specs/nemotron-labs-diffusion.md)."""
    i = torch.arange(L, device=device)
    causal = i[None, :] <= i[:, None]
    bi = i // block
    before = i[None, :] < (bi * block)[:, None]
    same = bi[:, None] == bi[None, :]
    top = torch.cat([causal, torch.zeros(L, L, dtype=torch.bool, device=device)], 1)
    bottom = torch.cat([before, same], 1)
    return torch.cat([top, bottom], 0)


def param_counts(model):
    """(total, active per token) parameter counts; active counts k of E experts."""
    c = model.c
    total = sum(p.numel() for p in model.parameters())
    if c["arch"] != "llada_moe":
        return total, total
    per_expert = 3 * c["d_model"] * c["expert_hidden"]
    inactive = c["n_layers"] * (c["n_experts"] - c["top_k"]) * per_expert
    return total, total - inactive
