#!/usr/bin/env python3
"""Checks of the numpy reference itself (reference.py, safetensors_np.py) and of
tools/make_tiny_checkpoint.py. Every check can fail; exits non-zero if any does (77: no numpy, a
skip for ctest, where it runs as the test reference_selftest).

  /usr/bin/python3 tests/reference/selftest.py        -> prints "N passed, 0 failed"
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

try:
    import numpy as np
except ImportError:
    print("selftest: numpy is not installed for " + sys.executable + "; skipped")
    sys.exit(77)  # ctest's SKIP_RETURN_CODE (tests/CMakeLists.txt)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_tiny_checkpoint as mtc  # noqa: E402
import reference as ref  # noqa: E402
import safetensors_np  # noqa: E402
import selftest_editing  # noqa: E402

CHECKS = []
TMP = tempfile.mkdtemp(prefix="tessera_selftest_")


def check(fn):
    CHECKS.append(fn)
    return fn


def close(a, b, tol=1e-6, what=""):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    err = np.max(np.abs(a - b)) if a.size else 0.0
    assert err <= tol, f"{what}: max abs error {err} > {tol}\n{a}\n{b}"


def make(family, name, *extra):
    out = os.path.join(TMP, name)
    cmd = [sys.executable, os.path.join(ROOT, "tools", "make_tiny_checkpoint.py"), "--family", family,
           "--out", out, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


# ---------------------------------------------------------------------------------------------
# (a) building blocks against hand-computed values
# ---------------------------------------------------------------------------------------------

@check
def rms_norm_hand_values():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    w = np.array([1.0, 1.0, 2.0, 0.5], dtype=np.float32)
    r = math.sqrt((1 + 4 + 9 + 16) / 4)  # sqrt(7.5)
    close(ref.rms_norm(x, w, 0.0), [[1 / r, 2 / r, 6 / r, 2 / r]], 1e-6, "rmsnorm")
    # eps inside the square root: all-zero input stays zero, tiny input is damped by eps
    close(ref.rms_norm(np.zeros((1, 4)), w, 1e-5), np.zeros((1, 4)), 0, "rmsnorm zeros")
    close(ref.rms_norm(np.full((1, 2), 1e-3), [1, 1], 1e-6), [[1e-3 / math.sqrt(1e-6 + 1e-6)] * 2], 1e-6,
          "rmsnorm eps")


@check
def rope_hand_values():
    # head_dim 4, theta 100: inv_freq = [1, 0.1]; rotate-half pairs (0, 2) and (1, 3).
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]] * 3, dtype=np.float32)  # positions 0, 1, 2
    out = ref.apply_rope(x, np.arange(3), 100.0)
    close(out[0, 0], [1, 2, 3, 4], 1e-7, "rope pos 0 is identity")
    for p in (1, 2):
        c0, s0, c1, s1 = math.cos(p), math.sin(p), math.cos(0.1 * p), math.sin(0.1 * p)
        want = [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1]
        close(out[p, 0], want, 1e-6, f"rope rotate-half pos {p}")
    # interleaved pairs (0, 1) and (2, 3)
    out = ref.apply_rope(x, np.arange(3), 100.0, interleaved=True)
    c0, s0, c1, s1 = math.cos(2), math.sin(2), math.cos(0.2), math.sin(0.2)
    close(out[2, 0], [1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1], 1e-6,
          "rope interleaved pos 2")
    # inv_freq = theta^(-2i/hd) for a larger head
    cos, sin = ref.rope_cos_sin(np.array([1]), 8, 10000.0)
    close(np.arctan2(sin[0], cos[0]), [1.0, 10000 ** -0.25, 10000 ** -0.5, 10000 ** -0.75], 1e-7, "inv_freq")


@check
def attention_hand_values():
    # one head, head_dim 1: q = [1, 0], k = [1, 0], v = [2, 4]
    q = np.array([[[1.0]], [[0.0]]], dtype=np.float32)
    k = np.array([[[1.0]], [[0.0]]], dtype=np.float32)
    v = np.array([[[2.0]], [[4.0]]], dtype=np.float32)
    e = math.e
    close(ref.attention(q, k, v)[:, 0, 0], [(2 * e + 4) / (e + 1), 3.0], 1e-6, "bidirectional")
    close(ref.attention(q, k, v, causal=True)[:, 0, 0], [2.0, 3.0], 1e-6, "causal")
    # scale 1/sqrt(head_dim): head_dim 4, q.k = 4 -> score 2
    q4 = np.ones((2, 1, 4), dtype=np.float32)
    k4 = np.array([[[1, 1, 1, 1]], [[0, 0, 0, 0]]], dtype=np.float32)
    v4 = np.array([[[1, 0, 0, 0]], [[0, 0, 0, 0]]], dtype=np.float32)
    close(ref.attention(q4, k4, v4)[0, 0, 0], e ** 2 / (e ** 2 + 1), 1e-6, "scale")


@check
def attention_gqa_grouping():
    # 4 query heads, 2 kv heads: heads 0,1 read kv head 0 and heads 2,3 read kv head 1
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    v = np.zeros((3, 2, 8), dtype=np.float32)
    v[:, 0, :], v[:, 1, :] = 1.0, -1.0
    out = ref.attention(q, k, v)
    close(out[:, :2], np.ones((3, 2, 8)), 1e-6, "gqa group 0")
    close(out[:, 2:], -np.ones((3, 2, 8)), 1e-6, "gqa group 1")
    # equals multi-head attention with explicitly repeated kv heads
    v = rng.standard_normal((3, 2, 8)).astype(np.float32)
    close(ref.attention(q, k, v), ref.attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1)), 1e-6, "gqa = mha")


# ---------------------------------------------------------------------------------------------
# (b) RoPE layouts
# ---------------------------------------------------------------------------------------------

@check
def rope_layouts_differ_and_preserve_norms():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 3, 8)).astype(np.float32)
    pos = np.arange(16) * 7
    a = ref.apply_rope(x, pos, 10000.0)
    b = ref.apply_rope(x, pos, 10000.0, interleaved=True)
    assert np.max(np.abs(a - b)) > 0.1, "rotate-half and interleaved RoPE give the same result"
    for y, name in ((a, "rotate-half"), (b, "interleaved")):
        close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), 1e-4, f"{name} norm")
    # interleaved == rotate-half after permuting dims (2i, 2i+1) -> (i, i + hd/2)
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])
    close(ref.apply_rope(x[..., perm], pos, 10000.0), b[..., perm], 1e-5, "layouts are a permutation")


@check
def rope_is_relative():
    # <R(p) q, R(p') k> depends only on p - p'
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 16)).astype(np.float32)
    for inter in (False, True):
        dots = []
        for p in (3, 10, 40):
            rq = ref.apply_rope(q, np.array([p + 5]), 500000.0, inter)
            rk = ref.apply_rope(k, np.array([p]), 500000.0, inter)
            dots.append(float(np.sum(rq * rk)))
        close(dots, [dots[0]] * 3, 1e-4, f"relative (interleaved={inter})")


# ---------------------------------------------------------------------------------------------
# (c) logit shift and whole-model properties
# ---------------------------------------------------------------------------------------------

@check
def logit_shift():
    L = np.arange(12, dtype=np.float32).reshape(4, 3)
    close(ref.shift_logits(L), [[0, 1, 2], [0, 1, 2], [3, 4, 5], [6, 7, 8]], 0, "shift")
    m = ref.Model(make("dream", "shift"))
    toks = [5, 9, 3, 299, 299, 7]
    h = m.hidden(toks)
    L = m.forward(toks)
    close(L[0], h[0] @ m.head.T, 1e-4, "dream row 0")
    for i in range(1, len(toks)):
        close(L[i], h[i - 1] @ m.head.T, 1e-4, f"dream row {i} from hidden {i - 1}")
    assert np.max(np.abs(L[2] - h[2] @ m.head.T)) > 1e-3, "dream logits are not shifted"
    ml = ref.Model(make("llada", "noshift"))
    close(ml.forward(toks), ml.hidden(toks) @ ml.head.T, 1e-4, "llada is not shifted")


@check
def bidirectional_vs_causal():
    m = ref.Model(make("llada", "causal"))
    a, b = [5, 9, 3, 7, 11], [5, 9, 3, 7, 200]
    La, Lb = m.forward(a), m.forward(b)
    assert np.max(np.abs(La[0] - Lb[0])) > 1e-3, "bidirectional: a later token must change row 0"
    m.causal = True
    La, Lb = m.forward(a), m.forward(b)
    close(La[:4], Lb[:4], 1e-5, "causal: rows before the change are unchanged")


@check
def gqa_model_equals_expanded_mha():
    m = ref.Model(make("dream", "gqa", "--heads", "4", "--kv-heads", "2"))
    toks = [1, 2, 3, 4, 5, 6, 7]
    L = m.forward(toks)
    hd = m.hd
    for ly in m.layers:  # repeat each kv head's rows (and bias) twice -> 4 kv heads
        for key in ("k", "v"):
            w = ly[key].reshape(m.KV, hd, -1)
            ly[key] = np.repeat(w, m.H // m.KV, axis=0).reshape(m.H * hd, -1)
            bb = ly["b" + key]
            ly["b" + key] = np.repeat(bb.reshape(m.KV, hd), m.H // m.KV, axis=0).reshape(-1)
    m.KV = m.H
    close(m.forward(toks), L, 1e-4, "gqa == expanded mha")


@check
def tied_embeddings():
    d = make("dream", "tied", "--seed", "3")
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["tie_word_embeddings"] = True
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    m = ref.Model(d)
    assert m.head is m.emb, "tie_word_embeddings must use embed_tokens as the LM head"


# ---------------------------------------------------------------------------------------------
# LLaDA-MoE: router, expert sum, partial rotary, checkpoint layout
# ---------------------------------------------------------------------------------------------

@check
def moe_route_hand_values():
    # softmax([1, 2, 3, 0]) = e^x / 31.19287485: top-2 = expert 2 (0.6439143), expert 1 (0.2368828)
    ids, w = ref.moe_route(np.array([[1.0, 2.0, 3.0, 0.0]]), 2)
    assert ids.tolist() == [[2, 1]], ids
    close(w, [[0.6439143, 0.2368828]], 1e-6, "softmax top-k, not renormalised")
    ids, w = ref.moe_route(np.array([[1.0, 2.0, 3.0, 0.0]]), 2, norm_topk=True, scale=2.0)
    close(w, [[1.4621172, 0.5378828]], 1e-6, "renormalised and scaled")
    ids, _ = ref.moe_route(np.array([[0.5, 0.5, 0.5, -1.0]]), 2)
    assert ids.tolist() == [[0, 1]], "ties go to the lower expert id"
    close(ref.route_margin(np.array([[1.0, 2.0, 3.0, 0.0]]), 2), [1.0], 1e-7, "margin = 2nd - 3rd logit")
    assert np.isinf(ref.route_margin(np.zeros((1, 2)), 2)[0]), "every expert chosen: no margin"


@check
def moe_ffn_is_the_weighted_sum_of_the_chosen_experts():
    rng = np.random.default_rng(5)
    n, d, f, E, k = 6, 8, 5, 4, 2
    m = rng.standard_normal((n, d)).astype(np.float32)
    shapes = ((f, d), (f, d), (d, f))
    experts = [tuple(rng.standard_normal(s).astype(np.float32) for s in shapes) for _ in range(E)]
    ly = {"router": rng.standard_normal((E, d)).astype(np.float32), "experts": experts, "shared": None}
    out = ref.moe_ffn(m, ly, k)
    z = m @ ly["router"].T
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for r in range(n):  # row by row: the k most probable experts, weighted by their probability
        top = sorted(range(E), key=lambda e: -p[r, e])[:k]
        want = sum(p[r, e] * ref.swiglu_mlp(m[r:r + 1], *experts[e])[0] for e in top)
        close(out[r], want, 1e-4, f"row {r}")
    ly["shared"] = experts[0]
    close(ref.moe_ffn(m, ly, k), out + ref.swiglu_mlp(m, *experts[0]), 1e-5, "shared expert added")


@check
def partial_rotary_rotates_the_first_dims_only():
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]] * 2, dtype=np.float32)  # positions 0, 1; head_dim 4
    out = ref.apply_rope(x, np.arange(2), 100.0, rotary_dim=2)
    close(out[:, 0, 2:], [[3, 4], [3, 4]], 0, "dims past rotary_dim pass through")
    # rotary_dim 2: one pair (0, 1) with inv_freq 100^0 = 1
    c, s_ = math.cos(1), math.sin(1)
    close(out[1, 0, :2], [1 * c - 2 * s_, 2 * c + 1 * s_], 1e-6, "pair (0, 1) rotated by position 1")


# ---------------------------------------------------------------------------------------------
# LLaDA2: grouped sigmoid router, block-causal attention, checkpoint layout
# ---------------------------------------------------------------------------------------------

@check
def sigmoid_group_route_hand_values():
    # 8 experts in 4 groups of 2; logits 0 -> s = 0.5 everywhere, the bias decides the selection.
    bias = np.array([0.0, 0.3, 0.2, 0.2, -0.4, 0.9, 0.1, 0.0], dtype=np.float32)
    ids, w, margin = ref.sigmoid_group_route(np.zeros((1, 8)), bias, 2, 4, 2, 2.5)
    # group scores (top-2 sums of s + bias): 1.3, 1.4, 1.5, 1.1 -> groups 2 and 1 kept; expert 5
    # (0.5 + 0.9) is in group 2 with expert 4; experts by b in groups 1, 2: 5 (1.4), 2 = 3 (0.7: lower id)
    assert ids.tolist() == [[5, 2]], ids
    close(w, [[1.25, 1.25]], 1e-6, "UNBIASED s renormalised (0.5 / 1.0) times 2.5")
    close(margin, [0.0], 1e-7, "expert 2 ties expert 3: zero margin")
    z = np.array([[2.0, -1.0, 0.0, 0.5]], dtype=np.float32)
    ids, w, _ = ref.sigmoid_group_route(z, np.zeros(4, dtype=np.float32), 1, 1, 1, 1.0)
    assert ids.tolist() == [[0]]
    close(w, [[1.0 / (1.0 + math.exp(-2.0))]], 1e-6, "top_k 1: s itself, not renormalised")


@check
def block_causal_attention_hides_later_blocks():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((6, 2, 4)).astype(np.float32) for _ in range(3))
    out = ref.attention(q, k, v, block=4)
    # rows 0..3 (block 0) see keys 0..3 only; rows 4, 5 see all six keys
    close(out[:4], ref.attention(q[:4], k[:4], v[:4]), 1e-6, "block 0 alone")
    close(out[4:], ref.attention(q, k, v)[4:], 1e-6, "the last block sees everything")


@check
def llada2_checkpoint_layout():
    d = make("llada2", "l2", "--seed", "2")
    c = json.load(open(os.path.join(d, "config.json")))
    assert c["model_type"] == "llada2_moe" and c["architectures"] == ["LLaDA2MoeModelLM"]
    assert "mask_token_id" not in c and c["score_function"] == "sigmoid" and c["first_k_dense_replace"] == 1
    w = safetensors_np.read_dir(d)
    assert w["model.layers.0.attention.query_key_value.weight"].shape == (128, 64)  # (4 + 2 * 2) heads * 16
    assert "model.layers.0.mlp.gate_proj.weight" in w and "model.layers.0.mlp.gate.weight" not in w
    assert w["model.layers.1.mlp.gate.expert_bias"].shape == (16,)
    assert np.abs(w["model.layers.1.mlp.gate.expert_bias"]).max() > 0.05, "a non-zero expert bias"
    assert w["model.layers.2.mlp.shared_experts.down_proj.weight"].shape == (64, 32)
    m = ref.Model(d)
    assert m.family == "llada2" and m.mask_id == 296 and m.eos_id == 295 and m.rotary_dim == 8
    toks = [5, 9, 3, 7, 1, 2, 8, 4, 6, 10]
    m.block = 4
    a = m.forward(toks)
    b = m.forward(toks[:8] + [11, 12])
    close(a[:8], b[:8], 0, "rows of earlier blocks ignore later blocks")
    assert np.abs(a[8:] - b[8:]).max() > 1e-3


def expected_moe_tensors(L, d, H, KV, f, V, E, fe, first_dense, shared):
    hd = d // H
    t = {"model.embed_tokens.weight": [V, d], "model.norm.weight": [d], "lm_head.weight": [V, d]}
    for i in range(L):
        b = f"model.layers.{i}."
        t.update({b + "input_layernorm.weight": [d], b + "self_attn.q_proj.weight": [H * hd, d],
                  b + "self_attn.k_proj.weight": [KV * hd, d], b + "self_attn.v_proj.weight": [KV * hd, d],
                  b + "self_attn.o_proj.weight": [d, H * hd], b + "self_attn.q_norm.weight": [hd],
                  b + "self_attn.k_norm.weight": [hd], b + "post_attention_layernorm.weight": [d]})
        if i < first_dense:
            t.update({b + "mlp.gate_proj.weight": [f, d], b + "mlp.up_proj.weight": [f, d],
                      b + "mlp.down_proj.weight": [d, f]})
            continue
        t[b + "mlp.gate.weight"] = [E, d]
        mlps = [(f"{b}mlp.experts.{e}.", fe) for e in range(E)] + ([(b + "shared_expert.", shared)] if shared else [])
        for p, inter in mlps:
            t.update({p + "gate_proj.weight": [inter, d], p + "up_proj.weight": [inter, d],
                      p + "down_proj.weight": [d, inter]})
    return t


@check
def llada_moe_checkpoint_layout():
    for n, (extra, L, first_dense, shared) in enumerate(
            [([], 2, 0, 0), (["--layers", "3", "--first-dense", "1", "--shared-inter", "24"], 3, 1, 24)]):
        d = make("llada_moe", f"moe{n}", *extra)
        w = safetensors_np.read_dir(d)
        want = expected_moe_tensors(L, 64, 4, 4, 160, 300, 8, 32, first_dense, shared)
        assert set(w) == set(want), sorted(set(w) ^ set(want))[:6]
        assert all(list(w[k].shape) == s for k, s in want.items()), "shapes"
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        assert c["model_type"] == "lladamoe" and c["architectures"] == ["LLaDAMoEModelLM"]
        assert (c["num_experts"], c["num_experts_per_tok"], c["expert_intermediate_size"]) == (8, 2, 32)
        assert c["moe_layer_freq"] == [0] * first_dense + [1] * (L - first_dense)
        assert c["qk_layernorm"] is True and c["norm_topk_prob"] is False
        assert c["moe_router_score_function"] == "softmax" and c["moe_router_enable_expert_bias"] is False
        assert c["shared_expert_intermediate_size"] == (shared or None)
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            added = {a["content"]: a["id"] for a in json.load(f)["added_tokens"]}
        assert [added[t] for t in mtc.SPECIALS["llada_moe"]] == list(range(295, 300)), added
        assert c["mask_token_id"] == added["<|mask|>"] and c["eos_token_id"] == added["<|endoftext|>"]
        m = ref.Model(d)
        L_ = m.forward([1, 2, 3, 296])
        assert L_.shape == (4, 300) and np.isfinite(L_).all()
        assert m.margins.shape == (4,) and (m.margins >= 0).all()


# ---------------------------------------------------------------------------------------------
# samplers
# ---------------------------------------------------------------------------------------------

@check
def schedules_and_ties():
    assert ref.llada_schedule(10, 4) == [3, 3, 2, 2]
    assert ref.llada_schedule(8, 8) == [1] * 8
    assert sum(ref.llada_schedule(13, 5)) == 13
    # Dream: steps 4, 8 masked -> ts = [1, .75025, .5005, .25075, .001]
    assert ref.dream_count(8, 0, 4) == int(8 * (1 - 0.75025))  # 1
    assert ref.dream_count(3, 3, 4) == 3
    # ties in confidence go to the lower position
    assert ref.top_positions([4, 7, 9, 12], [0.5, 0.9, 0.9, 0.9], 2) == [1, 2]
    x0, c = ref.confidence(np.array([[0.5, 0.3, 0.2], [0.4, 0.4, 0.2]]), "topk_margin")
    close(c, [0.2, 0.0], 1e-12, "margin")
    assert list(x0) == [0, 0], "argmax ties go to the lower token id"
    _, c = ref.confidence(np.array([[1.0, 0.0], [0.5, 0.5]]), "entropy")
    assert c[0] > c[1], "entropy confidence: certain > uncertain"


@check
def generate_invariants():
    for fam, alg, block in (("llada", "low_confidence", 8), ("dream", "entropy", 16), ("dream", "topk_margin", 8)):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt = [5, 17, 230]
        x, order = ref.generate(m, prompt, 16, 8, block, alg)
        assert x[:3] == prompt, "prompt changed"
        assert m.mask_id not in x, f"{fam} {alg}: masks left"
        flat = sorted(p for s in order for p in s)
        assert flat == list(range(3, 19)), f"{fam} {alg}: each position unmasked exactly once"
        assert len(order) == 8, "one order entry per step"
        if alg == "low_confidence":
            assert [len(s) for s in order] == [2] * 8, "llada schedule: 8 masked / 4 steps per block"
            assert all(lo <= p < lo + 8 for s, lo in zip(order, [3] * 4 + [11] * 4) for p in s), "block order"
        # temperature 0 is deterministic
        assert ref.generate(m, prompt, 16, 8, block, alg) == (x, order)


@check
def window_generate():
    """Windows holding the whole generation reproduce generate() (no cache and refresh every step);
    small windows decide every position once, and a cached row list equals the full forward where the
    kept K / V are current."""
    for fam, alg, block in (("llada", "low_confidence", 8), ("dream", "entropy", 16)):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt = [5, 17, 230]
        want = ref.generate(m, prompt, 16, 8, block, alg)
        for refresh in (0, 1):
            assert ref.generate_window(m, prompt, 16, 8, block, alg, 16, 16, refresh) == want, (fam, refresh)
        x, order = ref.generate_window(m, prompt, 16, 8, block, alg, 6, 3, 3)
        assert m.mask_id not in x and sorted(p for s in order for p in s) == list(range(3, 19)), fam
        toks = x[:19]
        kv = []
        full = m.hidden(toks, record=kv)
        part = m.hidden(toks, cached=([2, 7, 8, 15], kv))
        close(part, full[[2, 7, 8, 15]], 1e-5, "cached rows with current K / V")


def recording_hidden(m):
    """Wraps m.hidden: returns the list that receives ("full" | "select" | "sparse" | rows) per call."""
    calls, inner = [], m.hidden

    def hidden(tokens, record=None, cached=None, record_q=None, patterns=None, sparse_block=0):
        calls.append(list(cached[0]) if cached else "sparse" if patterns is not None
                     else "select" if record_q is not None else "full")
        return inner(tokens, record=record, cached=cached, record_q=record_q, patterns=patterns,
                     sparse_block=sparse_block)
    m.hidden = hidden
    return calls


@check
def cache_generate():
    """Fast-dLLM caches: one step per block (every forward a block's first) is the exact generation;
    later forwards compute the block's rows [lo, end of canvas) (prefix) or [lo, hi) (dual) plus the
    candidates' logit rows; prefix and dual agree when the block ends the canvas."""
    for fam, alg in (("llada", "low_confidence"), ("dream", "entropy")):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt, sfx = [5, 17, 230], [11, 12]
        for c in ("prefix", "dual"):
            exact = ref.generate(m, prompt, 16, 2, 8, alg, suffix=sfx)
            assert ref.generate(m, prompt, 16, 2, 8, alg, cache=c, suffix=sfx) == exact, (fam, c)
            calls = recording_hidden(m)
            x, order = ref.generate(m, prompt, 16, 8, 8, alg, cache=c, suffix=sfx)
            del m.hidden
            assert m.mask_id not in x and sorted(p for s in order for p in s) == list(range(3, 19)), (fam, c)
            assert x[19:] == sfx and len(calls) == len(order), (fam, c)
            for i, st in enumerate(order):
                lo = 3 if st[0] < 11 else 11
                if i == 0 or (order[i - 1][0] < 11) != (lo == 3):
                    assert calls[i] == "full", (fam, c, i, calls[i])
                    continue
                done = {p for o in order[:i] for p in o}
                cand = [p for p in range(lo, lo + 8) if p not in done]
                want = set(range(lo, 21 if c == "prefix" else lo + 8))
                want |= {p - 1 for p in cand} if m.shift else set()  # Dream: row lo - 1 while lo is a candidate
                assert calls[i] == sorted(want), (fam, c, i, calls[i])
        # The block ends the canvas: the two caches compute the same rows.
        assert ref.generate(m, prompt, 16, 8, 16, alg, cache="prefix") == \
            ref.generate(m, prompt, 16, 8, 16, alg, cache="dual"), fam


@check
def infill_generate():
    """A suffix is seen, never decided; an empty one changes nothing; a real one changes the fill."""
    for fam, alg in (("llada", "low_confidence"), ("dream", "entropy")):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt = [5, 17, 230]
        plain = ref.generate(m, prompt, 16, 8, 8, alg)
        assert ref.generate(m, prompt, 16, 8, 8, alg, suffix=[]) == plain, fam
        x, order = ref.generate(m, prompt, 16, 8, 8, alg, suffix=[40, 41, 42, 43])
        assert x[:3] == prompt and x[19:] == [40, 41, 42, 43], fam
        assert sorted(p for s in order for p in s) == list(range(3, 19)), fam
        assert (x[:19], order) != plain, f"{fam}: the suffix changed nothing"


@check
def sparse_generate():
    """SparseD: floor(steps * skip) exact forwards, one that selects, then sparse ones; keeping every
    tile (rho 1) or selecting at the last forward is the dense generation; rho 0 is not."""
    for fam, alg in (("llada", "low_confidence"), ("dream", "entropy")):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt = [5, 17, 230, 8, 9]
        dense = ref.generate(m, prompt, 16, 8, 8, alg)
        calls = recording_hidden(m)
        thin = ref.generate(m, prompt, 16, 8, 8, alg, sparse=dict(block=4, rho=0.0, skip=0.3))
        del m.hidden
        assert calls == ["full"] * 2 + ["select"] + ["sparse"] * (len(calls) - 3), calls
        assert len(calls) == len(thin[1]) and thin != dense, fam
        assert ref.generate(m, prompt, 16, 8, 8, alg, sparse=dict(block=4, rho=1.0, skip=0.2)) == dense, fam
        assert ref.generate(m, prompt, 16, 8, 8, alg, sparse=dict(block=4, rho=0.0, skip=0.9)) == dense, fam
        # The select forward's patterns are sparse_patterns of its own q / k (prompt length 5).
        x = list(prompt) + [m.mask_id] * 16
        qs, kv = [], []
        m.hidden(x, record=kv, record_q=qs)
        mask, _ = ref.sparse_patterns(qs[0], kv[0][0], 4, 0.0, 5)
        assert mask.sum() == m.H * 6 * 2, "rho 0: one prompt and one generation tile per query block"


@check
def generate_logprobs():
    """logprobs: one value per decided position, the log-probability of the greedy token under the
    logits of its step (uncached: the forward of the canvas before that step)."""
    m = ref.Model(make("llada", "gen_llada"))
    prompt = [5, 17, 230]
    lp = {}
    x, order = ref.generate(m, prompt, 16, 8, 8, "low_confidence", logprobs=lp)
    assert sorted(lp) == list(range(3, 19))
    canvas = list(prompt) + [m.mask_id] * 16
    for s in order:
        L = ref.log_softmax64(m.forward(canvas))
        for p in s:
            close(lp[p], L[p].max(), 1e-12, "greedy logprob")
            assert L[p].argmax() == x[p]
        for p in s:
            canvas[p] = x[p]
    lw = {}
    ref.generate_window(m, prompt, 16, 8, 8, "low_confidence", 6, 3, 3, logprobs=lw)
    assert sorted(lw) == list(range(3, 19)) and all(v <= 0 for v in lw.values())


@check
def cfg_generate():
    """cfg: guided logits are L_u + (s + 1)(L_c - L_u), L_u of the canvas with the prompt and the suffix
    masked; both canvases compute the same rows, each from its own cache; one step per block (every
    forward refreshes) is cfg without a cache; a window holding everything is the plain loop."""
    for fam in ("llada", "dream"):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt, sfx = [5, 17, 230], [11, 12]
        x = prompt + [m.mask_id] * 8 + sfx
        u = [m.mask_id] * 3 + [m.mask_id] * 8 + [m.mask_id] * 2
        Lc, Lu = m.forward(x), m.forward(u)
        got = ref.guided_logits(m, x, len(x), 3, 8, [4, 6], None, {}, 1.5)
        close(got, Lu[[4, 6]] + np.float32(2.5) * (Lc[[4, 6]] - Lu[[4, 6]]), 1e-5, f"{fam} guided logits")
        assert ref.generate(m, prompt, 16, 8, 8, "low_confidence", cfg=1.0) != \
            ref.generate(m, prompt, 16, 8, 8, "low_confidence"), f"{fam}: cfg changed nothing"
        for c in ("prefix", "dual"):
            assert ref.generate(m, prompt, 16, 2, 8, "low_confidence", cache=c, cfg=1.0, suffix=sfx) == \
                ref.generate(m, prompt, 16, 2, 8, "low_confidence", cfg=1.0, suffix=sfx), (fam, c)
            calls = recording_hidden(m)
            ref.generate(m, prompt, 16, 8, 8, "low_confidence", cache=c, cfg=1.0)
            del m.hidden
            assert calls[0::2] == calls[1::2] and len(calls) == 16, (fam, c, calls)
        want = ref.generate(m, prompt, 16, 8, 8, "low_confidence", cfg=1.0, suffix=sfx)
        for refresh in (0, 1):
            assert ref.generate_window(m, prompt, 16, 8, 8, "low_confidence", 16, 16, refresh, cfg=1.0,
                                       suffix=sfx) == want, (fam, refresh)
        calls = recording_hidden(m)
        x, order = ref.generate_window(m, prompt, 16, 8, 8, "low_confidence", 6, 3, 3, cfg=1.0)
        del m.hidden
        assert calls[0::2] == calls[1::2] and m.mask_id not in x, (fam, calls)


@check
def window_suffix_generate():
    """The window with a suffix prunes nothing (every forward sees the whole canvas) and decides every
    position once; a window holding everything is the suffix loop."""
    for fam, alg in (("llada", "low_confidence"), ("dream", "entropy")):
        m = ref.Model(make(fam, "gen_" + fam))
        prompt, sfx = [5, 17, 230], [40, 41, 42]
        want = ref.generate(m, prompt, 16, 8, 8, alg, suffix=sfx)
        for refresh in (0, 1):
            assert ref.generate_window(m, prompt, 16, 8, 8, alg, 16, 16, refresh, suffix=sfx) == want, fam
        seen, inner = [], m.hidden
        m.hidden = lambda t, **kw: seen.append(len(t)) or inner(t, **kw)
        x, order = ref.generate_window(m, prompt, 16, 8, 8, alg, 4, 2, 3, suffix=sfx)
        del m.hidden
        assert set(seen) == {22} and x[19:] == sfx, (fam, seen)
        assert sorted(p for s in order for p in s) == list(range(3, 19)), fam
        # SparseD keeping every tile is the dense infilling
        assert ref.generate(m, prompt, 16, 8, 8, alg, suffix=sfx, sparse=dict(block=4, rho=1.0, skip=0.2)) == want


@check
def des_generate():
    """DES whose coreset keeps every voting row's experts (vote, beta 1) is exact, with the window and cfg;
    a real coreset changes the generation; the voting rows of a cached forward are its computed rows
    inside the canvas positions [lo, hi)."""
    m = ref.Model(make("llada_moe", "gen_moe", "--experts", "16", "--top-k", "4"))
    prompt, full, small = [5, 17, 230], dict(mode="vote", beta=1.0), dict(mode="vote", beta=0.25)
    runs = (lambda **kw: ref.generate(m, prompt, 16, 8, 8, "low_confidence", **kw),
            lambda **kw: ref.generate_window(m, prompt, 16, 8, 8, "low_confidence", 6, 3, 3, **kw))
    for run in runs:
        changed = False
        for cfg in (0.0, 1.0):
            plain = run(cfg=cfg)
            assert run(cfg=cfg, des=full) == plain, (run, cfg)
            changed |= run(cfg=cfg, des=small) != plain
        assert changed, run
    # A forward of every row voting with positions 6..11 fills the cache; recomputing rows 6..11 (rows 0..5
    # of the cached forward) with the same votes gives the same rows; without votes, others.
    x = prompt + [m.mask_id] * 16
    ref.des_setup(m, small)
    m.des["lo"], m.des["hi"] = 6, 12
    kv = []
    whole = m.hidden(x, record=kv)
    close(m.hidden(x, cached=(list(range(6, 12)), kv)), whole[6:12], 1e-5, "votes by canvas position")
    m.des["lo"], m.des["hi"] = 0, 6
    assert np.abs(m.hidden(x, cached=(list(range(6, 12)), kv)) - whole[6:12]).max() > 1e-4, "no voting rows"
    m.des = None


# ---------------------------------------------------------------------------------------------
# LLaDA2.1 draft and edit (ref_editing.py): the checks are in selftest_editing.py
# ---------------------------------------------------------------------------------------------

selftest_editing.register(check, make, close)


# ---------------------------------------------------------------------------------------------
# (d) make_tiny_checkpoint output
# ---------------------------------------------------------------------------------------------

def expected_tensors(family, L, d, H, KV, f, V, bias):
    hd = d // H
    if family == "llada":
        p = "model.transformer."
        t = {p + "wte.weight": [V, d], p + "ln_f.weight": [d], p + "ff_out.weight": [V, d]}
        for i in range(L):
            b = f"{p}blocks.{i}."
            t.update({b + "attn_norm.weight": [d], b + "q_proj.weight": [H * hd, d],
                      b + "k_proj.weight": [KV * hd, d], b + "v_proj.weight": [KV * hd, d],
                      b + "attn_out.weight": [d, H * hd], b + "ff_norm.weight": [d], b + "ff_proj.weight": [f, d],
                      b + "up_proj.weight": [f, d], b + "ff_out.weight": [d, f]})
            if bias:
                t.update({b + "q_proj.bias": [H * hd], b + "k_proj.bias": [KV * hd], b + "v_proj.bias": [KV * hd]})
        return t
    t = {"model.embed_tokens.weight": [V, d], "model.norm.weight": [d], "lm_head.weight": [V, d]}
    for i in range(L):
        b = f"model.layers.{i}."
        t.update({b + "input_layernorm.weight": [d], b + "self_attn.q_proj.weight": [H * hd, d],
                  b + "self_attn.k_proj.weight": [KV * hd, d], b + "self_attn.v_proj.weight": [KV * hd, d],
                  b + "self_attn.o_proj.weight": [d, H * hd], b + "post_attention_layernorm.weight": [d],
                  b + "mlp.gate_proj.weight": [f, d], b + "mlp.up_proj.weight": [f, d],
                  b + "mlp.down_proj.weight": [d, f]})
        if bias:
            t.update({b + "self_attn.q_proj.bias": [H * hd], b + "self_attn.k_proj.bias": [KV * hd],
                      b + "self_attn.v_proj.bias": [KV * hd]})
    return t


@check
def checkpoint_names_shapes_dtypes_sharding():
    cases = [("llada", ["--shards", "2"], 4, False), ("llada", ["--shards", "1", "--dtype", "f32"], 4, False),
             ("dream", ["--shards", "3", "--layers", "3"], 2, True),
             ("dream", ["--no-qkv-bias", "--kv-heads", "1"], 1, False),
             ("llada", ["--qkv-bias", "--kv-heads", "2", "--vocab", "400"], 2, True)]
    for n, (fam, extra, KV, bias) in enumerate(cases):
        d = make(fam, f"ckpt{n}", *extra)
        shards = int(extra[extra.index("--shards") + 1]) if "--shards" in extra else 2
        layers = int(extra[extra.index("--layers") + 1]) if "--layers" in extra else 2
        V = int(extra[extra.index("--vocab") + 1]) if "--vocab" in extra else 300
        dt = "F32" if "f32" in extra else "BF16"
        want = expected_tensors(fam, layers, 64, 4, KV, 160, V, bias)
        files = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))
        index = os.path.join(d, "model.safetensors.index.json")
        if shards == 1:
            assert files == ["model.safetensors"] and not os.path.exists(index), f"{fam}: single file layout"
        else:
            assert files == [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)], files
            with open(index) as f:
                idx = json.load(f)
            assert set(idx["weight_map"]) == set(want), "index names"
            assert set(idx["weight_map"].values()) == set(files), "every shard is used"
        total = 0
        for fn in files:
            path = os.path.join(d, fn)
            with open(path, "rb") as f:
                hlen = int.from_bytes(f.read(8), "little")
            assert hlen % 8 == 0, "header not padded to 8"
            hdr = safetensors_np.read_header(path)
            assert hdr["__metadata__"] == {"format": "pt"}
            for name, t in hdr.items():
                if name == "__metadata__":
                    continue
                assert t["dtype"] == dt, f"{name} dtype {t['dtype']}"
                assert t["shape"] == want[name], f"{name} shape {t['shape']} != {want[name]}"
                total += t["data_offsets"][1] - t["data_offsets"][0]
            assert os.path.getsize(path) == 8 + hlen + max(t["data_offsets"][1] for k, t in hdr.items()
                                                           if k != "__metadata__"), "file size"
        if shards > 1:
            assert idx["metadata"]["total_size"] == total, "total_size"
        w = safetensors_np.read_dir(d)
        assert set(w) == set(want) and all(list(w[k].shape) == s for k, s in want.items())
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        if fam == "llada":
            assert c["model_type"] == "llada" and c["architectures"] == ["LLaDAModelLM"]
            assert (c["d_model"], c["n_layers"], c["n_kv_heads"], c["vocab_size"]) == (64, layers, KV, V)
            assert c["include_qkv_bias"] == bias and c["weight_tying"] is False
        else:
            assert c["model_type"] == "Dream" and c["architectures"] == ["DreamModel"]
            assert (c["hidden_size"], c["num_hidden_layers"], c["num_key_value_heads"]) == (64, layers, KV)
            assert c["tie_word_embeddings"] is False and c["rope_scaling"] is None
        ref.Model(d).forward([1, 2, 3])  # loads and runs


