"""Checks of the DiffusionGemma reference (ref_diffusion_gemma.py) and of make_tiny_checkpoint.py --family
diffusion_gemma. Run by selftest.py, which registers them (register) in its own order. Checkpoints are written
in-process (make_tiny_checkpoint.main) to keep the run short."""
import json
import math
import os
import sys

import numpy as np

import make_tiny_checkpoint as mtc
from selftest_nemotron import run_main  # one in-process runner for the selftests' CLIs
import ref_diffusion_gemma as rd
import safetensors_np

close = TMP = None  # selftest.py's helper and temporary folder (register)
_MADE, _MODELS = {}, {}
PROMPT = [293, 294, 10, 72, 101, 108, 108, 111, 10, 295, 296]  # 11 > sliding_window 8


def register(check, close_fn, tmp):
    """Registers this file's checks with selftest.py's `check`; close / tmp are selftest.py's."""
    global close, TMP
    close, TMP = close_fn, tmp
    for fn in (dg_checkpoint_layout, dg_checkpoint_values, dg_rms_norm_plain_w, dg_rope_hand_values, dg_masks,
               dg_k_equals_v, dg_scalars_per_mode, dg_decoder_equals_single_pass, dg_self_conditioning,
               dg_rng_hand_values, dg_acceptance_rule, dg_sampling_law_and_entropy, dg_temperature_schedule,
               dg_loop_trace_replay, dg_loop_stop_conditions, dg_loop_eos, dg_cli):
        check(fn)


def made(name, *extra):
    """A diffusion_gemma checkpoint under TMP (written once per name)."""
    if name not in _MADE:
        out = os.path.join(TMP, "dg_" + name)
        run_main(mtc.main, ["--family", "diffusion_gemma", "--out", out, *extra])
        _MADE[name] = out
    return _MADE[name]


F32 = ("--dtype", "f32", "--shards", "1")


def model(name="f32", *extra):
    """A fresh DiffusionGemma of a checkpoint (f32: the default geometry in F32, one file)."""
    if name == "f32":
        extra = F32
    return rd.DiffusionGemma(made(name, *extra))


def read_json(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


def expected_tensors(vision=True):
    """name -> shape of the default geometry, spelled out from the spec's section 2."""
    H, V, I, E, Ie = 64, 300, 48, 8, 24
    want = {"model.decoder.embed_tokens.weight": [V, H], "model.decoder.norm.weight": [H],
            "model.decoder.self_conditioning.pre_norm.weight": [H],
            "model.decoder.self_conditioning.gate_proj.weight": [I, H],
            "model.decoder.self_conditioning.up_proj.weight": [I, H],
            "model.decoder.self_conditioning.down_proj.weight": [H, I]}
    for i in range(6):
        full = i in (2, 5)
        d, kv = (32, 1) if full else (16, 2)
        b = f"model.decoder.layers.{i}."
        want.update({b + "self_attn.q_proj.weight": [4 * d, H], b + "self_attn.k_proj.weight": [kv * d, H],
                     b + "self_attn.o_proj.weight": [H, 4 * d], b + "self_attn.q_norm.weight": [d],
                     b + "self_attn.k_norm.weight": [d], b + "mlp.gate_proj.weight": [I, H],
                     b + "mlp.up_proj.weight": [I, H], b + "mlp.down_proj.weight": [H, I],
                     b + "router.proj.weight": [E, H], b + "router.scale": [H], b + "router.per_expert_scale": [E],
                     b + "experts.gate_up_proj": [E, 2 * Ie, H], b + "experts.down_proj": [E, H, Ie],
                     b + "layer_scalar": [1], f"model.encoder.language_model.layers.{i}.layer_scalar": [1]})
        if not full:
            want[b + "self_attn.v_proj.weight"] = [kv * d, H]
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                  "post_feedforward_layernorm_2"):
            want[b + n + ".weight"] = [H]
    if vision:
        for p in ("q", "k", "v", "o"):
            want[f"model.encoder.vision_tower.encoder.layers.0.self_attn.{p}_proj.weight"] = [16, 16]
        want["model.encoder.embed_vision.embedding_projection.weight"] = [H, 16]
    return want


