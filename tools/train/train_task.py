#!/usr/bin/env python3
"""Fine-tunes a masked-diffusion LM on the generated tasks of tasks.py (LLaDA's SFT objective) and exports it.

  train_task.py --init models/tessera-tiny --out tools/train/runs/task --time-budget-minutes 80 \
                --export models/tessera-task [--resume]

Every example is one row: <|startoftext|> prompt target <|endoftext|>..., the <|endoftext|> padding running to
the longest row of the batch (at least --response-len tokens after the prompt), as LLaDA's SFT pads. Only the
response (target and padding) is noised: per row t ~ U(eps, 1), each response token masked with probability t;
loss = mean over rows of (sum over masked positions of CE / t) / response length. Attention is bidirectional;
batches hold rows of similar length (a pool sorted by length, cut at --batch-tokens), so padding stays small.
The prompt is never masked, so the model learns p(response | prompt): a canvas of --response-len masks after a
prompt is exactly what `tessera generate --gen-length 48` decodes.

Periodic held-out figure (cheap): the response wholly masked, one forward, the share of rows whose argmax
answer is exactly right ("one-shot"). The real score is `tessera eval --task`, on the exported weights.
Checkpoints every --ckpt-every-minutes to OUT/last.pt; --resume continues from it (same data stream position).
"""
import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tasks  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from model import DiffusionLM, param_counts  # noqa: E402
from train import cpu_bf16_fast, repo_argv, save_checkpoint  # noqa: E402