@check
def checkpoint_tokenizer_and_specials():
    for fam, specials in (("llada", {"<|endoftext|>": 294, "<|startoftext|>": 295, "<|mdm_mask|>": 296,
                                     "<|eot_id|>": 297, "<|start_header_id|>": 298, "<|end_header_id|>": 299}),
                          ("dream", {"<|endoftext|>": 296, "<|im_start|>": 297, "<|im_end|>": 298,
                                     "<|mask|>": 299})):
        d = make(fam, "tok_" + fam)
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            tc = json.load(f)
        vocab = tok["model"]["vocab"]
        added = {a["content"]: a["id"] for a in tok["added_tokens"]}
        ids = sorted(list(vocab.values()) + list(added.values()))
        assert ids == list(range(300)), f"{fam}: ids must be exactly 0..299"
        assert all(added[s] == i for s, i in specials.items()), f"{fam}: special ids {added}"
        assert all(a["special"] for a in tok["added_tokens"])
        b2u = mtc.bytes_to_unicode()
        assert all(vocab[b2u[b]] == b for b in range(256)), "byte symbols are ids 0..255"
        merged = [p for p, i in vocab.items() if i >= 256]
        assert len(merged) == 300 - 256 - len(specials) and "Ġthe" in merged, f"{fam}: merges {merged[:8]}"
        for m in tok["model"]["merges"]:  # every merge result is in the vocab
            a, b = m.split(" ")
            assert a in vocab and b in vocab and a + b in vocab, m
        assert tok["model"]["type"] == "BPE" and tok["pre_tokenizer"]["type"] == "ByteLevel"
        assert tok["pre_tokenizer"]["use_regex"] is True and tok["pre_tokenizer"]["add_prefix_space"] is False
        assert tok["decoder"]["type"] == "ByteLevel"
        mask = "<|mdm_mask|>" if fam == "llada" else "<|mask|>"
        assert c["mask_token_id"] == specials[mask] and c["eos_token_id"] == specials["<|endoftext|>"]
        assert c["pad_token_id"] == specials["<|endoftext|>"]
        assert tc["mask_token"] == mask and tc["eos_token"] == "<|endoftext|>"
        if fam == "llada":
            assert c["bos_token_id"] == specials["<|startoftext|>"] and "<|start_header_id|>" in tc["chat_template"]
        else:
            assert "<|im_start|>" in tc["chat_template"]
        assert os.path.exists(os.path.join(d, "generation_config.json"))


