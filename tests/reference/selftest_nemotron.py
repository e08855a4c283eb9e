"""Checks of the Nemotron-Labs-Diffusion reference (ref_nemotron.py) and of make_tiny_checkpoint.py --family
nemotron. Run by selftest.py, which registers them (register) in its own order. Checkpoints are written
in-process (make_tiny_checkpoint.main) to keep the run short."""
import contextlib
import io
import json
import math
import os
import shutil
import sys

import numpy as np

import make_tiny_checkpoint as mtc
import ref_nemotron as rn
import safetensors_np

close = TMP = None  # selftest.py's helper and temporary folder (register)
_MADE = {}


def register(check, close_fn, tmp):
    """Registers this file's checks with selftest.py's `check`; close / tmp are selftest.py's."""
    global close, TMP
    close, TMP = close_fn, tmp
    for fn in (nemotron_checkpoint_layout, nemotron_yarn_table_hand_values, nemotron_attention_factor,
               nemotron_masks, nemotron_llama4_query_scale, nemotron_threshold_rule, nemotron_ar_trace,
               nemotron_spec_equals_ar, nemotron_spec_accepts_scripted_drafts, nemotron_diffusion_end_to_end,
               nemotron_cli, nemotron_lora_files, nemotron_lora_forward, nemotron_lora_loops, nemotron_lora_cli):
        check(fn)


def run_main(main, argv):
    """Runs a script's main() in-process with argv; returns (exit code, stdout)."""
    old, out = sys.argv, io.StringIO()
    sys.argv = ["prog"] + argv
    try:
        with contextlib.redirect_stdout(out):
            rc = main()
    finally:
        sys.argv = old
    return rc or 0, out.getvalue()


def made(name, *extra):
    """A nemotron checkpoint under TMP (written once per name)."""
    if name not in _MADE:
        out = os.path.join(TMP, "nemotron_" + name)
        run_main(mtc.main, ["--family", "nemotron", "--out", out, *extra])
        _MADE[name] = out
    return _MADE[name]


def small():
    """The loops' model: 2 layers, hidden 32, 2 heads of 20 (q_proj out 40 != 32), 1 kv head, vocab 270."""
    return rn.NemotronModel(made("small", *SMALL))


SMALL = ("--hidden", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "20", "--intermediate", "64", "--vocab",
         "270", "--dtype", "f32", "--seed", "3")


def small_lora():
    """small()'s checkpoint plus a rank-3 linear_spec_lora/ (alpha 6, scale 2): the same base weights."""
    return rn.NemotronModel(made("small_lora", *SMALL, "--nemotron-lora", "3"))


def exits(main, argv):
    """The message of the SystemExit that main(argv) raises (fails if it returns)."""
    try:
        run_main(main, argv)
    except SystemExit as e:
        return str(e.code)
    raise AssertionError(f"{argv} did not fail")


