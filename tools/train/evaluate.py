#!/usr/bin/env python3
"""Evaluates an exported model directory and writes its MODEL_CARD.md.

  evaluate.py --model models/tessera-tiny --run tools/train/runs/tiny [--data tools/train/data]
              [--tessera build/tessera] [--card] [--device cpu|cuda]

Loads the EXPORTED bf16 weights back into the PyTorch model (so the figures describe exactly the
files tessera loads), runs the held-out evaluation of train.py on the whole test split, generates
samples at temperature 0 with LLaDA's low-confidence remasking (semi-autoregressive blocks), and,
with --tessera, the same prompts through `tessera generate`. Writes RUN/eval.json and, with --card,
MODEL/MODEL_CARD.md filled from RUN/train_summary.json, RUN/log.jsonl, DATA/corpus/stats.json,
DATA/tokens/meta.json and eval.json.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bpe import Tokenizer  # noqa: E402
from export import load_model_dir  # noqa: E402
from model import tri_mask  # noqa: E402
from train import EVAL_TS, Data, cpu_bf16_fast, evaluate, evaluate_tri  # noqa: E402


@torch.no_grad()
def ar_generate(model, prompt, eos, gen_length=64, amp=None):
    """Greedy autoregressive decoding with the causal mask (a tri-mode model's mode ar): one forward over
    the whole text per token, the argmax of the last row's logits."""
    dev = next(model.parameters()).device
    ids = list(prompt)
    for _ in range(gen_length):
        x = torch.tensor([ids], device=dev)
        with amp():
            h = model.hidden(x, None, tri_mask(len(ids), 1, dev)[:len(ids), :len(ids)])
        ids.append(int(model.lm_head(h[0, -1:].float()).argmax(-1)))
        if ids[-1] == eos:
            break
    return ids[len(prompt):]


@torch.no_grad()
def llada_generate(model, prompt, mask_id, gen_length=64, steps=64, block_length=32, amp=None):
    """LLaDA's generate() at temperature 0 with low-confidence remasking."""
    dev = next(model.parameters()).device
    P = len(prompt)
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long, device=dev)
    x[0, :P] = torch.tensor(prompt, device=dev)
    nb = gen_length // block_length
    spb = steps // nb
    for b in range(nb):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        n_mask = int((x[0, lo:hi] == mask_id).sum())
        base, rem = divmod(n_mask, spb)
        plan = [base + (1 if i < rem else 0) for i in range(spb)]
        for i in range(spb):
            mask_index = x[0] == mask_id
            with amp():
                logits = model(x)[0].float()
            x0 = logits.argmax(-1)
            conf = logits.softmax(-1).gather(-1, x0[:, None])[:, 0]
            conf[hi:] = -float("inf")
            conf = torch.where(mask_index, conf, torch.full_like(conf, -float("inf")))
            k = plan[i]
            if k > 0:
                sel = conf.topk(k).indices
                x[0, sel] = x0[sel]
    return x[0, P:].tolist()


def cut_at_eos(ids, eos):
    return ids[:ids.index(eos)] if eos in ids else ids


def run_tessera(exe, model_dir, prompt, g, s, bl, extra=()):
    cmd = [exe, "generate", "-m", model_dir, "-p", prompt, "--gen-length", str(g), "--steps", str(s),
           "--block-length", str(bl), "--temperature", "0", "--raw", "--precision", "f32", "--json", *extra]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-500:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"text": out.get("text"), "tokens": out.get("tokens"), "tokens_per_second": out.get("tokens_per_second")}


# ------------------------------------------------------------------------------------------ card
def fmt_params(n):
    return f"{n / 1e6:.2f}M"


