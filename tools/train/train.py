#!/usr/bin/env python3
"""Trains a masked-diffusion LM (LLaDA objective) on the tokenised corpus and exports it.

  train.py --preset tessera-tiny     --out tools/train/runs/tiny [--device cpu|cuda] [--time-budget-minutes 120]
  train.py --preset tessera-tiny-moe --out tools/train/runs/tiny-moe ...
  train.py --preset tessera-tiny-tri --init models/tessera-tiny --out tools/train/runs/tiny-tri ...
  (any preset field can be overridden: --d-model, --n-layers, --batch-size, --lr, --steps, ...)

Objective (LLaDA pretraining): for each sequence x0 of --seq-len tokens, t ~ U(eps, 1); every token is
replaced by <|mdm_mask|> with probability t; loss = sum over masked positions of CE(x0_i) / t, divided
by the number of tokens in the batch (B * L). Attention is bidirectional. Sequences are random
windows of the packed token stream (documents are <|startoftext|> ... <|endoftext|>).
MoE adds aux_coef * load-balancing loss (Switch: E * sum_e f_e * P_e) + z_coef * router z-loss.

Tri-mode objective (arch nemotron, Nemotron-Labs-Diffusion: one checkpoint that decodes autoregressively,
by block diffusion against a causal cache, and by self-speculation): each sequence runs as [x0 ; xt] under
model.tri_mask, the clean half causal and the noisy half in blocks of --block-size that see the clean
prefix before their block and themselves. xt masks each block with its own t ~ U(eps, 1). loss =
--ar-weight * (next-token CE of the clean half, mean) + --dlm-weight * (sum over masked positions of
CE / t, divided by B * L), the joint AR + masked-diffusion objective of the spec (section 3).

Optimiser AdamW (betas 0.9/0.95, weight decay on matrices only), linear warmup then cosine to
lr * min_lr_frac; the schedule's progress is max(step / --steps, elapsed / budget), so a time budget
gives a full cosine too. Gradient clipping at --clip. bf16 autocast on CUDA, fp32 on CPU.

Held-out evaluation (periodic on --eval-windows windows, final on the whole test split): for
t in {0.15, 0.5, 0.9}, a fixed (seeded) mask with ratio t on every 512-token window of the test
split; masked-token accuracy (argmax == target) and mean CE (nats/token) on the masked positions;
plus the LLaDA objective itself (t ~ U, 1/t weighting) as "held-out loss". Unigram baseline:
accuracy of always predicting the most frequent token of the TRAIN split, on the same masked
positions (and the CE of the train unigram distribution). For MoE: the expert load (fraction of
top-k slots per expert) per layer and its entropy (nats; the maximum is ln E).

Outputs in --out: log.jsonl (train loss per log step, evals), last.pt (checkpoint, --resume), best.pt
(lowest held-out loss), eval.json (final), and with --export DIR the HF model directory of best.pt.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from model import DiffusionLM, param_counts, tri_mask  # noqa: E402

PRESETS = {
    # dense LLaDA layout: 6.0M parameters (2.1M of them embeddings + LM head)
    "tessera-tiny": dict(arch="llada", d_model=256, n_layers=6, n_heads=4, n_kv_heads=4, mlp_hidden=512),
    # LLaDA-MoE layout: 13.1M total, 6.0M active (4 of 16 experts of 128 = the dense FFN's 512)
    "tessera-tiny-moe": dict(arch="llada_moe", d_model=256, n_layers=6, n_heads=4, n_kv_heads=4,
                             n_experts=16, top_k=4, expert_hidden=128),
    # Nemotron-Labs-Diffusion layout, tessera-tiny's geometry (so --init models/tessera-tiny fits)
    "tessera-tiny-tri": dict(arch="nemotron", d_model=256, n_layers=6, n_heads=4, n_kv_heads=4, mlp_hidden=512),
    "smoke-tri": dict(arch="nemotron", d_model=128, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden=256),
    # a small configuration for quick checks
    "smoke": dict(arch="llada", d_model=128, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden=256),
    "smoke-moe": dict(arch="llada_moe", d_model=128, n_layers=2, n_heads=2, n_kv_heads=2,
                      n_experts=8, top_k=2, expert_hidden=64),
}
EVAL_TS = (0.15, 0.5, 0.9)


# ------------------------------------------------------------------------------------------ data
class Data:
    def __init__(self, data_dir):
        tok = os.path.join(data_dir, "tokens")
        with open(os.path.join(tok, "meta.json")) as f:
            self.meta = json.load(f)
        self.train = np.fromfile(os.path.join(tok, "train.bin"), dtype="<u2")
        self.test = np.fromfile(os.path.join(tok, "test.bin"), dtype="<u2")
        self.mask_id = self.meta["mask_token_id"]
        self.vocab = self.meta["vocab_size"]
        counts = np.bincount(self.train, minlength=self.vocab).astype(np.float64)
        self.unigram_top = int(counts.argmax())
        p = (counts + 1e-9) / counts.sum()
        self.unigram_logp = torch.from_numpy(np.log(p)).float()

    def batch(self, rng, B, L, device):
        starts = rng.integers(0, len(self.train) - L, size=B)
        x = np.stack([self.train[s:s + L] for s in starts]).astype(np.int64)
        return torch.from_numpy(x).to(device)

    def test_windows(self, L, limit=None):
        n = len(self.test) // L
        w = torch.from_numpy(self.test[:n * L].astype(np.int64).reshape(n, L))
        if limit and limit < n:
            idx = torch.linspace(0, n - 1, limit).round().long()  # spread over the split
            w = w[idx]
        return w


# ------------------------------------------------------------------------------------------ loss
def llada_loss(model, x0, mask_id, gen=None, eps=1e-3, t=None):
    """Returns (loss, masked count). loss = sum_masked CE / t  /  (B*L)  (LLaDA's pretraining loss)."""
    B, L = x0.shape
    if t is None:
        t = torch.rand(B, device=x0.device, generator=gen)
        t = (1 - eps) * t + eps
    p_mask = t[:, None].expand(B, L)
    masked = torch.rand(B, L, device=x0.device, generator=gen) < p_mask
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    h = model.hidden(xt)
    hm = h[masked]
    if hm.shape[0] == 0:
        return h.sum() * 0.0, 0
    logits = model.lm_head(hm).float()
    ce = F.cross_entropy(logits, x0[masked], reduction="none")
    return (ce / p_mask[masked]).sum() / (B * L), int(hm.shape[0])


class Scores:
    """Held-out prediction figures summed over batches: accuracy (argmax == target) and CE of the predicted
    positions, and of the train split's unigram baseline on the same positions."""

    def __init__(self, data):
        self.data = data
        self.n = self.correct = self.base_correct = 0
        self.ce = self.base_ce = 0.0

    def add(self, logits, tgt):
        self.ce += F.cross_entropy(logits, tgt, reduction="sum").item()
        self.correct += (logits.argmax(-1) == tgt).sum().item()
        tc = tgt.cpu()
        self.base_correct += (tc == self.data.unigram_top).sum().item()
        self.base_ce -= self.data.unigram_logp[tc].sum().item()
        self.n += tgt.numel()

    def result(self, count_key, unigram=True):
        r = {count_key: self.n, "acc": self.correct / self.n, "ce": self.ce / self.n}
        if unigram:
            r.update({"unigram_acc": self.base_correct / self.n, "unigram_ce": self.base_ce / self.n})
        return r


def tri_loss(model, x0, mask_id, block, ar_w, dlm_w, gen=None, eps=1e-3, t=None):
    """The tri-mode objective (module doc): (loss, AR CE, DLM loss, masked count). t: per-block ratios
    [B, L / block] (default: drawn)."""
    B, L = x0.shape
    nb = (L + block - 1) // block
    if t is None:
        t = (1 - eps) * torch.rand(B, nb, device=x0.device, generator=gen) + eps
    p_mask = t.repeat_interleave(block, dim=1)[:, :L]
    masked = torch.rand(B, L, device=x0.device, generator=gen) < p_mask
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    pos = torch.arange(L, device=x0.device).repeat(2)
    h = model.hidden(torch.cat([x0, xt], 1), pos, tri_mask(L, block, x0.device))
    ar = F.cross_entropy(model.lm_head(h[:, :L - 1]).float().reshape(-1, model.c["vocab_size"]),
                         x0[:, 1:].reshape(-1))
    hm = h[:, L:][masked]
    dlm = h.sum() * 0.0
    if hm.shape[0]:
        ce = F.cross_entropy(model.lm_head(hm).float(), x0[masked], reduction="none")
        dlm = (ce / p_mask[masked]).sum() / (B * L)
    return ar_w * ar + dlm_w * dlm, ar, dlm, int(hm.shape[0])


@torch.no_grad()
def evaluate_tri(model, data, L, device, block, windows=None, batch=16, seed=1234, amp=None):
    """Held-out metrics of the tri-mode objective: next-token accuracy / CE of the causal stream, and for t
    in EVAL_TS the masked accuracy / CE of the block-diffusion stream (every block masked at ratio t, fixed
    seed); "loss" is AR CE + the DLM objective (per-block t ~ U, seeded)."""
    model.eval()
    W = data.test_windows(L, windows)
    res = {"windows": int(W.shape[0]), "tokens": int(W.numel())}
    pos = torch.arange(L, device=device).repeat(2)
    att = tri_mask(L, block, device)
    causal = att[:L, :L]
    nb = (L + block - 1) // block
    sc = Scores(data)
    for i in range(0, W.shape[0], batch):
        x0 = W[i:i + batch].to(device)
        with amp():
            h = model.hidden(x0, None, causal)[:, :L - 1].float()
        sc.add(model.lm_head(h).float().reshape(-1, model.c["vocab_size"]), x0[:, 1:].reshape(-1))
    res["ar"] = sc.result("tokens")
    for t in EVAL_TS:
        g = torch.Generator().manual_seed(seed + int(t * 1000))
        sc = Scores(data)
        for i in range(0, W.shape[0], batch):
            x0 = W[i:i + batch]
            masked = torch.rand(x0.shape, generator=g) < t
            xt = torch.where(masked, torch.full_like(x0, data.mask_id), x0)
            with amp():
                h = model.hidden(torch.cat([x0, xt], 1).to(device), pos, att)[:, L:].float()
            sc.add(model.lm_head(h[masked.to(device)]).float(), x0[masked].to(device))
        res[f"t={t}"] = sc.result("masked", unigram=False)
    g = torch.Generator().manual_seed(seed)
    gm = torch.Generator(device=device).manual_seed(seed + 1)  # the masks: seeded too
    tot = cnt = 0.0
    for i in range(0, W.shape[0], batch):
        x0 = W[i:i + batch]
        tt = (1 - 1e-3) * torch.rand(x0.shape[0], nb, generator=g) + 1e-3
        with amp():
            _, ar, dlm, _ = tri_loss(model, x0.to(device), data.mask_id, block, 1.0, 1.0, gen=gm,
                                     t=tt.to(device))
        tot += (float(ar) + float(dlm)) * x0.shape[0]
        cnt += x0.shape[0]
    res["loss"] = tot / cnt
    model.train()
    return res


@torch.no_grad()
def evaluate(model, data, L, device, windows=None, batch=16, seed=1234, amp=None):
    """Held-out metrics on fixed masks (see the module doc)."""
    model.eval()
    W = data.test_windows(L, windows)
    res = {"windows": int(W.shape[0]), "tokens": int(W.numel())}
    moes = model.moe_layers()
    load = [torch.zeros(m.E, dtype=torch.float64) for m in moes]
    for t in EVAL_TS:
        g = torch.Generator().manual_seed(seed + int(t * 1000))
        sc = Scores(data)
        for i in range(0, W.shape[0], batch):
            x0 = W[i:i + batch]
            masked = torch.rand(x0.shape, generator=g) < t
            xt = torch.where(masked, torch.full_like(x0, data.mask_id), x0).to(device)
            with amp():
                h = model.hidden(xt).float()
            for k, m in enumerate(moes):
                load[k] += m.last_counts.double().cpu()
            sc.add(model.lm_head(h[masked.to(device)]).float(), x0[masked].to(device))
        res[f"t={t}"] = sc.result("masked")
    g = torch.Generator().manual_seed(seed)
    tot, cnt = 0.0, 0
    for i in range(0, W.shape[0], batch):
        x0 = W[i:i + batch]
        tt = (1 - 1e-3) * torch.rand(x0.shape[0], generator=g) + 1e-3
        masked = torch.rand(x0.shape, generator=g) < tt[:, None]
        xt = torch.where(masked, torch.full_like(x0, data.mask_id), x0).to(device)
        with amp():
            h = model.hidden(xt).float()
        mk = masked.to(device)
        ce = F.cross_entropy(model.lm_head(h[mk]).float(), x0[masked].to(device), reduction="none")
        tot += (ce / tt[:, None].expand_as(x0)[masked].to(device)).sum().item()
        cnt += x0.numel()
    res["loss"] = tot / cnt
    if moes:
        res["expert_load"] = []
        for k, ld in enumerate(load):
            p = ld / ld.sum()
            ent = float(-(p[p > 0] * p[p > 0].log()).sum())
            res["expert_load"].append({"layer": k, "entropy": ent, "max_entropy": math.log(len(p)),
                                       "normalized": ent / math.log(len(p)),
                                       "max_share": float(p.max()), "min_share": float(p.min()),
                                       "load": [round(float(v), 4) for v in p]})
    model.train()
    return res


def eval_line(r):
    s = f"held-out loss {r['loss']:.4f}"
    if "ar" in r:
        s += f" | ar: acc {r['ar']['acc']:.3f} (unigram {r['ar']['unigram_acc']:.3f}) ce {r['ar']['ce']:.3f}"
    for t in EVAL_TS:
        e = r[f"t={t}"]
        s += f" | t={t}: acc {e['acc']:.3f}" + (f" (unigram {e['unigram_acc']:.3f})" if "unigram_acc" in e else "")
        s += f" ce {e['ce']:.3f}"
    if "expert_load" in r:
        s += " | expert entropy " + " ".join(f"{x['entropy']:.2f}" for x in r["expert_load"])
        s += f" / {r['expert_load'][0]['max_entropy']:.2f}"
    return s


# ------------------------------------------------------------------------------------------ main
def repo_argv():
    """sys.argv as a command run from the repository root (paths inside the repo made relative)."""
    root = os.path.dirname(os.path.dirname(HERE))
    out = []
    for x in sys.argv:
        ax = os.path.abspath(x) if os.path.isabs(x) or os.path.exists(x) else None
        if ax and (ax == root or ax.startswith(root + os.sep)):
            x = os.path.relpath(ax, root)
        out.append(x)
    return out


def save_checkpoint(ck, out_dir, name):
    """torch.save to OUT/NAME through a temporary file, so an interrupted save never leaves a torn checkpoint."""
    tmp = os.path.join(out_dir, name + ".tmp")
    torch.save(ck, tmp)
    os.replace(tmp, os.path.join(out_dir, name))


def cpu_bf16_fast():
    """True where a bf16 matmul on this CPU is clearly faster than an fp32 one."""
    a = torch.randn(512, 512)
    res = {}
    for dt in (torch.float32, torch.bfloat16):
        x = a.to(dt)
        x @ x
        t0 = time.time()
        for _ in range(4):
            x @ x
        res[dt] = time.time() - t0
    return res[torch.bfloat16] < 0.5 * res[torch.float32]


def build_config(a, meta):
    c = dict(PRESETS[a.preset]) if a.preset else {}
    for k in ("arch", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "n_experts", "top_k",
              "expert_hidden"):
        v = getattr(a, k)
        if v is not None:
            c[k] = v
    if "arch" not in c:
        raise SystemExit("give --preset or --arch and the sizes")
    c.setdefault("n_kv_heads", c["n_heads"])
    c["head_dim"] = c["d_model"] // c["n_heads"]
    c["vocab_size"] = meta["vocab_size"]
    c["max_seq_len"] = a.seq_len
    c["rope_theta"] = a.rope_theta
    c["rms_norm_eps"] = 1e-5
    c["qk_norm"] = c["arch"] == "llada_moe"
    if c["arch"] == "nemotron":
        c["block_size"] = a.block_size
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--arch", choices=["llada", "llada_moe", "nemotron"])
    for k in ("d-model", "n-layers", "n-heads", "n-kv-heads", "mlp-hidden", "n-experts", "top-k",
              "expert-hidden"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--export", default="", help="write the HF model directory of best.pt here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=None, help="default 8 on cpu, 128 on cuda")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=None, help="default 1e-3 on cpu, 2e-3 on cuda")
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=0, help="max optimizer steps (0: time budget only)")
    ap.add_argument("--time-budget-minutes", type=float, default=0.0)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--aux-coef", type=float, default=0.01, help="MoE load-balancing loss weight")
    ap.add_argument("--z-coef", type=float, default=1e-3, help="MoE router z-loss weight")
    ap.add_argument("--block-size", type=int, default=32, help="tri-mode: the diffusion block")
    ap.add_argument("--ar-weight", type=float, default=1.0, help="tri-mode: weight of the AR loss")
    ap.add_argument("--dlm-weight", type=float, default=1.0, help="tri-mode: weight of the diffusion loss")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-windows", type=int, default=48, help="periodic eval windows (final: all)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--ckpt-every-minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="autocast: auto = bf16 on CUDA, and on CPU where bf16 GEMM beats fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: all cores)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2.x)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    ap.add_argument("--init", default="", help="start from the weights of an exported model directory")
    ap.add_argument("--bench-steps", type=int, default=0, help="time N steps (after 2 warm-up) and exit")
    a = ap.parse_args()

    if a.steps <= 0 and a.time_budget_minutes <= 0 and a.bench_steps <= 0:
        raise SystemExit("give --steps and/or --time-budget-minutes")
    dev = torch.device(a.device)
    if dev.type == "cpu":
        torch.set_num_threads(a.threads or os.cpu_count() or 1)
    bs = a.batch_size or (128 if dev.type == "cuda" else 8)
    lr = a.lr or (2e-3 if dev.type == "cuda" else 1e-3)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    data = Data(a.data)
    c = build_config(a, data.meta)
    # bf16 autocast: on CUDA always; on CPU too by default, because Debian's torch does fp32 GEMMs with
    # the reference BLAS (~6 GFLOP/s here) but bf16 ones with oneDNN (~900 GFLOP/s on AVX512-BF16)
    use_amp = a.precision == "bf16" or (a.precision == "auto" and (dev.type == "cuda" or cpu_bf16_fast()))

    def amp():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp)

    tri = c["arch"] == "nemotron"
    if tri:
        def evaluate_fn(m, d, L, dv, windows, amp):
            return evaluate_tri(m, d, L, dv, c["block_size"], windows, amp=amp)
    else:
        evaluate_fn = evaluate
    model = DiffusionLM(c).to(dev)
    if a.init:  # continue from an exported model directory (its weights; a fresh optimiser and schedule)
        from export import load_model_dir
        src = load_model_dir(a.init, "cpu")
        try:
            model.load_state_dict(src.state_dict(), strict=True)
        except RuntimeError as e:
            raise SystemExit(f"--init {a.init}: its weights do not fit this run's model ({e})")
        print(f"initialised from {a.init}", flush=True)
    total, active = param_counts(model)
    emb = 2 * c["vocab_size"] * c["d_model"]
    print(f"model {c['arch']}: {total / 1e6:.2f}M parameters ({active / 1e6:.2f}M active, "
          f"{emb / 1e6:.2f}M embedding + head); train {len(data.train)} tokens, test {len(data.test)}; "
          f"batch {bs}x{a.seq_len} x{a.grad_accum}, lr {lr}, device {dev}, bf16 autocast {use_amp}, "
          f"torch {torch.__version__}",
          flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    kw = {"fused": True} if dev.type == "cuda" and "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                            eps=1e-8, **kw)

    if a.compile and hasattr(torch, "compile"):
        model.hidden = torch.compile(model.hidden)  # the trunk; masked-row gathers stay eager

    os.makedirs(a.out, exist_ok=True)
    step, best, train_time, tokens_seen = 0, float("inf"), 0.0, 0
    rng = np.random.default_rng(a.seed)
    gen = torch.Generator(device=dev).manual_seed(a.seed + 1)
    if a.resume and os.path.exists(os.path.join(a.out, "last.pt")):
        ck = torch.load(os.path.join(a.out, "last.pt"), map_location=dev)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, best, train_time, tokens_seen = ck["step"], ck["best"], ck["train_time"], ck["tokens"]
        rng = np.random.default_rng(a.seed + step)
        gen.manual_seed(a.seed + 1 + step)
        print(f"resumed at step {step}")
    logf = open(os.path.join(a.out, "log.jsonl"), "a")

    def log(obj):
        logf.write(json.dumps(obj) + "\n")
        logf.flush()

    run_info = {"event": "start", "config": c, "args": vars(a), "batch_size": bs, "lr": lr,
                "params_total": total, "params_active": active, "torch": torch.__version__, "bf16": use_amp,
                "device": str(dev), "argv": repo_argv()}
    if dev.type == "cuda":
        run_info["gpu"] = torch.cuda.get_device_name(dev)
    log(run_info)

    def save(name, extra=None):
        ck = {"model": model.state_dict(), "config": c, "step": step, "best": best,
              "train_time": train_time, "tokens": tokens_seen, "args": vars(a)}
        if extra:
            ck.update(extra)
        save_checkpoint(ck, a.out, name)

    budget = a.time_budget_minutes * 60.0
    t_start = time.time() - train_time
    last_ckpt = time.time()
    eval_seconds = 0.0
    last_eval_step = -1
    losses = []
    model.train()
    bench_t0 = None
    while True:
        elapsed = time.time() - t_start
        p_steps = step / a.steps if a.steps > 0 else 0.0
        # keep time for the final evaluation (full split + one periodic-size pass) and the export
        reserve = eval_seconds * (1.0 + max(1.0, (len(data.test) // a.seq_len) / a.eval_windows)) + 15.0
        p_time = elapsed / max(1.0, budget - reserve) if budget > 0 else 0.0
        progress = max(p_steps, p_time)
        if a.bench_steps and step == a.bench_steps + 2:
            break
        if not a.bench_steps and progress >= 1.0:
            break
        if step < a.warmup:
            cur_lr = lr * (step + 1) / a.warmup
        else:
            cur_lr = lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for gparam in opt.param_groups:
            gparam["lr"] = cur_lr
        if a.bench_steps and step == 2:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            bench_t0 = time.time()
        t0 = time.time()
        tot_loss = tot_aux = 0.0
        for _ in range(a.grad_accum):
            x0 = data.batch(rng, bs, a.seq_len, dev)
            with amp():
                if tri:
                    loss, _, _, _ = tri_loss(model, x0, data.mask_id, c["block_size"], a.ar_weight,
                                             a.dlm_weight, gen)
                else:
                    loss, _ = llada_loss(model, x0, data.mask_id, gen)
                aux, z = model.aux_loss()
                full = loss
                if aux is not None:
                    full = loss + a.aux_coef * aux + a.z_coef * z
                    tot_aux += float(aux) / a.grad_accum
            (full / a.grad_accum).backward()
            tot_loss += float(loss) / a.grad_accum
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += bs * a.seq_len * a.grad_accum
        train_time = time.time() - t_start
        losses.append(tot_loss)
        if step % a.log_every == 0 or step == 1:
            rec = {"event": "train", "step": step, "loss": sum(losses) / len(losses), "lr": cur_lr,
                   "grad_norm": float(gnorm), "tokens": tokens_seen, "elapsed": round(train_time, 1),
                   "step_seconds": round(time.time() - t0, 3)}
            if tot_aux:
                rec["aux"] = tot_aux
            log(rec)
            print(f"step {step:6d} loss {rec['loss']:.4f} lr {cur_lr:.2e} gnorm {float(gnorm):.2f} "
                  f"{rec['step_seconds']:.2f}s/step {tokens_seen / 1e6:.1f}M tok {train_time / 60:.1f} min"
                  + (f" aux {tot_aux:.3f}" if tot_aux else ""), flush=True)
            losses = []
        if a.bench_steps:
            continue
        if step % a.eval_every == 0:
            te = time.time()
            r = evaluate_fn(model, data, a.seq_len, dev, a.eval_windows, amp=amp)
            eval_seconds = time.time() - te
            last_eval_step = step
            log({"event": "eval", "step": step, "partial": True, **r})
            print(f"eval step {step}: {eval_line(r)} ({eval_seconds:.0f}s)", flush=True)
            if r["loss"] < best:
                best = r["loss"]
                save("best.pt", {"eval": r})
        if time.time() - last_ckpt > a.ckpt_every_minutes * 60:
            save("last.pt", {"opt": opt.state_dict()})
            last_ckpt = time.time()

    if a.bench_steps:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        dt = (time.time() - bench_t0) / a.bench_steps
        tok = bs * a.seq_len * a.grad_accum
        print(json.dumps({"bench": True, "arch": c["arch"], "params_total": total, "params_active": active,
                          "batch": bs, "seq_len": a.seq_len, "seconds_per_step": round(dt, 3),
                          "tokens_per_second": round(tok / dt, 1), "device": str(dev),
                          "threads": torch.get_num_threads()}))
        return 0

    # final: full held-out evaluation of the last weights; best.pt keeps the best periodic eval
    save("last.pt", {"opt": opt.state_dict()})
    r = evaluate_fn(model, data, a.seq_len, dev, None, amp=amp)
    final_train = None
    for line in open(os.path.join(a.out, "log.jsonl")):
        o = json.loads(line)
        if o.get("event") == "train":
            final_train = o["loss"]
    log({"event": "eval", "step": step, "partial": False, **r})
    print(f"final eval step {step}: {eval_line(r)}", flush=True)
    chosen = "last.pt"
    if last_eval_step != step and os.path.exists(os.path.join(a.out, "best.pt")):
        bk = torch.load(os.path.join(a.out, "best.pt"), map_location="cpu")
        # best.pt's figure is on the periodic subset: compare on the same subset
        rl = evaluate_fn(model, data, a.seq_len, dev, a.eval_windows, amp=amp)
        if bk["best"] < rl["loss"] - 1e-4:
            chosen = "best.pt"
    summary = {"steps": step, "tokens": tokens_seen, "train_seconds": round(train_time, 1),
               "final_train_loss": final_train, "heldout": r, "checkpoint": chosen,
               "config": c, "params_total": total, "params_active": active, "batch_size": bs, "lr": lr,
               "seed": a.seed, "argv": repo_argv(), "device": str(dev), "torch": torch.__version__}
    if chosen == "last.pt":
        save("best.pt", {"eval": r})
    with open(os.path.join(a.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"trained {step} steps, {tokens_seen / 1e6:.1f}M tokens in {train_time / 60:.1f} min; "
          f"final train loss {final_train:.4f}; export checkpoint: {chosen}")
    if a.export:
        from export import write_model_dir
        ck = torch.load(os.path.join(a.out, chosen), map_location="cpu")
        m = DiffusionLM(ck["config"])
        m.load_state_dict(ck["model"])
        files = write_model_dir(m, a.data, a.export)
        print(f"exported {a.export}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