def headers(d):
    out = {}
    for fn in safetensors_np.shard_files(d):
        for name, t in safetensors_np.read_header(os.path.join(d, fn)).items():
            if name != "__metadata__":
                out[name] = (t["dtype"], t["shape"])
    return out


def dg_checkpoint_layout():
    d = made("default")
    files = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], files
    idx = read_json(d, "model.safetensors.index.json")
    want = expected_tensors()
    assert set(idx["weight_map"]) == set(want) and set(idx["weight_map"].values()) == set(files)
    got = headers(d)
    assert {n: s for n, (_, s) in got.items()} == want and {t for t, _ in got.values()} == {"BF16"}
    f32 = made("f32", *F32)
    assert not os.path.exists(os.path.join(f32, "model.safetensors.index.json"))
    got = headers(f32)
    assert {n: s for n, (_, s) in got.items()} == want and {t for t, _ in got.values()} == {"F32"}
    novis = made("novis", "--no-vision", *F32)
    assert {n: s for n, (_, s) in headers(novis).items()} == expected_tensors(vision=False)
    c = read_json(d, "config.json")
    assert c["architectures"] == ["DiffusionGemmaForBlockDiffusion"] and c["model_type"] == "diffusion_gemma"
    assert c["canvas_length"] == 8 and c["tie_word_embeddings"] is True and c["eos_token_id"] == [292, 295, 299]
    assert (c["pad_token_id"], c["bos_token_id"]) == (291, 293) and c["vision_config"]["model_type"] == "gemma4_vision"
    t = c["text_config"]
    assert t["model_type"] == "diffusion_gemma_text"
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"], t["num_key_value_heads"],
            t["num_global_key_value_heads"], t["head_dim"], t["global_head_dim"], t["intermediate_size"],
            t["num_experts"], t["top_k_experts"], t["moe_intermediate_size"], t["vocab_size"], t["sliding_window"],
            t["max_position_embeddings"]) == (64, 6, 4, 2, 1, 16, 32, 48, 8, 2, 24, 300, 8, 512), t
    assert t["layer_types"] == (["sliding_attention"] * 2 + ["full_attention"]) * 2
    assert t["rope_parameters"] == {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    assert (t["rms_norm_eps"], t["final_logit_softcapping"], t["hidden_activation"]) == (1e-6, 30.0,
                                                                                          "gelu_pytorch_tanh")
    assert t["attention_k_eq_v"] is True and t["enable_moe_block"] is True and t["tie_word_embeddings"] is True
    assert t["attention_bias"] is False and t["eos_token_id"] == [292, 295, 299] and t["pad_token_id"] == 291
    assert read_json(d, "generation_config.json") == {
        "max_new_tokens": 16, "max_denoising_steps": 12,
        "sampler_config": {"type": "EntropyBoundSamplerConfig", "entropy_bound": 0.1}, "t_min": 0.4, "t_max": 0.8,
        "stability_threshold": 1, "confidence_threshold": 0.005, "eos_token_id": [292, 295, 299],
        "pad_token_id": 291, "bos_token_id": 293}
    tok = read_json(d, "tokenizer.json")
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    specials = {"<pad>": 291, "<eos>": 292, "<bos>": 293, "<|turn>": 294, "<turn|>": 295, "<|channel>": 296,
                "<channel|>": 297, "<|think|>": 298, "<|tool_response>": 299}
    assert all(added[s] == i for s, i in specials.items()), added
    assert tok["model"]["vocab"]["\u010a"] == 10, "newline is the byte token 10"
    assert sorted(list(tok["model"]["vocab"].values()) + list(added.values())) == list(range(300))
    tc = read_json(d, "tokenizer_config.json")
    assert (tc["bos_token"], tc["eos_token"], tc["pad_token"]) == ("<bos>", "<eos>", "<pad>")
    assert "chat_template" not in tc, "the Gemma 4 template was not read: none is written"
    m = rd.DiffusionGemma(d)  # loads (vision tensors skipped), bf16 values = the f32 checkpoint's rounded
    w32 = safetensors_np.read_dir(f32)
    bits = mtc.f32_to_bf16_bits(w32["model.decoder.embed_tokens.weight"])
    close(m.emb, safetensors_np.bf16_bits_to_f32(bits), 0, "bf16 = rounded f32")
    # options: a wider model with 3 sliding per full
    w = headers(made("opts", "--layers", "4", "--sliding-per-full", "3", "--global-head-dim", "24",
                     "--global-kv-heads", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", *F32))
    assert w["model.decoder.layers.3.self_attn.k_proj.weight"][1] == [48, 64], "layer 3 full: 2 kv of 24"
    assert w["model.decoder.layers.0.self_attn.k_proj.weight"][1] == [8, 64]
    assert "model.decoder.layers.3.self_attn.v_proj.weight" not in w
    assert "model.decoder.layers.2.self_attn.v_proj.weight" in w


def dg_checkpoint_values():
    w = safetensors_np.read_dir(made("f32", *F32))
    same = safetensors_np.read_dir(made("same", "--encoder-scalars", "same", *F32))
    for i in range(6):
        dec = float(w[f"model.decoder.layers.{i}.layer_scalar"][0])
        enc = float(w[f"model.encoder.language_model.layers.{i}.layer_scalar"][0])
        assert 0.6 <= dec <= 1.0 and 1.0 <= enc <= 1.4, (i, dec, enc)
        assert same[f"model.encoder.language_model.layers.{i}.layer_scalar"][0] == same[
            f"model.decoder.layers.{i}.layer_scalar"][0] == dec
    for n, v in w.items():
        if "language_model" not in n:
            assert np.array_equal(v, same[n]), f"--encoder-scalars same moved {n}"
    norms = np.concatenate([v for n, v in w.items() if n.endswith("layernorm.weight") or "layernorm_" in n])
    assert abs(norms.mean() - 1.0) < 0.03 and 0.05 < norms.std() < 0.15, "norm weights around 1"
    assert all(w[f"model.decoder.layers.{i}.router.scale"].min() > 0 for i in range(6)), "router.scale > 0"
    pes = w["model.decoder.layers.0.router.per_expert_scale"]
    assert abs(pes.mean() - 1.0) < 0.3 and pes.std() > 0.05
    novis = safetensors_np.read_dir(made("novis", "--no-vision", *F32))
    assert all(np.array_equal(v, w[n]) for n, v in novis.items()), "--no-vision changes no text weight"


def dg_rms_norm_plain_w():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    w = np.array([1.0, 1.0, 2.0, 0.5], dtype=np.float32)
    r = math.sqrt(7.5 + 1e-6)
    close(rd.rms(x, w), [[1 / r, 2 / r, 6 / r, 2 / r]], 1e-6, "plain w")
    close(rd.rms(x, np.zeros(4)), np.zeros((1, 4)), 0, "w = 0 gives 0 (not (1 + w))")
    close(rd.rms(x), [[1 / r, 2 / r, 3 / r, 4 / r]], 1e-6, "NoScale")
    # the model's head: 30 tanh((rms(h) * w) E^T / 30) by hand in float64
    m = model()
    h = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32) * 3
    h64 = h.astype(np.float64)
    y = h64 / np.sqrt((h64 ** 2).mean(-1, keepdims=True) + 1e-6) * m.norm_f
    close(m.head(h), 30 * np.tanh((y @ m.emb.T.astype(np.float64)) / 30), 2e-5, "softcapped tied head")
    assert np.abs(m.head(h)).max() < 30 and np.abs(h @ m.emb.T).max() > 30, "the cap bites"


def dg_rope_hand_values():
    # proportional, d = 8, factor 0.25: int(0.25 * 8 / 2) = 1 pair rotates, (0, 4), inv 1
    inv = rd.rope_inv_freq(8, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 100.0})
    close(inv, [1, 0, 0, 0], 0, "inv_freq")
    x = np.arange(1, 9, dtype=np.float32).reshape(1, 1, 8)
    c, s = math.cos(2), math.sin(2)
    close(rd.apply_rope(x, [2], inv)[0, 0], [1 * c - 5 * s, 2, 3, 4, 5 * c + 1 * s, 6, 7, 8], 1e-6, "d 8")
    # d = 32, theta 1e6: pairs (i, i + 16); the first int(0.25 * 32 / 2) = 4 rotate with 1e6^(-2i/32)
    inv = rd.rope_inv_freq(32, {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6})
    close(inv, [1e6 ** (-i / 16) for i in range(4)] + [0] * 12, 1e-12, "inv_freq d 32")
    for dim in (1, 3, 4, 15):
        e = np.zeros((1, 1, 32), dtype=np.float32)
        e[0, 0, dim] = 1
        out = rd.apply_rope(e, [3], inv)[0, 0]
        want = np.zeros(32)
        ang = 3 * 1e6 ** (-dim / 16) if dim < 4 else 0.0
        want[dim], want[dim + 16] = math.cos(ang), math.sin(ang)
        close(out, want, 1e-6, f"dim {dim}")
    # default: theta^(-2i/d) over every pair
    inv = rd.rope_inv_freq(4, {"rope_type": "default", "rope_theta": 100.0})
    close(inv, [1, 0.1], 1e-12, "default")
    m = model()
    for i, ly in enumerate(m.layers):
        if ly["full"]:
            close(ly["inv"], [1e6 ** (-j / 16) for j in range(4)] + [0] * 12, 1e-12, f"layer {i}")
        else:
            close(ly["inv"], [1e4 ** (-j / 8) for j in range(8)], 1e-12, f"layer {i}")
    assert [ly["full"] for ly in m.layers] == [False, False, True, False, False, True]


def dg_masks():
    T, F = True, False
    want = [[T, T, T, F, F, F], [F, T, T, T, F, F], [F, F, T, T, T, F], [F, F, F, T, T, T]]
    assert rd.encoder_mask(2, 4, 3).tolist() == want, "sliding: k <= q, q - k < 3"
    assert rd.encoder_mask(2, 4).tolist() == [[T] * 3 + [F] * 3, [T] * 4 + [F] * 2, [T] * 5 + [F], [T] * 6]
    assert rd.decoder_mask(5, 3, 3).tolist() == [[F, F, F, T, T, T, T, T]] * 3, "last W - 1 = 2 cached keys"
    assert rd.decoder_mask(5, 3).tolist() == [[T] * 8] * 3 and rd.decoder_mask(1, 2, 8).tolist() == [[T] * 3] * 2
    assert rd.decoder_mask(4, 2, 1).tolist() == [[F] * 4 + [T] * 2] * 2, "W = 1: no cached key"


def dg_k_equals_v():
    m = model()
    h = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    pos = np.arange(3, 8)
    for i in (2, 0):
        L = m.layers[i]
        q, k, v = m.qkv(i, h, pos)
        kraw = (rd.rms(h, L["in_ln"]) @ L["k"].T).reshape(5, L["kv"], L["d"])
        if L["full"]:
            assert L["v"] is None and v.shape == (5, 1, 32) and q.shape == (5, 4, 32)
            close(v, rd.rms(kraw), 0, "full: v = RMSNormNoScale(k_raw)")
            close(k, rd.apply_rope(rd.rms(kraw, L["kn"]), pos, L["inv"]), 0, "k = RoPE(rms(k_raw; k_norm))")
        else:
            vraw = (rd.rms(h, L["in_ln"]) @ L["v"].T).reshape(5, 2, 16)
            close(v, rd.rms(vraw), 0, "sliding: v from v_proj")
            assert np.abs(v - rd.rms(kraw)).max() > 0.1
        close(np.sqrt((v.astype(np.float64) ** 2).mean(-1)), np.ones(v.shape[:2]), 1e-5, "v rows have unit rms")


def dg_scalars_per_mode():
    m = model()
    assert all(e != d for e, d in zip(m.enc_scalar, m.dec_scalar)), "differ: other encoder scalars"
    canvas = [5, 77, 140, 9, 9, 260, 31, 2]
    enc, dec0 = m.encode(PROMPT, m.new_cache()), m.decode(canvas, m.new_cache())
    cache = m.new_cache()
    m.encode(PROMPT, cache)
    dec = m.decode(canvas, cache)
    saved = list(m.dec_scalar)
    m.dec_scalar = [np.float32(1)] * 6
    close(m.encode(PROMPT, m.new_cache()), enc, 0, "encoder mode ignores the decoder scalars")
    assert np.abs(m.decode(canvas, m.new_cache()) - dec0).max() > 1e-2, "decoder mode uses them"
    m.dec_scalar, m.enc_scalar = saved, [np.float32(1)] * 6
    assert np.abs(m.encode(PROMPT, m.new_cache()) - enc).max() > 1e-2, "encoder mode uses its scalars"
    close(m.decode(canvas, m.new_cache()), dec0, 0, "decoder mode ignores the encoder scalars")
    c2 = m.new_cache()
    m.encode(PROMPT, c2)
    assert np.abs(m.decode(canvas, c2) - dec).max() > 1e-3, "the cache was written with the encoder scalars"
    # the scalar multiplies the layer's output
    h = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    mask = rd.encoder_mask(0, 3, 8)
    one, _, _ = m.layer(0, h, np.arange(3), None, None, mask, np.float32(1))
    two, _, _ = m.layer(0, h, np.arange(3), None, None, mask, np.float32(1.25))
    close(two, one * 1.25, 1e-6, "h * layer_scalar")
    s = model("same", "--encoder-scalars", "same", *F32)
    assert s.enc_scalar == s.dec_scalar
    close(s.decode(canvas, s.new_cache()), dec0, 0, "same: only the encoder scalars differ")


def brute_force(m, segments, canvas, z_prev, sliding_all=False):
    """One pass over [segments... | canvas] with the region-aware mask (causal rows for the encoded segments,
    bidirectional canvas rows whose sliding reach into the prefix is the last W - 1), per-row inputs and scalars;
    the mask is built here key by key. Returns logits of every row."""
    prefix = [t for s in segments for t in s]
    P, C, W = len(prefix), len(canvas), m.window
    n = P + C
    h = np.concatenate([m.embed(prefix), m.decoder_input(canvas, z_prev)])
    pos = np.arange(n)
    for i, ly in enumerate(m.layers):
        mask = np.zeros((n, n), dtype=bool)
        for q in range(n):
            for k in range(n):
                if q < P:
                    mask[q, k] = k <= q and (ly["full"] or q - k < W)
                else:
                    mask[q, k] = k >= P or ly["full"] or sliding_all or k >= P - (W - 1)
        scal = np.array([m.enc_scalar[i]] * P + [m.dec_scalar[i]] * C, dtype=np.float32)[:, None]
        h, _, _ = m.layer(i, h, pos, None, None, mask, scal)
    return m.head(h)


def dg_decoder_equals_single_pass():
    m = model()
    c1 = [12, 250, 7, 7, 99, 180, 31, 64]
    c2 = [3, 141, 59, 26, 53, 58, 97, 93]
    z = (m.decode(c1, m.new_cache()) / np.float32(0.8)).astype(np.float32)
    cache = m.new_cache()
    enc = np.concatenate([m.encode(PROMPT[:6], cache), m.encode(PROMPT[6:], cache), m.encode(c1, cache)])
    K0 = [k.copy() for k in cache.K]
    dec = m.decode(c2, cache, z)
    assert cache.length == 19 and all(np.array_equal(a, b) for a, b in zip(K0, cache.K)), "decode is read-only"
    full = brute_force(m, [PROMPT, c1], c2, z)
    close(enc, full[:19], 2e-5, "encoder rows (chunked cache) = causal rows of one pass")
    close(dec, full[19:], 2e-5, "decoder over the cache = canvas rows of one pass")
    wide = brute_force(m, [PROMPT, c1], c2, z, sliding_all=True)
    assert np.abs(wide[19:] - full[19:]).max() > 1e-3, "the sliding reach (last W - 1 cached keys) matters"
    assert np.abs(m.decode(c2, cache) - dec).max() > 1e-2, "self-conditioning changes the canvas logits"


def dg_self_conditioning():
    m = model()
    assert np.all(m.self_cond(np.zeros((4, 64), dtype=np.float32)) == 0), "SC(0) == 0 exactly"
    canvas = [5, 6, 7, 8]
    close(m.decoder_input(canvas), rd.rms(m.emb[canvas] * np.float32(8.0)), 0, "first step: rms(E[x] sqrt(H))")
    z = np.full((1, 300), -50.0, dtype=np.float32)
    z[0, 17] = 50.0
    close(m.soft_embedding(z), m.emb[[17]] * 8.0, 1e-5, "a one-hot softmax gives E[v] sqrt(H)")
    zr = np.random.default_rng(3).standard_normal((4, 300)).astype(np.float32)
    p = np.exp(zr.astype(np.float64) - zr.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    close(m.soft_embedding(zr), (p @ m.emb) * 8.0, 1e-5, "softmax(z) E sqrt(H)")
    sc = m.self_cond(m.soft_embedding(zr))
    e = m.emb[canvas] * np.float32(8.0)
    close(m.decoder_input(canvas, zr), rd.rms(e + sc), 0, "rms(E[x] sqrt(H) + SC)")
    assert np.sqrt((sc ** 2).mean()) > 0.2 * np.sqrt((e ** 2).mean()), "SC is not negligible"


def splitmix_reference(x):
    """splitmix64's output function, written out with % 2**64 (independent of rd.rng_mix)."""
    z = (x + 0x9E3779B97F4A7C15) % 2 ** 64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2 ** 64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2 ** 64
    return z ^ (z >> 31)


def dg_rng_hand_values():
    assert rd.rng_mix(0) == 0xE220A8397B1DCDAF, "splitmix64's first output from state 0"
    assert rd.rng_mix(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4, "its second output"
    h = splitmix_reference(0 ^ splitmix_reference(0 ^ splitmix_reference(0x632BE59BD9B4E019)))
    want = ((h >> 11) + 0.5) / 2 ** 53
    assert rd.rng_uniform(0, 0, 0) == want and 0 < want < 1, (rd.rng_uniform(0, 0, 0), want)
    seed = 2 ** 64 - 5
    a, b = np.array([0, 1, 11, 511])[:, None], np.array([0, 1, 2, 299, 302])[None, :]
    grid = rd.rng_uniform_np(seed, a, b)
    for i in range(4):
        for j in range(5):
            assert grid[i, j] == rd.rng_uniform(seed, int(a[i, 0]), int(b[0, j])), (i, j)
    assert rd.forward_seed(2 ** 64 - 1, 3) == rd.rng_mix(2), "seed + t wraps mod 2^64"
    u = rd.rng_uniform_np(7, np.arange(8)[:, None], np.arange(300)[None, :])
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    noise = rd.noise_tokens(7, 3, np.arange(100, 4100), 300)
    want = [min(299, math.floor(rd.rng_uniform(rd.forward_seed(7, 3), p, 302) * 300)) for p in (100, 101, 4099)]
    assert [noise[0], noise[1], noise[-1]] == want and noise.min() == 0 and noise.max() == 299


def dg_acceptance_rule():
    # ranks: 0.01 (1), 0.03 (3), 0.04 (4), 0.05 (0), 0.2 (2); sums before: 0, .01, .04, .08, .13
    assert rd.accept([0.05, 0.01, 0.2, 0.03, 0.04], 0.1) == [0, 1, 3, 4]
    assert rd.accept([5.0, 6.0, 7.0], 0.1) == [0], "rank 0 always"
    assert rd.accept([0.25, 0.25, 0.5, 0.0], 0.5) == [0, 1, 2, 3], "sum == bound is accepted"
    assert rd.accept([0.2, 0.2], 0.1) == [0], "ties: the lower position ranks first"
    assert rd.accept([0.3, 0.2, 0.2], 0.1) == [1], "ties: lower position first"


def dg_sampling_law_and_entropy():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]], dtype=np.float32)
    T = np.float32(0.5)
    counts = np.zeros(4)
    for seed in range(4000):
        d, a, H = rd.step_stats(logits, T, seed, [0])
        counts[d[0]] += 1
    p = np.exp(logits[0] / 0.5)
    p /= p.sum()
    close(counts / 4000, p, 0.025, "Gumbel-max draws follow softmax(logits / T)")
    assert a[0] == 0
    close(H, [-(p * np.log(p)).sum()], 1e-6, "entropy of the tempered distribution")
    d, a, H = rd.step_stats(np.array([[1.0, 3.0, 3.0, -np.inf]], dtype=np.float32), np.float32(1e-6), 5, [2])
    assert a[0] == 1 and d[0] in (1, 2), "argmax ties: the lowest id"
    close(H, [math.log(2)], 1e-6, "two equal maxima: ln 2 (0 log 0 = 0)")
    _, _, H = rd.step_stats(np.array([[0.0, 0.0]], dtype=np.float32), np.float32(1), 0, [0])
    close(H, [math.log(2)], 1e-12, "uniform over 2")