@check
def bf16_round_to_nearest_even():
    one = 1.0
    vals = np.array([one, one + 2 ** -8, one + 3 * 2 ** -8, one + 2 ** -8 + 2 ** -20, -2.5, 3.4e38, np.inf],
                    dtype=np.float32)
    want = np.array([one, one, one + 2 ** -6, one + 2 ** -7, -2.5, np.inf, np.inf], dtype=np.float32)
    got = safetensors_np.bf16_bits_to_f32(mtc.f32_to_bf16_bits(vals))
    assert np.array_equal(got, want), f"bf16 rounding {got} != {want}"
    assert np.isnan(safetensors_np.bf16_bits_to_f32(mtc.f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    # a bf16 checkpoint holds exactly the bf16-rounded weights of the f32 checkpoint of the same seed
    a = safetensors_np.read_dir(make("dream", "rt_f32", "--dtype", "f32", "--seed", "7"))
    b = safetensors_np.read_dir(make("dream", "rt_bf16", "--dtype", "bf16", "--seed", "7"))
    for k in a:
        assert np.array_equal(safetensors_np.bf16_bits_to_f32(mtc.f32_to_bf16_bits(a[k])), b[k]), k
        rel = np.max(np.abs(a[k] - b[k]) / np.maximum(np.abs(a[k]), 1e-30))
        assert rel <= 2 ** -8, f"{k}: bf16 relative error {rel}"


@check
def weight_statistics():
    w = safetensors_np.read_dir(make("llada", "stats", "--dtype", "f32", "--hidden", "128", "--vocab", "600"))
    p = "model.transformer."
    assert abs(w[p + "wte.weight"].std() - 1.0) < 0.05, "embedding std 1"
    q = w[p + "blocks.0.q_proj.weight"]
    assert abs(q.std() * math.sqrt(128) - 1.0) < 0.05, "linear std 1/sqrt(fan_in)"
    n = w[p + "blocks.0.attn_norm.weight"]
    assert abs(n.mean() - 1.0) < 0.05 and 0.05 < n.std() < 0.15, "norm weights 1 + 0.1 N"


@check
def cli_logits_rows():
    d = make("dream", "cli")
    out = os.path.join(TMP, "l.bin")
    script = os.path.join(HERE, "reference.py")
    subprocess.run([sys.executable, script, "logits", "--model", d, "--tokens", "5,9,3,299", "--rows", "3,0",
                    "--out", out], check=True)
    got = np.fromfile(out, dtype="<f4").reshape(2, 300)
    full = ref.Model(d).forward([5, 9, 3, 299])
    close(got, full[[3, 0]], 0, "rows in the order given")
    assert got.std() > 0.3, "logits should vary meaningfully"
    r = subprocess.run([sys.executable, script, "generate", "--model", d, "--prompt", "5,9", "--gen-length", "8",
                        "--steps", "4", "--block-length", "8", "--alg", "maskgit_plus"], check=True,
                       capture_output=True, text=True)
    j = json.loads(r.stdout)
    assert len(j["tokens"]) == 10 and len(j["order"]) == 4


import selftest_combos  # noqa: E402 (SparseD with the window and cfg, the window and SparseD on LLaDA2)
selftest_combos.register(check, make, close, recording_hidden)
import selftest_nemotron  # noqa: E402 (Nemotron-Labs-Diffusion: ref_nemotron.py and --family nemotron)
selftest_nemotron.register(check, close, TMP)
import selftest_diffusion_gemma  # noqa: E402 (DiffusionGemma: ref_diffusion_gemma.py and --family diffusion_gemma)
selftest_diffusion_gemma.register(check, close, TMP)


def main():
    passed = failed = 0
    for fn in CHECKS:
        try:
            fn()
            passed += 1
        except Exception:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            print(f"FAIL {fn.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
