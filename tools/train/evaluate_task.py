#!/usr/bin/env python3
"""Evaluates an exported task model (train_task.py) and writes what is bundled beside it.

  evaluate_task.py --model models/tessera-task --run tools/train/runs/task --tessera build/tessera
                   [--pytorch-per-task 20] [--guard-per-task 8] [--card]

Writes into MODEL:
  tasks.jsonl    the held-out set (tasks.py heldout: 200 per task, seed 7, disjoint from training)
  samples.jsonl  two prompts per task with PyTorch's greedy low-confidence generation (fp32 compute on the
                 exported bf16 weights, one block of --gen-length, a token per step), which tessera's test
                 reproduces
  guard.json     the exact path's correct answers on the first --guard-per-task examples of each task, as
                 `tessera eval --task all --per-task N` measures them (the CI regression guard)
  MODEL_CARD.md  (--card) data, commands, training, and held-out accuracy per task: tessera's exact path on
                 the whole set, and PyTorch against tessera on the first --pytorch-per-task of each task
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import tasks  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from evaluate import cut_at_eos, llada_generate  # noqa: E402
from export import load_model_dir  # noqa: E402


def tessera_eval(exe, model, extra, out_json):
    cmd = [exe, "eval", "-m", model, "--task", "all", "--json-out", out_json, *extra]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    with open(out_json) as f:
        return json.load(f)


def wilson(h, n, z=1.96):
    if n == 0:
        return 0.0, 0.0
    p, z2 = h / n, z * z
    c = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * (p * (1 - p) / n + z2 / (4 * n * n)) ** 0.5
    return max(0.0, c - half), min(1.0, c + half)


def run_commands(run_dir):
    """The training commands of the run, in order, from its log (a --resume run appends a start record)."""
    starts, first_after = [], {}
    for line in open(os.path.join(run_dir, "log.jsonl")):
        o = json.loads(line)
        if o.get("event") == "start":
            starts.append(o)
        elif o.get("event") == "train" and len(starts) not in first_after:
            first_after[len(starts)] = o
    out = []
    for i, o in enumerate(starts):
        t = first_after.get(i + 1, {})
        note = "" if i == 0 else (f"   # stopped, then resumed from its checkpoint (step {o['step']}, minute "
                                  f"{o['minutes']:.1f})" if "step" in o else
                                  f"   # stopped, then resumed from its last checkpoint (about minute "
                                  f"{t.get('elapsed', 0) / 60:.0f})")
        out.append("python3 " + " ".join(o["argv"]) + note)
    return out


def card(name, summary, full, torch_rows, guard, a, held_per_task):
    c = summary["config"]
    commands = run_commands(a.run)
    ex = full["results"][0]
    lines = [f"# {name}", "",
             f"`{name}` is a small masked-diffusion model in the **LLaDA** layout (the exact Hugging Face layout: "
             "config field names, tensor names, bf16 safetensors, tokenizer.json), fine-tuned from `tessera-tiny` "
             "on generated tasks with exact answers, so that tessera's approximations can be judged by task "
             "accuracy (`tessera eval --task`) and not only by agreement with the exact path. Every answer ends "
             "with `Answer: X`; a generation is right when the text after its last `Answer:` equals X exactly.",
             "", "## Tasks (tools/train/tasks.py)", "",
             "| task | prompt | target |", "|---|---|---|",
             "| add | `Add 876 and 141.` (2-4 digits) | `6+1=7 7+4=11 8+1+1=10 Answer: 1017` (columns right to left, "
             "carries written) |",
             "| sort | `Sort: 38 61 45 74` (4-10 two-digit numbers) | `Answer: 38 45 61 74` |",
             "| reverse | `Reverse: 77 18 39 12` (4-10 two-digit numbers) | `Answer: 12 39 18 77` |",
             "| lookup | `Records: prosperity 397, offering 288, ... Find offering.` (4-150 records: prompts of "
             "30-910 tokens) | `Answer: 288` |",
             "| trace | `Run: b=3; c=b+b; a=7-c. Print a.` (3-6 statements over a..d) | `b=3, c=6, a=1. Answer: 1` |",
             "",
             "Every prompt ends with a newline; the two numbers of an addition have as many digits. Two thirds of the lookup prompts are under ~250 tokens, the rest spread "
             "up to ~910, so the long-context options (SparseD, the window, the caches) act on them. Training "
             "examples come from an endless seeded stream; the held-out set (`tasks.jsonl`, "
             f"{held_per_task} per task, seed 7) is generated apart and its prompts are excluded from the "
             "stream.", "",
             "## Architecture", "", "| | |", "|---|---|",
             "| layout | LLaDA (`model_type` llada, LLaDAModelLM) |",
             f"| parameters | {summary['params_total'] / 1e6:.2f}M |",
             f"| hidden / layers / heads | {c['d_model']} / {c['n_layers']} / {c['n_heads']} |",
             f"| FFN | SwiGLU, hidden {c['mlp_hidden']} |",
             f"| context | {c['max_seq_len']} (tessera-tiny's RoPE, trained here up to ~960 positions) |",
             "| tokenizer | tessera-tiny's (byte-level BPE, 4096, single digits) |",
             f"| answer canvas | {summary['response_len']} tokens (generation_config.json gen_length) |",
             "", "## Training (tools/train/train_task.py)", "",
             "LLaDA's SFT objective: each row is `<|startoftext|> prompt target <|endoftext|>...` (EOS padding to "
             "the batch's longest row, at least the answer canvas after the prompt); only the response is "
             "noised, per row t ~ U(0.001, 1); loss = mean over rows of (sum of CE / t over the masked "
             "positions) / response length. Rows of similar length are batched (~8192 tokens a batch).", "",
             "| | |", "|---|---|",
             "| initialised from | models/tessera-tiny |",
             f"| steps | {summary['steps']} |",
             f"| examples / tokens seen | {summary['examples']} / {summary['tokens'] / 1e6:.1f}M |",
             f"| optimiser | AdamW (0.9, 0.95), lr {summary['lr']}, warmup then cosine to 10%, weight decay 0.1, "
             "clip 1.0 |",
             "| precision | bf16 autocast (oneDNN), fp32 master weights |",
             f"| hardware | this project's CI machine: 2 x86-64 cores (AVX-512 BF16), no GPU; torch "
             f"{summary['torch']}, {summary['threads']} threads |",
             f"| training time | {summary['train_seconds'] / 60:.1f} min (resumable: `--resume`) |",
             "", "Commands (from the repository root):", "", "```",
             *commands,
             "python3 tools/train/evaluate_task.py " + " ".join(sys.argv[1:]),
             "```", "",
             "## Held-out accuracy", "",
             f"tessera's exact path (`tessera eval -m models/tessera-task --task all`: low-confidence, "
             f"{full['exact_path']['gen_length']} tokens, one per step, one block, {full['exact_path']['precision']} "
             f"precision), {ex['n']} examples:", "",
             "| task | correct | accuracy | 95% CI |", "|---|---:|---:|---:|"]
    for t in full["task_names"]:
        r = ex["tasks"][t]
        lines.append(f"| {t} | {r['correct']}/{r['n']} | {r['accuracy']:.3f} | [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] |")
    lines.append(f"| **all** | {ex['correct']}/{ex['n']} | **{ex['accuracy']:.3f}** | "
                 f"[{ex['ci95'][0]:.3f}, {ex['ci95'][1]:.3f}] |")
    lines += ["", f"PyTorch (tools/train/model.py, fp32 compute on the exported bf16 weights, LLaDA's greedy "
              f"low-confidence decoding) against tessera (`--precision f32`) on the first {a.pytorch_per_task} "
              "held-out examples of each task:", "",
              "| task | PyTorch correct | tessera correct | same answer |", "|---|---:|---:|---:|"]
    for t, r in torch_rows.items():
        lines.append(f"| {t} | {r['pytorch']}/{r['n']} | {r['tessera']}/{r['n']} | {r['same']}/{r['n']} |")
    lines += ["", f"CI regression guard (`guard.json`): the exact path answers {guard['correct']} of the first "
              f"{guard['per_task']} examples of each task ({5 * guard['per_task']}) right; "
              "tests/golden/task_eval_test.cpp fails when it drops by more than one.", "",
              "Figures for every option (threshold decoding, caches, SparseD, Window-Diffusion, their "
              "combinations) are in docs/PERF.md.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--tessera", required=True)
    ap.add_argument("--held-per-task", type=int, default=200)
    ap.add_argument("--pytorch-per-task", type=int, default=20)
    ap.add_argument("--guard-per-task", type=int, default=8)
    ap.add_argument("--card", action="store_true")
    ap.add_argument("--full-json", default="", help="an existing `tessera eval --task all` JSON of the whole set")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.time()
    held = tasks.heldout(a.held_per_task)
    with open(os.path.join(a.model, "tasks.jsonl"), "w") as f:
        for e in held:
            f.write(json.dumps({k: e[k] for k in ("task", "prompt", "answer", "target")}) + "\n")
    model = load_model_dir(a.model, "cpu")
    tok = Tokenizer(os.path.join(a.model, "tokenizer.json"))
    with open(os.path.join(a.model, "generation_config.json")) as f:
        gc = json.load(f)
    G, bos, eos, mask = gc["gen_length"], gc["bos_token_id"], gc["eos_token_id"], gc["mask_token_id"]
    no_amp = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731

    def pytorch(prompt):
        out = llada_generate(model, [bos] + tok.encode(prompt), mask, G, G, G, no_amp)
        return tok.decode(cut_at_eos(out, eos), skip_special=True)

    # PyTorch against tessera on a subset (fp32 on both sides)
    sub = [e for t in tasks.TASKS for e in [x for x in held if x["task"] == t][:a.pytorch_per_task]]
    tj = tessera_eval(a.tessera, a.model, ["--per-task", str(a.pytorch_per_task), "--precision", "f32"],
                      os.path.join(a.run, "task_eval_f32_subset.json"))
    ts = tj["results"][0]
    # the same order: load_tasks keeps file order, per task capped
    rows, samples = {}, []
    answers_t = []
    # tessera's per-example answers are not in the JSON; rerun its answers through the per-example scorer
    for i, e in enumerate(sub):
        text = pytorch(e["prompt"])
        got = tasks.extract(text)
        r = rows.setdefault(e["task"], {"n": 0, "pytorch": 0, "tessera": 0, "same": 0})
        r["n"] += 1
        r["pytorch"] += int(got == e["answer"])
        answers_t.append((e, text, got))
        if sum(1 for s in samples if s["task"] == e["task"]) < 2:
            samples.append({"task": e["task"], "prompt": e["prompt"], "pytorch": text})
        print(f"{e['task']}: pytorch {got!r} want {e['answer']!r}", flush=True)
    for t in rows:
        rows[t]["tessera"] = ts["tasks"][t]["correct"]
    # same answer: tessera generate on every subset prompt
    for e, text, got in answers_t:
        r = subprocess.run([a.tessera, "generate", "-m", a.model, "--raw", "--precision", "f32", "--gen-length",
                            str(G), "--steps", str(G), "--block-length", str(G), "--temperature", "0", "--json",
                            "-p", e["prompt"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True)
        ttext = json.loads(r.stdout.strip().splitlines()[-1])["text"]
        rows[e["task"]]["same"] += int(tasks.extract(ttext) == got)
    with open(os.path.join(a.model, "samples.jsonl"), "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    gj = tessera_eval(a.tessera, a.model, ["--per-task", str(a.guard_per_task)], os.path.join(a.run, "guard_eval.json"))
    guard = {"per_task": a.guard_per_task, "correct": gj["results"][0]["correct"],
             "command": f"tessera eval -m {os.path.relpath(a.model, ROOT)} --task all --per-task {a.guard_per_task}"}
    with open(os.path.join(a.model, "guard.json"), "w") as f:
        json.dump(guard, f, indent=2)
        f.write("\n")
    print(json.dumps({"pytorch_vs_tessera": rows, "guard": guard}), flush=True)
    if a.card:
        full = json.load(open(a.full_json)) if a.full_json else tessera_eval(
            a.tessera, a.model, [], os.path.join(a.run, "task_eval_full.json"))
        with open(os.path.join(a.run, "train_summary.json")) as f:
            summary = json.load(f)
        name = os.path.basename(os.path.normpath(a.model))
        with open(os.path.join(a.model, "MODEL_CARD.md"), "w") as f:
            f.write(card(name, summary, full, rows, guard, a, a.held_per_task))
        print(f"wrote {os.path.join(a.model, 'MODEL_CARD.md')} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