def dg_temperature_schedule():
    assert rd.temperature(12, 12, 0.4, 0.8) == np.float32(0.8)
    assert rd.temperature(1, 12, 0.4, 0.8) == np.float32(0.4 + 0.4 * 1 / 12)
    close(rd.temperature(1, 48, 0.4, 0.8), 0.408333, 1e-6, "the spec's last step")
    ts = [rd.temperature(s, 12, 0.4, 0.8) for s in range(12, 0, -1)]
    assert all(x > y for x, y in zip(ts, ts[1:])) and all(isinstance(x, np.float32) for x in ts)


def replay(m, prompt, res, seed, N=12, C=8, bound=0.1):
    """Recomputes every traced forward from its canvas_in (decoder over the prompt and the committed canvases,
    SC from the previous forward of the canvas) and checks the trace's fields and the canvas update."""
    tr = res["trace"]
    cache = m.new_cache()
    m.encode(prompt, cache)
    z, s, committed = None, N, []
    for n, e in enumerate(tr):
        assert e["t"] == n and len(e["canvas_in"]) == C
        pos = np.arange(cache.length, cache.length + C)
        if s == N:
            assert e["canvas_in"] == rd.noise_tokens(seed, n, pos, m.V).tolist(), "a canvas starts as noise"
        T = rd.temperature(s, N, 0.4, 0.8)
        assert e["T"] == float(T)
        logits = m.decode(e["canvas_in"], cache, z)
        d, a, H = rd.step_stats(logits, T, rd.forward_seed(seed, n), pos)
        assert e["argmax"] == a.tolist() and e["sampled"] == d.tolist() and e["accepted"] == rd.accept(H, bound)
        close(e["mean_entropy"], H.mean(), 1e-12, "mean entropy")
        z, s = (logits / T).astype(np.float32), s - 1
        last = e["stop"] or s == 0
        if not last:
            nxt = rd.noise_tokens(seed, n + 1, pos, m.V)
            want = [e["sampled"][j] if j in e["accepted"] else int(nxt[j]) for j in range(C)]
            assert tr[n + 1]["canvas_in"] == want, "accepted keep d, the rest re-noised"
        else:
            committed += e["argmax"]
            if n + 1 < len(tr):
                m.encode(e["argmax"], cache)
            z, s = None, N
    assert s == N, "the trace ends with a canvas' last forward"
    return committed