def read_json(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def nemotron_checkpoint_layout():
    d = made("default")
    want = {"encoder.embed_tokens.weight": [300, 64], "encoder.norm.weight": [64], "diffusion_head.weight": [300, 64]}
    for i in range(2):
        b = f"encoder.layers.{i}."
        want.update({b + "input_layernorm.weight": [64], b + "self_attn.q_proj.weight": [96, 64],
                     b + "self_attn.k_proj.weight": [48, 64], b + "self_attn.v_proj.weight": [48, 64],
                     b + "self_attn.o_proj.weight": [64, 96], b + "post_attention_layernorm.weight": [64],
                     b + "mlp.gate_proj.weight": [160, 64], b + "mlp.up_proj.weight": [160, 64],
                     b + "mlp.down_proj.weight": [64, 160]})
    files = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], files
    idx = read_json(d, "model.safetensors.index.json")
    assert set(idx["weight_map"]) == set(want) and set(idx["weight_map"].values()) == set(files)
    for fn in files:
        hdr = safetensors_np.read_header(os.path.join(d, fn))
        for name, t in hdr.items():
            if name != "__metadata__":
                assert t["dtype"] == "BF16" and t["shape"] == want[name], (name, t)
    c = read_json(d, "config.json")
    assert c["architectures"] == ["NemotronLabsDiffusionModel"] and c["model_type"] == "nemotron_labs_diffusion"
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
            c["num_key_value_heads"], c["head_dim"], c["vocab_size"]) == (64, 160, 2, 4, 2, 24, 300)
    assert c["tie_word_embeddings"] is False and c["attention_bias"] is False and c["rms_norm_eps"] == 1e-5
    assert c["max_position_embeddings"] == 262144 and c["block_size"] == 32 and c["dlm_paradigm"] == "bidirectional"
    assert c["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                                    "original_max_position_embeddings": 64, "llama_4_scaling_beta": 0.1,
                                    "beta_fast": 32.0, "beta_slow": 1.0}, c["rope_parameters"]
    assert c["torch_dtype"] == "bfloat16" and c["use_cache"] is False and c["hidden_act"] == "silu"
    tok = read_json(d, "tokenizer.json")
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    specials = {"<unk>": 294, "<s>": 295, "</s>": 296, "[INST]": 297, "[/INST]": 298, "<mask>": 299}
    assert all(added[s] == i for s, i in specials.items()), added
    assert sorted(list(tok["model"]["vocab"].values()) + list(added.values())) == list(range(300))
    assert (c["mask_token_id"], c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (299, 295, 296, 296)
    tc, gen = read_json(d, "tokenizer_config.json"), read_json(d, "generation_config.json")
    assert (tc["mask_token"], tc["bos_token"], tc["eos_token"], tc["pad_token"]) == ("<mask>", "<s>", "</s>", "</s>")
    assert "[INST]" in tc["chat_template"] and gen["eos_token_id"] == 296 and gen["bos_token_id"] == 295
    m = rn.NemotronModel(d)
    assert m.hd == 24 and abs(float(m.attn_factor) - 1.2772588722) < 1e-7 and m.logits([1, 2, 3]).shape == (3, 300)
    # --nemotron-mscale, f32, one file, explicit head_dim with hidden not a multiple of heads
    d = made("mscale", "--nemotron-mscale", "--dtype", "f32", "--shards", "1", "--hidden", "48", "--heads", "3",
             "--kv-heads", "1", "--head-dim", "20", "--layers", "1")
    c = read_json(d, "config.json")
    assert c["rope_parameters"]["mscale"] == 1.0 and c["rope_parameters"]["mscale_all_dim"] == 1.0
    assert os.listdir(d).count("model.safetensors") == 1 and not os.path.exists(
        os.path.join(d, "model.safetensors.index.json"))
    hdr = safetensors_np.read_header(os.path.join(d, "model.safetensors"))
    q, k = hdr["encoder.layers.0.self_attn.q_proj.weight"], hdr["encoder.layers.0.self_attn.k_proj.weight"]
    assert (q["dtype"], q["shape"], k["shape"]) == ("F32", [60, 48], [20, 48])
    m = rn.NemotronModel(d)
    assert m.attn_factor == 1.0 and m.logits([5, 6]).shape == (2, 300)


def nemotron_yarn_table_hand_values():
    # dim 8, theta 1e4, factor 4, orig 64: pos_freqs 1, 10, 100, 1000; correction dims (8 ln(64 / 2 pi r)
    # / (2 ln 1e4)): r = 32 -> -0.4972 (floor -1, clamped 0), r = 1 -> 1.0080 (ceil 2); ramp = i / 2 ->
    # 0, 0.5, 1, 1; inv = [1, 0.5 * 0.1 + 0.5 * 0.025, 0.01 / 4, 0.001 / 4].
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    inv, af = rn.yarn_parameters(rope, 8)
    close(inv, [1.0, 0.0625, 0.0025, 0.00025], 1e-12, "yarn dim 8")
    close(af, 1.1386294361, 1e-9, "0.1 ln 4 + 1")
    # truncate false: low 0, high 1.0080001; ramp[1] = 1 / 1.0080001 = 0.9920634 -> 0.025 + 0.075 * 0.0079366
    inv, _ = rn.yarn_parameters({**rope, "truncate": False}, 8)
    close(inv, [1.0, 0.02559525, 0.0025, 0.00025], 1e-8, "yarn no truncation")
    # beta_fast / beta_slow / factor defaults: factor = max_pos / orig = 4, betas 32 / 1
    inv, af = rn.yarn_parameters({"rope_theta": 10000.0, "original_max_position_embeddings": 64}, 8, 256)
    close(inv, [1.0, 0.0625, 0.0025, 0.00025], 1e-12, "yarn defaults")
    # the tiny config (dim 24, theta 1e6, factor 16, orig 64): low 0 (-0.9943), high 3 (2.0160); ramp i / 3;
    # extrapolation 10^(-i/2): i = 1: 0.316228 * (2/3 + 1/48) = 0.2174066, i = 2: 0.1 * (1/3 + 2/48) = 0.0375,
    # i >= 3 interpolated: 10^(-i/2) / 16.
    inv32, _, _ = rn.rope_table(read_json(made("default"), "config.json"), 24)
    want = [1.0, 0.21740659, 0.0375] + [10 ** (-i / 2) / 16 for i in range(3, 12)]
    assert inv32.dtype == np.float32
    close(np.asarray(inv32) / np.asarray(want), np.ones(12), 2e-7, "tiny yarn table")
    # the real 3B (dim 128, orig 16384): low floor(20.385) = 20, high ceil(36.440) = 37
    inv, _ = rn.yarn_parameters({"rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 16384}, 128)
    ext = 1e6 ** (-np.arange(0, 128, 2) / 128)
    close(inv[:21], ext[:21], 1e-15, "extrapolated below low")
    close(inv[37:], ext[37:] / 16, 1e-15, "interpolated from high")
    close(inv[30], ext[30] * (10 / 17 / 16 + 7 / 17), 1e-15, "ramp 10/17")
    # factor 1 is plain RoPE
    inv, af = rn.yarn_parameters({**rope, "factor": 1.0}, 8)
    close(inv, [1.0, 0.1, 0.01, 0.001], 1e-15, "factor 1")
    assert af == 1.0


def nemotron_attention_factor():
    base = {"rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 64}
    for extra, want in (({}, 1.2772588722), ({"mscale": 1.0, "mscale_all_dim": 1.0}, 1.0),
                        ({"mscale": 0.707, "mscale_all_dim": 1.0}, 1.196022023 / 1.2772588722),
                        ({"mscale": 1.0}, 1.2772588722), ({"mscale": 0, "mscale_all_dim": 1.0}, 1.2772588722),
                        ({"attention_factor": 0.5, "mscale": 1.0, "mscale_all_dim": 1.0}, 0.5)):
        _, af = rn.yarn_parameters({**base, **extra}, 24)
        close(af, want, 1e-7, f"attention_factor {extra}")
    # cos and sin are both scaled: q.k grows by attention_factor^2 at every relative position
    m = small()
    q = np.random.default_rng(0).standard_normal((5, 1, 20)).astype(np.float32)
    qr = m.rope(q, np.arange(5))
    m.attn_factor = np.float32(1.0)
    close(qr, m.rope(q, np.arange(5)) * np.float32(1.2772588722), 2e-6, "rope times attention_factor")
    close(np.linalg.norm(m.rope(q, np.arange(5)), axis=-1), np.linalg.norm(q, axis=-1), 2e-5, "rotation only")


def nemotron_masks():
    m = small()
    toks = [5, 17, 230, 8, 9, 100, 101, 102, 40, 41, 42, 43]
    causal = m.logits(toks)
    other = m.logits(toks[:8] + [7, 7, 7, 7])
    close(causal[:8], other[:8], 1e-6, "causal rows ignore later tokens")
    assert np.abs(causal[8:] - other[8:]).max() > 1e-3
    draft = m.logits(toks, bidir_from=6)
    close(draft[:6], causal[:6], 1e-6, "draft prefix rows are the causal rows")
    assert np.abs(draft[6:11] - causal[6:11]).min(axis=1).min() > 0 and np.abs(draft[6:11] - causal[6:11]).max() > 1e-3
    close(m.logits(toks, bidir_from=len(toks)), causal, 0, "bidir_from n is causal")
    close(m.logits(toks, bidir_from=11)[11], causal[11], 1e-6, "the last row sees everything either way")
    full = m.logits(toks, bidir_from=0)
    assert np.abs(full[0] - causal[0]).max() > 1e-3, "bidir_from 0: row 0 sees later keys"
    close(m.logits(toks, bidir_from=6, rows=[9, 6]), draft[[9, 6]], 1e-6, "rows")
    # draft rows see the whole block: changing the block's last token changes its first row
    d2 = m.logits(toks[:11] + [3], bidir_from=6)
    close(d2[:6], draft[:6], 1e-6, "prefix unaffected")
    assert np.abs(d2[6] - draft[6]).max() > 1e-4


def nemotron_llama4_query_scale():
    s = rn.llama4_scale([0, 1, 63, 64, 127, 128, 200], 0.1, 64)
    close(s, [1, 1, 1, 1.0693147181, 1.0693147181, 1.1098612289, 1.1386294361], 1e-7, "1 + 0.1 ln(1 + floor(p/64))")
    assert s.dtype == np.float32 and s[2] == 1.0
    m = small()
    toks = [int(t) for t in np.random.default_rng(1).integers(0, 260, 70)]
    with_scale = m.logits(toks)
    m.layers = m.layers[:1]  # one layer: a bidirectional row below 64 sees keys >= 64 that q's scale leaves alone
    bidir = m.logits(toks, bidir_from=0)
    m.beta = 0.0
    bidir0 = m.logits(toks, bidir_from=0)
    close(bidir[:64], bidir0[:64], 0, "q only: rows below 64 unchanged even when they see keys >= 64")
    assert np.abs(bidir[64:] - bidir0[64:]).max(axis=1).min() > 1e-4, "every row >= 64 changes"
    m = small()
    m.beta = 0.0
    plain = m.logits(toks)
    close(with_scale[:64], plain[:64], 0, "no scale below original_max (causal)")
    assert np.abs(with_scale[64:] - plain[64:]).max(axis=1).min() > 1e-4, "every row >= 64 changes"


def nemotron_threshold_rule():
    pos, conf = [10, 11, 12, 13], [0.2, 0.95, 0.2, 0.9]
    assert rn.threshold_choice(pos, conf, 0.9) == [1, 3]
    assert rn.threshold_choice(pos, conf, 0.99) == [1], "the top one always"
    assert rn.threshold_choice(pos, [0.2, 0.1, 0.2, 0.1], 0.5) == [0], "ties: lower position"
    assert sorted(rn.threshold_choice(pos, conf, 0.0)) == [0, 1, 2, 3]
    tok, c = rn.pick(np.array([[1.0, 3.0, 3.0, 0.0]], dtype=np.float32))
    assert tok == [1] and abs(c[0] - math.exp(3) / (math.exp(1) + 2 * math.exp(3) + 1)) < 1e-12


def nemotron_ar_trace():
    m = small()
    prompt, n = [5, 17, 230], 10
    gen, trace = rn.generate_ar(m, prompt, n)
    assert len(trace) == n and all(t["kind"] == "causal" for t in trace)
    assert trace[0]["rows"] == [0, 3] and [t["rows"] for t in trace[1:]] == [[p - 1, p] for p in range(4, 13)]
    x = prompt + gen
    for p in range(3, 13):  # every token is the argmax of row p - 1 of a causal pass over x[:p]
        assert x[p] == int(np.argmax(m.logits(x[:p])[p - 1])) and trace[p - 3]["decided"] == [[p, x[p]]]
    eos = gen[4]
    g2, t2 = rn.generate_ar(m, prompt, n, eos)
    k = gen.index(eos)
    assert g2 == gen[:k + 1] + [m.mask_id] * (n - k - 1) and len(t2) == k + 1


def nemotron_spec_equals_ar():
    m = small()
    for prompt in ([5, 17, 230], [40, 41, 42, 43, 44, 45, 46], [261]):
        ar, _ = rn.generate_ar(m, prompt, 12)
        for block in (4, 8, 32):
            for thr in (0.0, 0.5):
                gen, trace = rn.generate_spec(m, prompt, 12 if thr == 0 else 7, block, thr)
                assert gen == ar[:len(gen)], (prompt, block, thr, gen, ar)
                verifies = [t for t in trace if t["kind"] == "verify"]
                assert sum(len(t["decided"]) for t in verifies) == len(gen) - 1
                assert all(t["rows"][1] - t["rows"][0] <= block for t in trace[1:])
                if thr == 0:  # one draft per cycle
                    assert [t["kind"] for t in trace[1:]] == ["draft", "verify"] * len(verifies)
        eos = ar[5]
        want, _ = rn.generate_ar(m, prompt, 12, eos)
        assert rn.spec_matches_ar(m, prompt, 12, 8, 0.0, eos)[0], (prompt, eos)
        k = ar.index(eos)
        assert want == ar[:k + 1] + [m.mask_id] * (11 - k)


class ChainModel:
    """A stand-in model over a vocabulary of 50 (mask 49): a causal row predicts (5 t + 7) % 48 of its token t
    (from 3: 16 distinct tokens, then it repeats); a draft row at position p >= c predicts the chain from the
    seed at c, p - c steps on, except at the positions in `wrong` (another token). The predicted token's
    probability: 0.9 at even positions, 0.3 at odd ones."""
    mask_id = 49

    def __init__(self, wrong=()):
        self.wrong = set(wrong)

    @staticmethod
    def nxt(t):
        return (t * 5 + 7) % 48

    def logits(self, tokens, bidir_from=None, rows=None, lora=False):
        n = len(tokens)
        c = n if bidir_from is None else bidir_from
        out = np.zeros((n, 50), dtype=np.float32)
        for i in range(n):
            if i < c:
                t = self.nxt(tokens[i])
            else:
                t = tokens[c]
                for _ in range(i - c):
                    t = self.nxt(t)
                t = (t + 1) % 48 if i in self.wrong else t
            q = 0.9 if i % 2 == 0 else 0.3
            out[i] = np.log((1 - q) / 49)
            out[i, t] = np.log(q)
        return out if rows is None else out[rows]


def nemotron_spec_accepts_scripted_drafts():
    m = ChainModel()
    chain = [3]
    for _ in range(23):
        chain.append(ChainModel.nxt(chain[-1]))
    ar, _ = rn.generate_ar(m, [1, 2, 3], 20)
    assert ar == chain[1:21]
    # perfect drafts, B = 8: seed 3; cycles at 3 (accept 8), 11 (8), 19 (e = 23: 3 matches + bonus 4,
    # capped to 3 so the last seed is 22); then e = c + 1 stops
    gen, trace = rn.generate_spec(m, [1, 2, 3], 20, 8)
    assert gen == ar and len(trace) == 7
    assert [(t["kind"], t["rows"], len(t["decided"])) for t in trace] == [
        ("causal", [0, 3], 1), ("draft", [3, 11], 7), ("verify", [3, 11], 8), ("draft", [11, 19], 7),
        ("verify", [11, 19], 8), ("draft", [19, 23], 3), ("verify", [19, 23], 3)]
    # a wrong draft at position 6: the cycle at 3 accepts 4..6 (6 takes the AR token), the next seed is 6
    gen, trace = rn.generate_spec(ChainModel(wrong=[6]), [1, 2, 3], 20, 8)
    assert gen == ar and trace[2]["decided"] == [[p, chain[p - 2]] for p in (4, 5, 6)]
    assert trace[3]["rows"] == [6, 14]
    # threshold 0.5: each draft decides the top slot (even positions: 0.9, lowest first) plus the others
    # >= 0.5 (the even ones), then the odd ones one at a time
    gen, trace = rn.generate_spec(m, [1, 2, 3], 8, 6, 0.5)
    assert gen == ar[:8]
    assert [t["decided"] for t in trace[1:4]] == [[[4, chain[2]], [6, chain[4]], [8, chain[6]]],
                                                  [[5, chain[3]]], [[7, chain[5]]]]
    # EOS inside an accepted run: the positions after it are masks, the loop stops
    gen, trace = rn.generate_spec(m, [1, 2, 3], 20, 8, 0.0, eos=chain[5])
    assert gen == chain[1:6] + [49] * 15 and len(trace) == 3
    # diffusion on the chain model, threshold 0.5, B 4: blocks [3, 7), [7, 11), [11, 13)
    gen, trace = rn.generate_diffusion(m, [1, 2, 3], 10, 4, 0.5)
    assert gen == ar[:10]
    assert [(t["kind"], t["rows"], [p for p, _ in t["decided"]]) for t in trace] == [
        ("causal", [0, 3], [3]), ("draft", [3, 7], [4, 6]), ("draft", [3, 7], [5]), ("causal", [3, 7], [7]),
        ("draft", [7, 11], [8, 10]), ("draft", [7, 11], [9]), ("causal", [7, 11], [11]), ("draft", [11, 13], [12])]


def nemotron_diffusion_end_to_end():
    m = small()
    prompt, n = [5, 17, 230, 8], 13
    ar, _ = rn.generate_ar(m, prompt, 1)
    for block, thr in ((4, 0.9), (8, 0.0), (32, 1.0)):
        gen, trace = rn.generate_diffusion(m, prompt, n, block, thr)
        assert len(gen) == n and gen[0] == ar[0]
        assert trace[0] == {"kind": "causal", "rows": [0, 4], "decided": [[4, ar[0]]]}
        starts = list(range(4, 17, block))
        commits = [t for t in trace[1:] if t["kind"] == "causal"]
        assert [t["rows"] for t in commits] == [[c, min(c + block, 17)] for c in starts[:-1]], "no commit after the last"
        assert all(t["decided"] == [[t["rows"][1], gen[t["rows"][1] - 4]]] for t in commits)
        drafts = [t for t in trace if t["kind"] == "draft"]
        decided = sorted(p for t in drafts for p, _ in t["decided"])
        assert decided == [p for p in range(4, 17) if p not in starts], "every non-seed position once"
        assert all(t["rows"][0] <= p < t["rows"][1] and gen[p - 4] == tok for t in drafts for p, tok in t["decided"])
        if thr == 0.0:
            assert len(drafts) == len(starts), "threshold 0: one draft per block"
        if thr == 1.0:
            assert all(len(t["decided"]) == 1 for t in drafts) and len(drafts) == n - len(starts)
    # EOS: decisions never change, so the stop truncates the run without EOS after its first EOS
    full, trace = rn.generate_diffusion(m, prompt, n, 4, 0.0)
    k = full.index(full[7])
    gen, trace2 = rn.generate_diffusion(m, prompt, n, 4, 0.0, eos=full[7])
    assert gen == full[:k + 1] + [m.mask_id] * (n - k - 1) and len(trace2) <= len(trace)


def nemotron_cli():
    d = made("small")
    out = os.path.join(TMP, "nemotron_l.bin")
    run_main(rn.main, ["logits", "--model", d, "--tokens", "5,9,3,269,7", "--rows", "4,0", "--bidir-from", "2",
                       "--out", out])
    m = rn.NemotronModel(d)
    close(np.fromfile(out, dtype="<f4").reshape(2, 270), m.logits([5, 9, 3, 269, 7], 2)[[4, 0]], 0, "cli logits")
    js = os.path.join(TMP, "nemotron_g.json")
    rc, _ = run_main(rn.main, ["generate", "--model", d, "--prompt", "5,17,230", "--gen-length", "9", "--mode", "spec",
                               "--block-length", "4", "--check-ar", "--out", js])
    gen, trace = rn.generate_spec(m, [5, 17, 230], 9, 4)
    assert rc == 0 and read_json(TMP, "nemotron_g.json") == {"tokens": gen, "trace": trace, "forwards": len(trace)}
    rc, text = run_main(rn.main, ["generate", "--model", d, "--prompt", "5,17,230", "--gen-length", "6", "--mode",
                                  "diffusion", "--block-length", "4", "--eos", "3"])
    gen, trace = rn.generate_diffusion(m, [5, 17, 230], 6, 4, 0.9, 3)
    assert json.loads(text) == {"tokens": gen, "trace": trace, "forwards": len(trace)}


def nemotron_lora_files():
    d, base = made("lora", "--nemotron-lora", "4"), made("default")
    ld = os.path.join(d, "linear_spec_lora")
    assert sorted(os.listdir(ld)) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not os.path.exists(os.path.join(base, "linear_spec_lora"))
    assert read_json(ld, "adapter_config.json") == {
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["o_proj"], "lora_dropout": 0.0,
        "bias": "none", "use_rslora": False, "fan_in_fan_out": False, "task_type": None,
        "base_model_name_or_path": "tiny-nemotron"}
    hdr = safetensors_np.read_header(os.path.join(ld, "adapter_model.safetensors"))
    want = {}
    for i in range(2):
        b = f"base_model.model.encoder.layers.{i}.self_attn.o_proj."
        want.update({b + "lora_A.weight": [4, 96], b + "lora_B.weight": [64, 4]})
    assert list(hdr) == ["__metadata__"] + list(want), list(hdr)
    assert all(hdr[n]["dtype"] == "BF16" and hdr[n]["shape"] == shp for n, shp in want.items()), hdr
    w = safetensors_np.read_file(os.path.join(ld, "adapter_model.safetensors"))
    for n, t in w.items():  # A ~ N(0, 1 / 96), B ~ N(0, 1 / 4): non-zero
        close(t.std(), 1 / math.sqrt(96 if "lora_A" in n else 4), 0.25 / math.sqrt(96 if "lora_A" in n else 4), n)
    # drawn after every base weight: the base files of the seed are unchanged, byte for byte
    for fn in sorted(p for p in os.listdir(base) if p != "linear_spec_lora"):
        with open(os.path.join(base, fn), "rb") as f0, open(os.path.join(d, fn), "rb") as f1:
            assert f0.read() == f1.read(), fn
    # the checkpoint's dtype; nemotron only, R > 0
    hdr = safetensors_np.read_header(os.path.join(made("small_lora", *SMALL, "--nemotron-lora", "3"),
                                                  "linear_spec_lora", "adapter_model.safetensors"))
    assert hdr["base_model.model.encoder.layers.1.self_attn.o_proj.lora_A.weight"] == {
        "dtype": "F32", "shape": [3, 40], "data_offsets": hdr["base_model.model.encoder.layers.1.self_attn.o_proj."
                                                                "lora_A.weight"]["data_offsets"]}
    out = os.path.join(TMP, "nemotron_bad")
    assert "nemotron options" in exits(mtc.main, ["--family", "dream", "--out", out, "--nemotron-lora", "2"])
    assert "R > 0" in exits(mtc.main, ["--family", "nemotron", "--out", out, "--nemotron-lora", "-1"])


def nemotron_lora_forward():
    m, base = small_lora(), small()
    assert base.lora is None and m.lora[0] == np.float32(2.0) and len(m.lora[1]) == 2
    toks = [5, 17, 230, 8, 9, 100, 101, 102, 40, 41]
    causal = base.logits(toks)
    close(m.logits(toks), causal, 0, "the same base weights")
    close(m.logits(toks, lora=True), causal, 0, "a causal pass has no draft rows: the adapter changes nothing")
    plain, draft = m.logits(toks, bidir_from=6), m.logits(toks, bidir_from=6, lora=True)
    close(draft[:6], plain[:6], 0, "the rows before the block are the causal cache, written without the adapter")
    assert np.abs(draft[6:] - plain[6:]).max(axis=1).min() > 1e-3, "every draft row changes"
    # + scale (att A^T) B^T on o_proj == o_proj merged with scale B A (scale = alpha / r = 2)
    full = m.logits(toks, bidir_from=0, lora=True)
    for L, (A, B) in zip(m.layers, m.lora[1]):
        L["o"] = L["o"] + np.float32(2.0) * (B @ A)
    close(full, m.logits(toks, bidir_from=0), 2e-5, "merged o_proj")
    # the folder's config: use_rslora scales by alpha / sqrt(r); other target modules are refused
    src = os.path.join(made("small_lora", *SMALL, "--nemotron-lora", "3"), "linear_spec_lora")
    ld = os.path.join(TMP, "nemotron_lora_cfg")
    os.makedirs(ld, exist_ok=True)
    shutil.copy(os.path.join(src, "adapter_model.safetensors"), ld)
    cfg = read_json(src, "adapter_config.json")
    for extra, want in (({}, 2.0), ({"use_rslora": True}, 6 / math.sqrt(3)), ({"lora_alpha": 3}, 1.0)):
        with open(os.path.join(ld, "adapter_config.json"), "w") as f:
            json.dump({**cfg, **extra}, f)
        scale, ab = rn.load_lora(ld, 2)
        assert abs(scale - want) < 1e-12 and all(a.shape == (3, 40) and b.shape == (32, 3) for a, b in ab), extra
    for mods in (["q_proj", "o_proj"], ["v_proj"], "down_proj"):
        with open(os.path.join(ld, "adapter_config.json"), "w") as f:
            json.dump({**cfg, "target_modules": mods}, f)
        try:
            rn.load_lora(ld, 2)
            raise AssertionError(f"target_modules {mods} accepted")
        except SystemExit as e:
            assert "o_proj only" in str(e.code), e.code


class Recording:
    """Wraps a model; records (bidir_from < n, lora) of every forward."""

    def __init__(self, m):
        self.m, self.calls, self.mask_id, self.lora = m, [], m.mask_id, m.lora

    def logits(self, tokens, bidir_from=None, rows=None, lora=False):
        self.calls.append((bidir_from is not None and bidir_from < len(tokens), lora))
        return self.m.logits(tokens, bidir_from, rows, lora)


def nemotron_lora_loops():
    m, base = Recording(small_lora()), small()
    changed = 0
    for prompt in ([5, 17, 230], [40, 41, 42, 43, 44, 45, 46], [261]):
        ar, _ = rn.generate_ar(m, prompt, 12)
        assert ar == rn.generate_ar(base, prompt, 12)[0] and not any(lo for _, lo in m.calls), "ar: never"
        for block, thr in ((4, 0.0), (8, 0.0), (8, 0.5)):
            m.calls = []
            gen, trace = rn.generate_spec(m, prompt, 12, block, thr)
            assert gen == ar, (prompt, block, thr, gen, ar)
            assert m.calls and all(d == lo for d, lo in m.calls), "spec: the drafts only, every draft"
            off, trace_off = rn.generate_spec(base, prompt, 12, block, thr)
            assert (off, trace_off) == rn.generate_spec(m, prompt, 12, block, thr, lora=False), "lora=False: no adapter"
            changed += trace != trace_off
        m.calls = []
        assert rn.generate_diffusion(m, prompt, 12, 4, 0.5) == rn.generate_diffusion(base, prompt, 12, 4, 0.5)
        assert any(d for d, _ in m.calls) and not any(lo for _, lo in m.calls), "diffusion: never"
    assert changed >= 6, f"the adapter changed the drafts of only {changed} of 9 runs"
    try:
        rn.generate_spec(base, [5, 17, 230], 4, 4, lora=True)
        raise AssertionError("lora=True without an adapter")
    except SystemExit as e:
        assert "linear_spec_lora" in str(e.code)


def nemotron_lora_cli():
    d, plain = made("small_lora", *SMALL, "--nemotron-lora", "3"), made("small", *SMALL)
    out = os.path.join(TMP, "nemotron_lora.bin")
    msg = exits(rn.main, ["logits", "--model", plain, "--tokens", "5,9,3", "--bidir-from", "1", "--lora", "--out", out])
    assert "--lora" in msg and "linear_spec_lora" in msg and plain in msg, msg
    run_main(rn.main, ["logits", "--model", d, "--tokens", "5,9,3,269,7", "--bidir-from", "2", "--lora", "--out", out])
    m = rn.NemotronModel(d)
    close(np.fromfile(out, dtype="<f4").reshape(5, 270), m.logits([5, 9, 3, 269, 7], 2, lora=True), 0, "cli --lora")
    got = {}
    for flag in ([], ["--no-lora"]):
        rc, text = run_main(rn.main, ["generate", "--model", d, "--prompt", "5,17,230", "--gen-length", "9", "--mode",
                                      "spec", "--block-length", "4", "--check-ar", *flag])
        got[bool(flag)] = json.loads(text)
        assert rc == 0
    for off in (False, True):
        gen, trace = rn.generate_spec(m, [5, 17, 230], 9, 4, lora=False if off else None)
        assert got[off] == {"tokens": gen, "trace": trace, "forwards": len(trace)}
    assert got[False]["trace"] != got[True]["trace"] and got[False]["tokens"] == got[True]["tokens"]
