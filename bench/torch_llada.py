#!/usr/bin/env python3
"""A straightforward PyTorch eager LLaDA forward (the baseline tessera's CUDA backend is compared with).

Same geometry as tessera's `named_geometry` (llada-8b: d 4096, 32 layers, 32 heads x 128, ffn 12288,
vocab 126464), synthetic bf16 weights on the GPU, written the way the Hugging Face modelling code does
it: bf16 activations, RMSNorm in f32 then cast, rotate-half RoPE, F.scaled_dot_product_attention
(bidirectional; PyTorch picks its flash / memory-efficient kernel), SwiGLU FFN, LM head.
Two logits variants per step: "full" (LM head over every position, as the HF model does) and
"masked" (LM head over the masked positions only, the fair comparison with tessera's gather-GEMM).

Prints step latency (median of --reps after a warm-up, CUDA events), peak allocated memory per step,
and the largest context whose step fits a memory budget (weights included), found by measuring the
peak at two lengths, extrapolating the linear law, and checking the prediction with a real step.
Usage: python3 bench/torch_llada.py [--lengths 1024,4096] [--ratios 0.1,0.5,0.9] [--json FILE]
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

GEOMETRIES = {
    "llada-8b": dict(d=4096, layers=32, heads=32, ffn=12288, vocab=126464, theta=500000.0, eps=1e-5),
    "llada-mid": dict(d=1024, layers=4, heads=8, ffn=3072, vocab=126464, theta=500000.0, eps=1e-5),
}


def make_weights(g, dev):
    torch.manual_seed(0)
    d, f, v = g["d"], g["ffn"], g["vocab"]

    def w(*shape, scale):
        return (torch.rand(*shape, device=dev, dtype=torch.bfloat16) * 2 - 1) * scale

    sd, sf = 1 / math.sqrt(d), 1 / math.sqrt(f)
    layers = []
    for _ in range(g["layers"]):
        layers.append(dict(attn_norm=w(d, scale=0.1) + 1, wq=w(d, d, scale=sd), wk=w(d, d, scale=sd),
                           wv=w(d, d, scale=sd), wo=w(d, d, scale=sd), ffn_norm=w(d, scale=0.1) + 1,
                           wg=w(f, d, scale=sd), wu=w(f, d, scale=sd), wd=w(d, f, scale=sf)))
    return dict(embed=w(v, d, scale=1.0), final_norm=w(d, scale=0.1) + 1, lm_head=w(v, d, scale=sd),
                layers=layers)


def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16) * w


def rope_tables(L, hd, theta, dev):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.arange(L, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # x [1, H, L, hd] bf16; rotate-half in f32
    xf = x.float()
    h = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., h:], xf[..., :h]], dim=-1)
    return (xf * cos + rot * sin).to(torch.bfloat16)


def block(x, p, g, cos, sin):
    L = x.shape[0]
    H, hd = g["heads"], g["d"] // g["heads"]
    h = rmsnorm(x, p["attn_norm"], g["eps"])
    q = (h @ p["wq"].T).view(L, H, hd).transpose(0, 1)[None]
    k = (h @ p["wk"].T).view(L, H, hd).transpose(0, 1)[None]
    v = (h @ p["wv"].T).view(L, H, hd).transpose(0, 1)[None]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=False)
    x = x + a[0].transpose(0, 1).reshape(L, g["d"]) @ p["wo"].T
    m = rmsnorm(x, p["ffn_norm"], g["eps"])
    return x + (F.silu(m @ p["wg"].T) * (m @ p["wu"].T)) @ p["wd"].T


def head(x, W, g, masked_idx, full_logits):
    hn = rmsnorm(x, W["final_norm"], g["eps"])
    if full_logits:
        logits = (hn @ W["lm_head"].T)[masked_idx].float()
    else:
        logits = (hn[masked_idx] @ W["lm_head"].T).float()
    conf, tok = torch.softmax(logits, dim=-1).max(dim=-1)  # low-confidence remasking inputs
    return tok, conf


class Block(torch.nn.Module):
    """One layer with its weights as parameters (shared storage), for regional torch.compile."""

    def __init__(self, p, g):
        super().__init__()
        self.g = g
        self.w = torch.nn.ParameterDict({k: torch.nn.Parameter(t, requires_grad=False) for k, t in p.items()})

    def forward(self, x, cos, sin):
        return block(x, self.w, self.g, cos, sin)


class Head(torch.nn.Module):
    def __init__(self, W, g):
        super().__init__()
        self.g = g
        self.w = torch.nn.ParameterDict({k: torch.nn.Parameter(W[k], requires_grad=False)
                                         for k in ("final_norm", "lm_head")})

    def forward(self, x, masked_idx, full_logits: bool):
        return head(x, self.w, self.g, masked_idx, full_logits)


def compile_model(W, g, mode):
    """Regional compilation (PyTorch's recipe for repeated blocks): every layer is the same compiled
    block, so Inductor compiles and autotunes each shape once, not 32 times."""
    blocks = [torch.compile(Block(p, g), mode=mode, dynamic=False) for p in W["layers"]]
    return dict(blocks=blocks, head=torch.compile(Head(W, g), mode=mode, dynamic=False))


@torch.inference_mode()
def forward(W, g, tokens, masked_idx, full_logits, compiled=None):
    L = tokens.shape[0]
    cos, sin = rope_tables(L, g["d"] // g["heads"], g["theta"], tokens.device)
    x = W["embed"][tokens]
    if compiled is None:
        for p in W["layers"]:
            x = block(x, p, g, cos, sin)
        return head(x, W, g, masked_idx, full_logits)
    torch.compiler.cudagraph_mark_step_begin()  # a new step: the last step's graph outputs may be reused
    for b in compiled["blocks"]:
        x = b(x, cos, sin)
    return compiled["head"](x, masked_idx, full_logits)


def step_stats(W, g, L, ratio, full, reps, compiled=None):
    dev = "cuda"
    gen = torch.Generator(device="cpu").manual_seed(L)
    tokens = torch.randint(0, 100000, (L,), generator=gen).to(dev)
    n_mask = max(1, int(L * ratio))
    masked_idx = torch.randperm(L, generator=gen)[:n_mask].sort().values.to(dev)
    for _ in range(3 if compiled else 1):  # warm-up (compiled: compile, record its CUDA graphs, replay)
        forward(W, g, tokens, masked_idx, full, compiled)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        forward(W, g, tokens, masked_idx, full, compiled)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2], torch.cuda.max_memory_allocated()


def fits(W, g, L, ratio, full, budget_bytes):
    """Runs one step at L under a cap of budget_bytes of GPU memory in total (weights included)."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total))
    try:
        step_stats(W, g, L, ratio, full, 1)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def run_compiled(W, g, a, out):
    import time
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    compiled = compile_model(W, g, a.compile)
    out["compile_mode"] = a.compile
    print(f"torch.compile(mode={a.compile!r}), regional (one compiled block, {g['layers']} layers)")
    for L in [int(x) for x in a.lengths.split(",")]:
        for r in [float(x) for x in a.ratios.split(",")]:
            t0 = time.time()
            ms, peak = step_stats(W, g, L, r, False, a.reps, compiled)
            row = dict(L=L, mask_ratio=r, compiled_ms=ms, compiled_peak=peak,
                       warmup_s=time.time() - t0)
            out["rows"].append(row)
            print(f"{L:6d} {r:5.2f} | compiled masked {ms:9.1f} ms, peak {peak / 2**30:.2f} GiB "
                  f"(compile + warm-up + reps {row['warmup_s']:.0f} s)", flush=True)
            if a.json:
                with open(a.json, "w") as fh:
                    json.dump(out, fh, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="llada-8b", choices=sorted(GEOMETRIES))
    ap.add_argument("--lengths", default="1024,4096,16384,32768")
    ap.add_argument("--ratios", default="0.1,0.5,0.9")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budgets-gib", default="24,40,80")
    ap.add_argument("--lmax-ratio", type=float, default=0.5)
    ap.add_argument("--confirm-max", type=int, default=65536,
                    help="predictions above this length are reported unconfirmed (a step there takes long)")
    ap.add_argument("--masked-only", action="store_true", help="skip the full-logits variant")
    ap.add_argument("--compile", default="", metavar="MODE",
                    help="torch.compile every layer (regional) with this mode, e.g. max-autotune; "
                         "masked logits only; the JSON is rewritten after every row")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    g = GEOMETRIES[a.geometry]
    W = make_weights(g, "cuda")
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}; {a.geometry} weights "
          f"{weights / 2**30:.2f} GiB (bf16)")
    out = dict(geometry=a.geometry, torch=torch.__version__, device=torch.cuda.get_device_name(0),
               weight_bytes=weights, rows=[], lmax=[])
    if a.compile:
        return run_compiled(W, g, a, out)
    print(f"{'L':>6} {'mask':>5} | {'full ms':>9} {'full peak':>10} | {'masked ms':>9} {'masked peak':>11}")
    for L in [int(x) for x in a.lengths.split(",")]:
        for r in [float(x) for x in a.ratios.split(",")]:
            row = dict(L=L, mask_ratio=r)
            row["full_ms"] = row["full_peak"] = None
            for full in (False,) if a.masked_only else (True, False):
                key = "full" if full else "masked"
                try:
                    ms, peak = step_stats(W, g, L, r, full, a.reps)
                    row[key + "_ms"], row[key + "_peak"] = ms, peak
                except torch.cuda.OutOfMemoryError:
                    row[key + "_ms"], row[key + "_peak"] = None, None
                torch.cuda.empty_cache()
            out["rows"].append(row)
            f = lambda v, s: ("-" if a.masked_only else "OOM") if v is None else s  # noqa: E731
            print(f"{L:6d} {r:5.2f} | {f(row['full_ms'], '%9.1f' % (row['full_ms'] or 0))} "
                  f"{f(row['full_peak'], '%7.2f GiB' % ((row['full_peak'] or 0) / 2**30))} | "
                  f"{f(row['masked_ms'], '%9.1f' % (row['masked_ms'] or 0))} "
                  f"{f(row['masked_peak'], '%8.2f GiB' % ((row['masked_peak'] or 0) / 2**30))}")
    # Longest context per budget: peak(L) is linear in L here (flash attention keeps no L x L matrix);
    # fit it on two measured lengths, predict, then confirm with a real capped step (halving on failure).
    r = a.lmax_ratio
    for full in (True, False) if a.budgets_gib else ():  # --budgets-gib "": step times only
        _, p1 = step_stats(W, g, 2048, r, full, 1)
        _, p2 = step_stats(W, g, 8192, r, full, 1)
        slope = (p2 - p1) / (8192 - 2048)
        base = p1 - slope * 2048
        for b in [float(x) for x in a.budgets_gib.split(",")]:
            budget = b * 2**30
            pred = int((budget - base) / slope) // 1024 * 1024
            L = pred
            if pred <= a.confirm_max:
                while L >= 1024 and not fits(W, g, L, r, full, budget):
                    L = int(L * 0.9) // 1024 * 1024
            else:
                L = None
            res = dict(variant="full" if full else "masked", budget_gib=b, predicted=pred, confirmed=L)
            out["lmax"].append(res)
            print(f"L_max {res['variant']:>6} logits, {b:.0f} GiB (weights incl.), mask {r}: "
                  f"predicted {pred}, confirmed {L}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