def dg_loop_trace_replay():
    m = model()
    res = rd.generate(m, PROMPT, gen_length=13, seed=11)
    assert res["canvases"] == 2 and res["forwards"] == len(res["trace"]) == 24, "no early stop: N per canvas"
    committed = replay(m, PROMPT, res, 11)
    assert res["tokens"] == committed[:13] and not any(e["stop"] for e in res["trace"])
    assert res["trace"][0]["T"] == res["trace"][12]["T"] == float(np.float32(0.8))
    n_acc = [len(e["accepted"]) for e in res["trace"]]
    assert max(n_acc) > 1 and min(n_acc) < 8, f"the entropy bound accepts several positions in some step: {n_acc}"
    assert sum(n > 1 for n in n_acc) >= 3, n_acc
    other = rd.generate(m, PROMPT, gen_length=13, seed=12)
    assert other["trace"][0]["canvas_in"] != res["trace"][0]["canvas_in"] and other["tokens"] != res["tokens"]
    assert rd.generate(m, PROMPT, gen_length=13, seed=11) == res, "deterministic"
    # the checkpoint's defaults: 16 tokens = 2 canvases of 8, 12 steps
    p = rd.params(m)
    assert (p["gen_length"], p["steps"], p["canvas_length"], p["entropy_bound"], p["stability"], p["confidence"],
            p["eos"]) == (16, 12, 8, 0.1, 1, 0.005, [292, 295, 299]), p


