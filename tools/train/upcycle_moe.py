#!/usr/bin/env python3
"""Turns a dense LLaDA export into a LLaDA-MoE export that starts from the same function (upcycling by split).

  upcycle_moe.py --dense models/tessera-task --out tools/train/runs/task-moe/init --experts 8 --top-k 4

Each layer's SwiGLU FFN of hidden h is cut into E experts of h / E units (expert e: rows [e h/E, (e+1) h/E)
of gate and up, the same columns of down): the sum over all E experts is the dense FFN exactly. LLaDA-MoE
weighs expert e by its softmax router probability p_e, without renormalising the top k, so every down
projection is multiplied by E; with the router at zero (p_e = 1 / E) and k = E the MoE model computes the
dense model's logits (--check verifies it). With k < E each row keeps the k chunks its router picks: the
fine-tune (train_task.py --init OUT, which adds the load-balancing loss) teaches the router which ones.
Attention, norms, embeddings and the LM head are copied; LLaDA has no q / k norms, so the export says
qk_layernorm false. The router starts at N(0, --router-std), small enough that p_e stays near 1 / E.
"""
import argparse
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from export import load_model_dir, write_model_dir  # noqa: E402
from model import DiffusionLM  # noqa: E402
from train_task import data_dir  # noqa: E402


def upcycle(dense, experts, top_k, router_std, seed=0):
    c = dense.c
    if c["arch"] != "llada":
        raise SystemExit(f"--dense: a LLaDA export is needed, this one is {c['arch']}")
    h, E = c["mlp_hidden"], experts
    if E < 1 or h % E != 0:
        raise SystemExit(f"--experts {E}: the FFN's {h} units do not split evenly")
    if not 1 <= top_k <= E:
        raise SystemExit(f"--top-k {top_k}: must be 1..{E}")
    mc = {"arch": "llada_moe", "d_model": c["d_model"], "n_layers": c["n_layers"], "n_heads": c["n_heads"],
          "n_kv_heads": c["n_kv_heads"], "head_dim": c["head_dim"], "expert_hidden": h // E, "n_experts": E,
          "top_k": top_k, "vocab_size": c["vocab_size"], "max_seq_len": c["max_seq_len"],
          "rope_theta": c["rope_theta"], "rms_norm_eps": c["rms_norm_eps"], "qk_norm": False}
    moe = DiffusionLM(mc)
    src, dst = dense.state_dict(), moe.state_dict()
    g = torch.Generator().manual_seed(seed)
    d = c["d_model"]
    for name in dst:
        if ".ffn." not in name:
            dst[name].copy_(src[name])
            continue
        layer = name.split(".ffn.")[0]
        if name.endswith("ffn.gate.weight"):
            dst[name].copy_(torch.randn(E, d, generator=g) * router_std)
        elif name.endswith("ffn.w_gate") or name.endswith("ffn.w_up"):
            w = src[layer + ".ffn." + name.rsplit(".", 1)[1] + ".weight"]  # [h, d]
            dst[name].copy_(w.reshape(E, h // E, d))
        elif name.endswith("ffn.w_down"):
            w = src[layer + ".ffn.w_down.weight"]  # [d, h]
            dst[name].copy_(w.reshape(d, E, h // E).permute(1, 0, 2) * E)
        else:
            raise SystemExit(f"upcycle: no rule for {name}")
    moe.load_state_dict(dst)
    return moe


@torch.no_grad()
def check(dense, experts):
    """k = E and a zero router: the MoE model's logits equal the dense model's (f32)."""
    moe = upcycle(dense, experts, experts, 0.0).eval()
    ids = torch.randint(0, dense.c["vocab_size"], (2, 64), generator=torch.Generator().manual_seed(1))
    a, b = dense.eval()(ids).float(), moe(ids).float()
    err = float((a - b).abs().max() / a.abs().max())
    print(f"check: k = E = {experts}, zero router: max |dense - moe| / max |dense| = {err:.2e}")
    if err > 1e-4:
        raise SystemExit("check: the upcycled model does not compute the dense model's logits")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense", required=True, help="an exported LLaDA directory (e.g. models/tessera-task)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--router-std", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="verify k = E reproduces the dense logits first")
    a = ap.parse_args()
    dense = load_model_dir(a.dense, "cpu").float()
    if a.check:
        check(dense, a.experts)
    moe = upcycle(dense, a.experts, a.top_k, a.router_std, a.seed)
    os.makedirs(a.out, exist_ok=True)
    ddir, _ = data_dir(os.path.join(a.out, "work"), a.dense)
    with open(os.path.join(a.dense, "generation_config.json")) as f:
        gc = json.load(f)
    files = write_model_dir(moe, ddir, a.out, gen_length=gc["gen_length"], block_length=gc["block_length"])
    shutil.rmtree(os.path.join(a.out, "work"))
    print(f"upcycled {a.dense} into {a.out}: {a.experts} experts of {dense.c['mlp_hidden'] // a.experts} "
          f"units, top {a.top_k}; {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