def data_dir(out, tok_src):
    """export.write_model_dir's data directory (tokens/meta.json, tokenizer/*) for the bundled tokenizer."""
    d = os.path.join(out, "data")
    os.makedirs(os.path.join(d, "tokens"), exist_ok=True)
    os.makedirs(os.path.join(d, "tokenizer"), exist_ok=True)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_src, fn), os.path.join(d, "tokenizer", fn))
    with open(os.path.join(tok_src, "config.json")) as f:
        cfg = json.load(f)
    meta = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "mask_token_id", "pad_token_id")}
    meta["vocab_size"] = cfg.get("embedding_size", cfg.get("vocab_size"))
    with open(os.path.join(d, "tokens", "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return d, meta


class Rows:
    """Tokenised examples cut into length-bucketed batches."""

    def __init__(self, tok, meta, response_len):
        self.tok, self.meta, self.R = tok, meta, response_len

    def encode(self, e):
        p = [self.meta["bos_token_id"]] + self.tok.encode(e["prompt"])
        t = self.tok.encode(e["target"]) + [self.meta["eos_token_id"]]
        if len(t) > self.R:
            raise SystemExit(f"a {e['task']} target takes {len(t)} tokens, over --response-len {self.R}")
        return p, t

    def batches(self, examples, batch_tokens, r):
        enc = sorted((self.encode(e) for e in examples), key=lambda pt: len(pt[0]))
        out, cur = [], []
        for pt in enc:
            L = len(pt[0]) + self.R
            if cur and (len(cur) + 1) * L > batch_tokens:
                out.append(cur)
                cur = []
            cur.append(pt)
        if cur:
            out.append(cur)
        r.shuffle(out)
        return out

    def tensors(self, batch, device):
        L = max(len(p) for p, _ in batch) + self.R
        eos = self.meta["eos_token_id"]
        x = torch.full((len(batch), L), eos, dtype=torch.long)
        resp = torch.zeros(len(batch), L, dtype=torch.bool)
        for i, (p, t) in enumerate(batch):
            x[i, :len(p)] = torch.tensor(p)
            x[i, len(p):len(p) + len(t)] = torch.tensor(t)
            resp[i, len(p):] = True
        return x.to(device), resp.to(device)


def sft_loss(model, x0, resp, mask_id, gen, eps=1e-3):
    B, L = x0.shape
    t = (1 - eps) * torch.rand(B, device=x0.device, generator=gen) + eps
    masked = resp & (torch.rand(B, L, device=x0.device, generator=gen) < t[:, None])
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    h = model.hidden(xt)
    logits = model.lm_head(h[masked]).float()
    ce = F.cross_entropy(logits, x0[masked], reduction="none")
    w = (1.0 / t[:, None]).expand(B, L)[masked] / resp.sum(1, keepdim=True).expand(B, L)[masked]
    return (ce * w).sum() / B


@torch.no_grad()
def one_shot(model, rows, examples, device, amp):
    """Share of examples whose wholly masked response's argmax gives the exact answer, per task."""
    model.eval()
    hits, counts = {}, {}
    for batch_ex in [examples[i:i + 16] for i in range(0, len(examples), 16)]:
        batch = [rows.encode(e) for e in batch_ex]
        x, resp = rows.tensors(batch, device)
        xt = torch.where(resp, torch.full_like(x, rows.meta["mask_token_id"]), x)
        with amp():
            pred = model(xt).float().argmax(-1)
        for i, e in enumerate(batch_ex):
            ids = pred[i][resp[i]].tolist()
            eos = rows.meta["eos_token_id"]
            ids = ids[:ids.index(eos)] if eos in ids else ids
            ok = tasks.extract(rows.tok.decode(ids)) == e["answer"]
            hits[e["task"]] = hits.get(e["task"], 0) + int(ok)
            counts[e["task"]] = counts.get(e["task"], 0) + 1
    model.train()
    return {k: hits[k] / counts[k] for k in counts}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", default=os.path.join(ROOT, "models", "tessera-tiny"),
                    help="exported LLaDA model directory to start from (its weights and tokenizer)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--export", default="")
    ap.add_argument("--seq-len", type=int, default=1024, help="the exported model's context")
    ap.add_argument("--response-len", type=int, default=48)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--pool", type=int, default=1024, help="examples sorted into batches at a time")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--aux-coef", type=float, default=0.01,
                    help="MoE models: weight of the load-balancing loss (train.py's Switch loss)")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--time-budget-minutes", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-per-task", type=int, default=32)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--ckpt-every-minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: bf16 autocast on the GPU (the data stream stays on the CPU: ~1M tokens/s)")
    ap.add_argument("--mix", default="",
                    help="task weights, e.g. lookup=3,add=1,sort=1,reverse=1,trace=1 (default: the tasks in turn)")
    ap.add_argument("--lookup-max-records", type=int, default=150,
                    help="cap the training lookups' records (a curriculum; the held-out set keeps 4-150)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--bench-steps", type=int, default=0)
    a = ap.parse_args()
    if a.steps <= 0 and a.time_budget_minutes <= 0 and a.bench_steps <= 0:
        raise SystemExit("give --steps and/or --time-budget-minutes")
    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    use_amp = dev.type == "cuda" or cpu_bf16_fast()

    def amp():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp)

    os.makedirs(a.out, exist_ok=True)
    ddir, meta = data_dir(a.out, a.init)
    tok = Tokenizer(os.path.join(ddir, "tokenizer", "tokenizer.json"))
    rows = Rows(tok, meta, a.response_len)
    from export import load_model_dir, write_model_dir
    src = load_model_dir(a.init, "cpu")
    c = dict(src.c)
    c["max_seq_len"] = a.seq_len
    model = DiffusionLM(c)
    model.load_state_dict(src.state_dict())
    del src
    model.to(dev)
    total, _ = param_counts(model)
    held = tasks.heldout(a.eval_per_task)
    exclude = {e["prompt"] for e in tasks.heldout(200)}  # the bundled held-out set's prompts
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    step, train_time, examples_seen, tokens_seen, best = 0, 0.0, 0, 0, -1.0
    if a.resume and os.path.exists(os.path.join(a.out, "last.pt")):
        ck = torch.load(os.path.join(a.out, "last.pt"), map_location="cpu")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, train_time, examples_seen, tokens_seen, best = (ck["step"], ck["train_time"], ck["examples"],
                                                             ck["tokens"], ck["best"])
        print(f"resumed at step {step}", flush=True)
    # the data stream is a function of (seed, pool index): a resumed run regenerates the pools it had used
    mix = None
    if a.mix:
        try:
            mix = {k: float(v) for k, v in (kv.split("=") for kv in a.mix.split(","))}
        except ValueError:
            raise SystemExit(f"--mix {a.mix!r}: expected task=weight,... (tasks: {', '.join(tasks.TASKS)})")
        if set(mix) - set(tasks.TASKS) or not any(w > 0 for w in mix.values()):
            raise SystemExit(f"--mix {a.mix!r}: tasks are {', '.join(tasks.TASKS)}, weights >= 0, one above 0")
    if not 4 <= a.lookup_max_records <= 150:
        raise SystemExit("--lookup-max-records: between 4 and 150")
    stream = tasks.stream(a.seed, exclude, mix, a.lookup_max_records)
    r = random.Random(a.seed)
    gen = torch.Generator(device=dev).manual_seed(a.seed + 1 + step)
    pending = []
    skip = examples_seen
    logf = open(os.path.join(a.out, "log.jsonl"), "a")

    def log(o):
        logf.write(json.dumps(o) + "\n")
        logf.flush()

    log({"event": "start", "step": step, "minutes": train_time / 60, "config": c, "args": vars(a),
         "params_total": total, "bf16": use_amp, "device": str(dev),
         "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
         "torch": torch.__version__, "argv": repo_argv(), "threads": torch.get_num_threads()})
    print(f"model {c['arch']} {total / 1e6:.2f}M parameters, context {a.seq_len}, response {a.response_len}, "
          f"~{a.batch_tokens} tokens a batch, lr {a.lr}, bf16 autocast {use_amp}, device {dev}, "
          f"threads {torch.get_num_threads()}",
          flush=True)

    def save(name):
        ck = {"model": model.state_dict(), "opt": opt.state_dict(), "config": c, "step": step,
              "train_time": train_time, "examples": examples_seen, "tokens": tokens_seen, "best": best}
        save_checkpoint(ck, a.out, name)

    budget = a.time_budget_minutes * 60.0
    t_start = time.time() - train_time
    last_ckpt = time.time()
    losses = []
    bench_t0 = None
    model.train()
    while True:
        elapsed = time.time() - t_start
        progress = max(step / a.steps if a.steps else 0.0, elapsed / budget if budget else 0.0)
        if a.bench_steps and step == a.bench_steps + 2:
            break
        if not a.bench_steps and progress >= 1.0:
            break
        if a.bench_steps and step == 2:
            bench_t0 = time.time()
        if not pending:
            pool = [next(stream) for _ in range(a.pool)]
            while skip >= len(pool):  # resuming: pools already trained on
                skip -= len(pool)
                pool = [next(stream) for _ in range(a.pool)]
            if skip:
                pool, skip = pool[skip:], 0
            pending = rows.batches(pool, a.batch_tokens, r)
        batch = pending.pop()
        cur_lr = a.lr * (step + 1) / a.warmup if step < a.warmup else \
            a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
        for g in opt.param_groups:
            g["lr"] = cur_lr
        t0 = time.time()
        x, resp = rows.tensors(batch, dev)
        with amp():
            loss = sft_loss(model, x, resp, meta["mask_token_id"], gen)
        aux, _ = model.aux_loss()  # None for a dense model
        (loss if aux is None else loss + a.aux_coef * aux).backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        examples_seen += len(batch)
        tokens_seen += x.numel()
        train_time = time.time() - t_start
        losses.append(float(loss))
        if step % a.log_every == 0 or step == 1:
            rec = {"event": "train", "step": step, "loss": sum(losses) / len(losses), "lr": cur_lr,
                   "grad_norm": float(gnorm), "examples": examples_seen, "tokens": tokens_seen,
                   "elapsed": round(train_time, 1), "step_seconds": round(time.time() - t0, 3)}
            log(rec)
            print(f"step {step:5d} loss {rec['loss']:.4f} lr {cur_lr:.2e} gnorm {float(gnorm):.2f} "
                  f"{rec['step_seconds']:.2f}s/step ({x.shape[0]}x{x.shape[1]}) {examples_seen} ex "
                  f"{tokens_seen / 1e6:.2f}M tok {train_time / 60:.1f} min", flush=True)
            losses = []
        if a.bench_steps:
            continue
        if step % a.eval_every == 0:
            acc = one_shot(model, rows, held, dev, amp)
            mean = sum(acc.values()) / len(acc)
            log({"event": "eval", "step": step, "one_shot": acc, "mean": mean})
            print(f"eval step {step}: one-shot " + " ".join(f"{k} {v:.2f}" for k, v in acc.items()), flush=True)
            if mean >= best:
                best = mean
                save("best.pt")
        if time.time() - last_ckpt > a.ckpt_every_minutes * 60:
            save("last.pt")
            last_ckpt = time.time()
    if a.bench_steps:
        dt = (time.time() - bench_t0) / a.bench_steps
        print(json.dumps({"seconds_per_step": round(dt, 3), "threads": torch.get_num_threads(),
                          "device": str(dev)}))
        return 0
    save("last.pt")
    acc = one_shot(model, rows, held, dev, amp)
    log({"event": "eval", "step": step, "one_shot": acc, "mean": sum(acc.values()) / len(acc), "final": True})
    summary = {"steps": step, "examples": examples_seen, "tokens": tokens_seen, "train_seconds": round(train_time, 1),
               "one_shot": acc, "config": c, "params_total": total, "argv": repo_argv(), "seed": a.seed,
               "torch": torch.__version__, "threads": torch.get_num_threads(), "batch_tokens": a.batch_tokens,
               "response_len": a.response_len, "lr": a.lr, "device": str(dev)}
    with open(os.path.join(a.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"trained {step} steps, {examples_seen} examples, {tokens_seen / 1e6:.1f}M tokens in "
          f"{train_time / 60:.1f} min; one-shot {acc}", flush=True)
    if a.export:
        files = write_model_dir(model, ddir, a.export, gen_length=a.response_len, block_length=a.response_len)
        print(f"exported {a.export}: {', '.join(files)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