def dg_loop_stop_conditions():
    m = model()
    res = rd.generate(m, PROMPT, gen_length=16, seed=3, stability=0, confidence=100.0)
    assert res["forwards"] == 2 and all(e["stop"] for e in res["trace"]), "stab 0 and confident: one forward"
    assert res["tokens"] == res["trace"][0]["argmax"] + res["trace"][1]["argmax"]
    replay(m, PROMPT, res, 3)
    res = rd.generate(m, PROMPT, gen_length=16, seed=3, stability=0, confidence=0.0)
    assert res["forwards"] == 24 and not any(e["stop"] for e in res["trace"]), "never confident"
    stops = 0
    for seed in range(3):  # stab 1: stop exactly when the argmax canvas repeats (one position per canvas)
        res = rd.generate(m, PROMPT, gen_length=3, seed=seed, canvas_length=1, confidence=100.0)
        prev, s = None, 12
        for e in res["trace"]:
            assert e["stop"] == (prev is not None and e["argmax"] == prev), "stable = the history equals a"
            s -= 1
            prev, s = (None, 12) if e["stop"] or s == 0 else (e["argmax"], s)
            stops += e["stop"]
        assert res["canvases"] == 3 and len(res["tokens"]) == 3
        replay(m, PROMPT, res, seed, C=1)
    assert stops >= 2, "some canvas stopped on stability"