def model_card(name, model_dir, ev, summary, stats, meta, run_dir):
    c = summary["config"]
    moe = c["arch"] == "llada_moe"
    tri = c["arch"] == "nemotron"
    h = ev["heldout"]
    lines = [f"# {name}", ""]
    desc = ("a tiny masked-diffusion language model (dLLM) in the **LLaDA** layout" if c["arch"] == "llada"
            else "a tiny mixture-of-experts masked-diffusion language model (dLLM) in the **LLaDA-MoE** layout"
            if moe else "a tiny **tri-mode** language model (autoregressive, block diffusion and self-speculation "
            "from one checkpoint) in the **Nemotron-Labs-Diffusion** layout")
    how = ("trained from scratch with the LLaDA objective" if not tri else
           "fine-tuned from `tessera-tiny`'s weights with the joint autoregressive + block-diffusion objective")
    lines += [f"`{name}` is {desc}, {how} on ~"
              f"{stats['total']['bytes'] / 1e6:.0f} MB of public-domain and freely licensed English text from "
              "Debian packages. It is bundled with tessera as a real trained checkpoint in the exact Hugging Face "
              
              "layout of the family (config field names, tensor names, bf16 safetensors, tokenizer.json). "
              "It is a toy: it writes English-looking text with local structure, not meaning.", ""]
    # data
    lines += ["## Data", "",
              "Built by `tools/train/corpus.py` from these Debian 12 (bookworm, main) packages; licences as "
              "stated in each package's `/usr/share/doc/PKG/copyright`:", "",
              "| source | package(s) | licence | documents | MB | words |", "|---|---|---|---:|---:|---:|"]
    for k, s in stats["sources"].items():
        lines.append(f"| {s['description']} | {', '.join(s['packages'])} | {s['licence']} | {s['docs']} | "
                     f"{s['bytes'] / 1e6:.2f} | {s['words'] / 1e6:.2f}M |")
    t = stats["total"]
    lines += [f"| **total** | | | {t['docs']} | {t['bytes'] / 1e6:.2f} | {t['words'] / 1e6:.2f}M |", "",
              "Cleaning: NFC, ASCII quotes and dashes, markup removed, hard-wrapped lines joined into paragraphs; "
              "exact-duplicate paragraphs (case/space-insensitive, >= 30 characters) dropped. "
              f"Held-out split: {stats['test_percent']}% of the documents by hash "
              f"({t['test_docs']} documents, {meta['test']['tokens']} tokens); train split "
              f"{meta['train']['tokens']} tokens.", ""]
    # tokenizer
    sp = meta["special_tokens"]
    lines += ["## Tokenizer", "",
              f"Byte-level BPE trained by `tools/train/bpe.py` on the train split: vocabulary {meta['vocab_size']} = "
              f"256 byte tokens + {meta['vocab_size'] - 256 - len(sp)} merges + {len(sp)} special tokens; "
              "NFC normalizer, Qwen2/LLaMA-3 pre-tokenizer regex (single digits), ByteLevel decoder; "
              f"{meta['train']['bytes_per_token']} bytes per token on the train split. Special tokens: "
              + ", ".join(f"`{k}` {v}" for k, v in sp.items()) + ". Documents are "
              "`<|startoftext|> text <|endoftext|>`; `<|mdm_mask|>` is the mask; pad = `<|endoftext|>`. "
              "`add_bos_token` is true, so a raw prompt starts with `<|startoftext|>` as in training.", ""]
    # architecture
    lines += ["## Architecture", ""]
    rows = [("layout", "LLaDA (`model_type` llada, LLaDAModelLM)" if c["arch"] == "llada" else
             "LLaDA-MoE (`model_type` lladamoe, LLaDAMoEModelLM)" if moe else
             "Nemotron-Labs-Diffusion (`model_type` nemotron_labs_diffusion; Ministral-3 names under `encoder.`, "
             "untied `diffusion_head`, default RoPE, `block_size` " + str(c.get("block_size")) + ")"),
            ("parameters", f"{fmt_params(summary['params_total'])} total, {fmt_params(summary['params_active'])} "
                           f"active per token ({fmt_params(2 * c['vocab_size'] * c['d_model'])} in embedding + LM head)"),
            ("hidden / layers / heads", f"{c['d_model']} / {c['n_layers']} / {c['n_heads']} (KV heads "
                                        f"{c['n_kv_heads']}, head dim {c['head_dim']})"),
            ("FFN", f"SwiGLU, hidden {c['mlp_hidden']}" if not moe else
             f"{c['n_experts']} SwiGLU experts of hidden {c['expert_hidden']}, top-{c['top_k']}, softmax router in "
             "fp32, no top-k renormalisation, no shared expert, no expert bias"),
            ("attention", ("causal or bidirectional per forward" if tri else "bidirectional")
             + ", rotate-half RoPE (theta " + f"{c['rope_theta']:g})"
             + (", per-head RMSNorm on q and k before RoPE (qk-norm)" if moe else "") + ", no biases"),
            ("norms", f"RMSNorm, eps {c['rms_norm_eps']}"),
            ("LM head", "untied, logits not shifted"),
            ("context", str(c["max_seq_len"])),
            ("weights", "bf16 safetensors: " + ", ".join(sorted(f for f in os.listdir(model_dir)
                                                               if f.endswith(".safetensors"))))]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    # training
    args = summary["argv"]
    epochs = summary["tokens"] / meta["train"]["tokens"]
    objective = ("Objective (LLaDA pretraining): per sequence t ~ U(0.001, 1); each token masked with probability t; "
                 "loss = sum over masked positions of CE / t, divided by the number of tokens."
                 + (" Plus 0.01 x Switch load-balancing loss and 0.001 x router z-loss." if moe else ""))
    if tri:
        objective = ("Objective (the joint one of shared/specs/nemotron-labs-diffusion.md): each sequence runs as "
                     "[clean ; masked] under one attention mask (`model.tri_mask`): the clean half causal, giving "
                     "the next-token CE (the autoregressive loss), and the masked half in blocks of "
                     f"{c['block_size']} that see the clean positions before their block and their own block "
                     "(how the engine's drafts attend to the causal KV cache), giving the masked-diffusion loss "
                     "(per block t ~ U(0.001, 1), CE / t over masked positions, divided by the number of tokens); "
                     "loss = AR + diffusion. Initialised from `models/tessera-tiny`.")
    lines += ["## Training", "", objective, "",
              "| | |", "|---|---|",
              f"| steps | {summary['steps']} (batch {summary['batch_size']} x {c['max_seq_len']} tokens) |",
              f"| tokens seen | {summary['tokens'] / 1e6:.1f}M ({epochs:.1f} epochs) |",
              f"| optimiser | AdamW (0.9, 0.95), lr {summary['lr']}, warmup then cosine to 10%, weight decay 0.1, "
              "clip 1.0 |",
              f"| precision | bf16 autocast, fp32 master weights |",
              f"| device | {summary['device']}{' (' + summary['gpu'] + ')' if summary.get('gpu') else ''}, torch "
              f"{summary['torch']}, {summary['train_seconds'] / 60:.1f} min |",
              f"| seed | {summary['seed']} |",
              f"| exported checkpoint | {summary['checkpoint']} |", ""]
    # results
    lines += ["## Results (held-out split, exported bf16 weights)", "",
              f"Final train loss ({'AR + diffusion' if tri else 'LLaDA objective'}, last logged window): "
              f"**{summary['final_train_loss']:.4f}**; held-out loss (same objective, fixed seed): **{h['loss']:.4f}**.",
              ""]
    if tri:
        a = h["ar"]
        lines += [f"Autoregressive (causal) next-token prediction on every {c['max_seq_len']}-token window: accuracy "
                  f"**{a['acc']:.3f}** (unigram baseline {a['unigram_acc']:.3f}), CE {a['ce']:.3f} nats "
                  f"(unigram {a['unigram_ce']:.3f}) over {a['tokens']} tokens.", "",
                  "Block diffusion: every block of the masked half masked at ratio t (fixed seed), the clean "
                  "prefix before each block visible causally:", "",
                  "| mask ratio t | masked tokens | accuracy | CE (nats) |", "|---:|---:|---:|---:|"]
        for tt in EVAL_TS:
            e = h[f"t={tt}"]
            lines.append(f"| {tt} | {e['masked']} | **{e['acc']:.3f}** | {e['ce']:.3f} |")
    else:
        lines += ["Masked-token prediction on every 512-token window of the held-out split with a fixed random "
                  "mask of ratio t. Unigram baseline = accuracy of always predicting the most frequent token of "
                  "the train split on the same masked positions (its CE: the train unigram distribution).", "",
                  "| mask ratio t | masked tokens | accuracy | unigram baseline | CE (nats) | unigram CE |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for tt in EVAL_TS:
            e = h[f"t={tt}"]
            lines.append(f"| {tt} | {e['masked']} | **{e['acc']:.3f}** | {e['unigram_acc']:.3f} | {e['ce']:.3f} | "
                         f"{e['unigram_ce']:.3f} |")
    lines.append("")
    if moe:
        lines += ["Expert load per layer on the held-out split (all three mask ratios): share of the top-"
                  f"{c['top_k']} routing slots per expert; entropy in nats (uniform = ln {c['n_experts']} = "
                  f"{h['expert_load'][0]['max_entropy']:.3f}).", "",
                  "| layer | entropy | normalised | max share | min share |", "|---:|---:|---:|---:|---:|"]
        for x in h["expert_load"]:
            lines.append(f"| {x['layer']} | {x['entropy']:.3f} | {x['normalized']:.3f} | {x['max_share']:.3f} | "
                         f"{x['min_share']:.3f} |")
        lines.append("")
    # samples
    g = ev["generation"]
    how = (f"greedy autoregressive decoding (PyTorch: one causal forward per token; tessera: `--mode ar`, and "
           f"`--mode spec` at block length {g['block_length']}), gen length {g['gen_length']}") if tri else (
           f"LLaDA low-confidence remasking, gen length {g['gen_length']}, {g['steps']} steps, block length "
           f"{g['block_length']}")
    lines += ["## Samples (temperature 0)", "",
              f"{how}; the prompt is in bold, generation is cut at `<|endoftext|>`.", ""]
    for s in ev["samples"]:
        lines.append(f"- PyTorch: **{s['prompt']}**{s['text']}".replace("\n", " "))
        for key, label in (("tessera", "tessera (`--precision f32`" + (", `--mode ar`)" if tri else ")")),
                           ("tessera_spec", "tessera (`--precision f32`, `--mode spec`)")):
            if key not in s:
                continue
            ts = s[key]
            if "text" not in ts:
                lines.append(f"  - {label}: (failed: {ts['error'][:200]})")
            elif ts["text"] == s["text"]:
                lines.append(f"  - {label}: identical")
            else:
                lines.append(f"  - {label}: **{s['prompt']}**{ts['text']}".replace("\n", " "))
    lines.append("")
    gen_cmd = (f"./build/tessera generate -m models/{name} -p \"Once upon a time\" --gen-length "
               f"{g['gen_length']} --steps {g['steps']} --block-length {g['block_length']}")
    if tri:
        gen_cmd = (f"./build/tessera generate -m models/{name} -p \"Once upon a time\" --gen-length "
                   f"{g['gen_length']} --mode spec   # or --mode ar, or --mode diffusion (the default)")
    lines += ["## Use", "", "```bash", gen_cmd, "```", ""]
    # retrain
    train_cmd = "python3 " + " ".join(a if " " not in a else f"'{a}'" for a in args)
    lines_cmd = ("From the repository root; `bash tools/train/run_all.sh --train-only` runs it (and the "
                 "evaluation that wrote this card) from prepared data.")
    lines += ["## Retrain", "",
              "On a fresh Debian 12 machine (`tools/train/README.md`); the whole pipeline is "
              "`bash tools/train/run_all.sh`. The data preparation:", "", "```bash",
              "/usr/bin/python3 tools/train/corpus.py", "/usr/bin/python3 tools/train/bpe.py train --vocab "
              f"{meta['vocab_size']}", "/usr/bin/python3 tools/train/bpe.py encode", "```", "",
              "and this model's exact training command:", "", "```bash", train_cmd, "```", "", lines_cmd, ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--tessera", default="", help="a tessera binary: also generate the samples with it")
    ap.add_argument("--card", action="store_true", help="write MODEL/MODEL_CARD.md")
    ap.add_argument("--name", default="")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cpu":
        torch.set_num_threads(a.threads or os.cpu_count() or 1)
    use_amp = dev.type == "cuda" or cpu_bf16_fast()

    def amp():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp)

    def no_amp():
        return torch.autocast(dev.type, enabled=False)

    t0 = time.time()
    model = load_model_dir(a.model, dev)
    data = Data(a.data)
    meta = data.meta
    tri = model.c["arch"] == "nemotron"
    if tri:
        r = evaluate_tri(model, data, model.c["max_seq_len"], dev, model.c["block_size"], None, amp=amp)
    else:
        r = evaluate(model, data, model.c["max_seq_len"], dev, None, amp=amp)
    print("held-out:", json.dumps({k: v for k, v in r.items() if k != "expert_load"}))
    if "expert_load" in r:
        print("expert load entropy per layer:", [round(x["entropy"], 3) for x in r["expert_load"]],
              f"(max {r['expert_load'][0]['max_entropy']:.3f})")
    tok = Tokenizer(os.path.join(a.model, "tokenizer.json"))
    samples = []
    for prompt, ids in meta["sample_prompts"].items():
        # fp32 compute on the bf16 weights, as `tessera generate --precision f32` (bf16 autocast can flip
        # near-tied argmaxes and so the whole sample)
        if tri:
            out = ar_generate(model, ids, meta["eos_token_id"], a.gen_length, no_amp)
        else:
            out = llada_generate(model, ids, meta["mask_token_id"], a.gen_length, a.steps, a.block_length, no_amp)
        text = tok.decode(cut_at_eos(out, meta["eos_token_id"]))
        s = {"prompt": prompt, "text": text, "ids": out}
        if a.tessera:
            s["tessera"] = run_tessera(a.tessera, a.model, prompt, a.gen_length, a.steps, a.block_length,
                                       ("--mode", "ar") if tri else ())
            if tri:
                s["tessera_spec"] = run_tessera(a.tessera, a.model, prompt, a.gen_length, a.steps,
                                                a.block_length, ("--mode", "spec"))
        samples.append(s)
        print(f"sample: {prompt!r} -> {text!r}" + (f"\n  tessera: {s['tessera']}" if a.tessera else ""), flush=True)
    ev = {"model": a.model, "heldout": r, "samples": samples, "device": str(dev), "bf16": use_amp,
          "generation": {"gen_length": a.gen_length, "steps": a.steps, "block_length": a.block_length,
                         "alg": "low_confidence", "temperature": 0}, "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(a.run, "eval.json"), "w") as f:
        json.dump(ev, f, indent=2, ensure_ascii=False)
    if a.card:
        with open(os.path.join(a.run, "train_summary.json")) as f:
            summary = json.load(f)
        for line in open(os.path.join(a.run, "log.jsonl")):
            o = json.loads(line)
            if o.get("event") == "start" and o.get("gpu"):
                summary["gpu"] = o["gpu"]
        st = os.path.join(a.data, "corpus", "stats.json")
        if not os.path.exists(st):
            st = os.path.join(a.data, "tokens", "corpus_stats.json")
        with open(st) as f:
            stats = json.load(f)
        name = a.name or os.path.basename(os.path.normpath(a.model))
        with open(os.path.join(a.model, "MODEL_CARD.md"), "w") as f:
            f.write(model_card(name, a.model, ev, summary, stats, meta, a.run))
        print(f"wrote {os.path.join(a.model, 'MODEL_CARD.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