def dg_loop_eos():
    m = model()
    base = rd.generate(m, PROMPT, gen_length=16, seed=11, eos=[])
    first = base["trace"][11]["argmax"]
    tok = first[3]
    cut = first.index(tok)
    res = rd.generate(m, PROMPT, gen_length=16, seed=11, eos=[tok])
    assert res["tokens"] == first[:cut] and res["canvases"] == 1 and res["forwards"] == 12, res["tokens"]
    assert res["trace"] == base["trace"][:12], "the EOS only ends the generation"
    second = base["trace"][-1]["argmax"]
    fresh = [v for v in second if v not in first]
    if fresh:
        res = rd.generate(m, PROMPT, gen_length=16, seed=11, eos=[fresh[0]])
        assert res["tokens"] == first + second[:second.index(fresh[0])] and res["canvases"] == 2
    assert rd.generate(m, PROMPT, gen_length=5, seed=11, eos=[])["tokens"] == first[:5], "cut at gen_length"


def dg_cli():
    d = made("f32", *F32)
    m = model()
    out = os.path.join(TMP, "dg_logits.bin")
    run_main(rd.main, ["logits", "--model", d, "--mode", "enc", "--tokens", "5,9,3,299", "--rows", "3,0", "--out", out])
    close(np.fromfile(out, dtype="<f4").reshape(2, 300), m.encode([5, 9, 3, 299], m.new_cache())[[3, 0]], 0, "enc")
    run_main(rd.main, ["logits", "--model", d, "--mode", "dec", "--prompt", "5,9,3", "--canvas", "1,2,3,4",
                       "--prev-canvas", "7,7,8,8", "--prev-temperature", "0.75", "--out", out])
    cache = m.new_cache()
    m.encode([5, 9, 3], cache)
    z = (m.decode([7, 7, 8, 8], cache) / np.float32(0.75)).astype(np.float32)
    close(np.fromfile(out, dtype="<f4").reshape(4, 300), m.decode([1, 2, 3, 4], cache, z), 0, "dec with SC")
    rc, text = run_main(rd.main, ["generate", "--model", d, "--prompt", "5,9,3", "--gen-length", "10", "--seed", "4",
                                  "--steps", "5", "--entropy-bound", "0.3"])
    assert rc == 0 and json.loads(text) == rd.generate(m, [5, 9, 3], gen_length=10, seed=4, steps=5,
                                                       entropy_bound=0.3)
    for bad in (["--mode", "dec", "--prompt", "5"], ["--mode", "dec", "--canvas", "1,2", "--prev-canvas", "1"],
                ["--mode", "enc", "--tokens", "300"]):
        try:
            run_main(rd.main, ["logits", "--model", d, *bad, "--out", out])
            raise AssertionError(f"{bad} accepted")
        except SystemExit:
            pass
