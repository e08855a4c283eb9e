"""The DiffusionGemma part of make_tiny_checkpoint.py (`--family diffusion_gemma`), written from
shared/specs/diffusion-gemma.md sections 1, 2 and 7 (google/diffusiongemma-26B-A4B-it in small; text model,
plus a few vision tensors a loader must skip).

Geometry (defaults; make_tiny_checkpoint.py options in brackets): hidden 64 [--hidden], 6 layers [--layers]
with layer_types (["sliding_attention"] * 2 + ["full_attention"]) repeated [--sliding-per-full 2] (full at
layers 2 and 5), 4 query heads [--heads], num_key_value_heads 2 (sliding) [--kv-heads], num_global_key_value_heads
1 (full) [--global-kv-heads], head_dim 16 (sliding) [--head-dim], global_head_dim 32 (full) [--global-head-dim],
intermediate_size 48 (the dense MLP of every layer) [--intermediate], num_experts 8 [--experts], top_k_experts 2
[--top-k], moe_intermediate_size 24 [--expert-inter], vocab 300 [--vocab], sliding_window 8 [--sliding-window],
canvas_length 8 [--canvas-length], max_position_embeddings 512 [--max-pos]; rms_norm_eps 1e-6,
final_logit_softcapping 30.0, hidden_activation gelu_pytorch_tanh, rope_parameters full = proportional
(partial_rotary_factor 0.25, theta 1e6), sliding = default (theta 1e4), attention_k_eq_v, enable_moe_block,
tie_word_embeddings, no attention bias.

Tensors, in draw order (shapes [out, in]; d / kv = head_dim / num_key_value_heads on sliding layers,
global_head_dim / num_global_key_value_heads on full layers): model.decoder.embed_tokens.weight [V, H]; per layer
N under model.decoder.layers.N.: input_layernorm.weight [H], self_attn.q_proj.weight [heads * d, H],
self_attn.k_proj.weight [kv * d, H], self_attn.v_proj.weight [kv * d, H] (sliding layers only: K = V on full
layers), self_attn.o_proj.weight [H, heads * d], self_attn.q_norm.weight [d], self_attn.k_norm.weight [d],
post_attention_layernorm.weight, pre_feedforward_layernorm.weight, mlp.gate_proj.weight [I, H], mlp.up_proj.weight
[I, H], mlp.down_proj.weight [H, I], post_feedforward_layernorm_1.weight, router.proj.weight [E, H], router.scale
[H], router.per_expert_scale [E], pre_feedforward_layernorm_2.weight, experts.gate_up_proj [E, 2 Ie, H] (rows
0..Ie-1 gate, Ie..2Ie-1 up), experts.down_proj [E, H, Ie], post_feedforward_layernorm_2.weight,
post_feedforward_layernorm.weight, layer_scalar [1]; model.decoder.norm.weight [H];
model.decoder.self_conditioning.pre_norm.weight [H], .gate_proj.weight [I, H], .up_proj.weight [I, H],
.down_proj.weight [H, I]; model.encoder.language_model.layers.N.layer_scalar [1] (the encoder's own scalar);
then (unless --no-vision) model.encoder.vision_tower.encoder.layers.0.self_attn.{q,k,v,o}_proj.weight [16, 16]
and model.encoder.embed_vision.embedding_projection.weight [H, 16].

Values: embeddings N(0, 1.5^2) (the tied LM head: logits are not flat, so the tempered entropies spread and
the entropy-bound sampler accepts several positions in some steps; checked by selftest_diffusion_gemma.py);
linears N(0, 1 / fan_in); every norm weight 1 + 0.1 N(0, 1) (a (1 + w) mistake shows; q / k norms times QK_NORM = 0.35); router.proj N(0, 1)
(decisive routing); router.scale U(0.5, 1.5); per_expert_scale 1 + 0.2 N(0, 1); the self-conditioning
down_proj N(0, 16 / I) (SC comparable to the embedding it is added to); decoder layer_scalar U(0.6, 1.0),
encoder layer_scalar U(1.0, 1.4) drawn after every other text weight (--encoder-scalars same: the
decoder's values, the other weights unchanged); vision tensors last (--no-vision changes no text weight).

Special tokens take the top ids in Gemma 4's order: <pad> V-9 (pad), <eos> V-8 (eos, bos of nothing), <bos> V-7,
<|turn> V-6, <turn|> V-5, <|channel> V-4, <channel|> V-3, <|think|> V-2, <|tool_response> V-1; with V = 300:
pad 291, eos 292, bos 293, <|turn> 294, <turn|> 295, <|channel> 296, <channel|> 297, <|think|> 298,
<|tool_response> 299. eos_token_id = [<eos>, <turn|>, <|tool_response>] = [292, 295, 299] (the real
[1, 106, 50]). "\n" is the byte token 10. No chat_template is written: the spec (section 7) gives the
no-thinking rendering of one user turn only; the Gemma 4 jinja (system / model / tool turns) was not read.
"""
import numpy as np

SPECIALS = ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>",
            "<|tool_response>"]
EOS_NAMES = ["<eos>", "<turn|>", "<|tool_response>"]  # the real eos_token_id [1, 106, 50]

# Defaults of the geometry options (make_tiny_checkpoint.py applies them when the option is not given).
DEFAULTS = {"layers": 6, "kv_heads": 2, "intermediate": 48, "expert_inter": 24, "experts": 8, "top_k": 2,
            "head_dim": 16, "global_head_dim": 32, "global_kv_heads": 1, "sliding_window": 8, "canvas_length": 8,
            "sliding_per_full": 2}

EMBED_STD = 1.5
SC_GAIN = 4.0  # self-conditioning comparable to the embedding it is added to
# q / k norm weights around this value: attention has scale 1, so norms near 1 give scores up to head_dim
# and a near-one-hot softmax whose float32 rounding shows in the logits (1e-3); at 0.35 f32 stays within
# 1e-4 of f64 and the sampled loop of tessera matches the reference's forward by forward.
QK_NORM = 0.35
VISION_HIDDEN = 16


def layer_types(n_layers, sliding_per_full):
    """(["sliding_attention"] * s + ["full_attention"]) repeated, cut to n_layers."""
    period = sliding_per_full + 1
    return ["full_attention" if i % period == sliding_per_full else "sliding_attention" for i in range(n_layers)]


def check_args(a):
    if a.heads % a.kv_heads or a.heads % a.global_kv_heads:
        raise SystemExit("--heads must be a multiple of --kv-heads and of --global-kv-heads")
    for name in ("head_dim", "global_head_dim"):
        if getattr(a, name) < 2 or getattr(a, name) % 2:
            raise SystemExit(f"--{name.replace('_', '-')} must be even and >= 2")
    if not 1 <= a.top_k <= a.experts:
        raise SystemExit("--top-k must be in [1, --experts]")
    if a.sliding_window < 1 or a.canvas_length < 1 or a.sliding_per_full < 0:
        raise SystemExit("--sliding-window and --canvas-length must be >= 1, --sliding-per-full >= 0")


def build_diffusion_gemma(a, rng, lin, norm, ids, torch_dtype):
    """DiffusionGemma tensors (in draw order), config.json, tokenizer_config.json, generation_config.json."""
    check_args(a)
    H, V, I, E, Ie, nh = a.hidden, a.vocab, a.intermediate, a.experts, a.expert_inter, a.heads
    types = layer_types(a.layers, a.sliding_per_full)
    t = {"model.decoder.embed_tokens.weight": (EMBED_STD * rng.standard_normal((V, H))).astype(np.float32)}
    for i, lt in enumerate(types):
        full = lt == "full_attention"
        d, kv = (a.global_head_dim, a.global_kv_heads) if full else (a.head_dim, a.kv_heads)
        b = f"model.decoder.layers.{i}."
        t[b + "input_layernorm.weight"] = norm(H)
        t[b + "self_attn.q_proj.weight"] = lin(nh * d, H)
        t[b + "self_attn.k_proj.weight"] = lin(kv * d, H)
        if not full:
            t[b + "self_attn.v_proj.weight"] = lin(kv * d, H)
        t[b + "self_attn.o_proj.weight"] = lin(H, nh * d)
        t[b + "self_attn.q_norm.weight"] = norm(d) * np.float32(QK_NORM)
        t[b + "self_attn.k_norm.weight"] = norm(d) * np.float32(QK_NORM)
        t[b + "post_attention_layernorm.weight"] = norm(H)
        t[b + "pre_feedforward_layernorm.weight"] = norm(H)
        t[b + "mlp.gate_proj.weight"] = lin(I, H)
        t[b + "mlp.up_proj.weight"] = lin(I, H)
        t[b + "mlp.down_proj.weight"] = lin(H, I)
        t[b + "post_feedforward_layernorm_1.weight"] = norm(H)
        t[b + "router.proj.weight"] = rng.standard_normal((E, H)).astype(np.float32)
        t[b + "router.scale"] = rng.uniform(0.5, 1.5, H).astype(np.float32)
        t[b + "router.per_expert_scale"] = (1.0 + 0.2 * rng.standard_normal(E)).astype(np.float32)
        t[b + "pre_feedforward_layernorm_2.weight"] = norm(H)
        t[b + "experts.gate_up_proj"] = np.stack([lin(2 * Ie, H) for _ in range(E)])
        t[b + "experts.down_proj"] = np.stack([lin(H, Ie) for _ in range(E)])
        t[b + "post_feedforward_layernorm_2.weight"] = norm(H)
        t[b + "post_feedforward_layernorm.weight"] = norm(H)
        t[b + "layer_scalar"] = rng.uniform(0.6, 1.0, 1).astype(np.float32)
    t["model.decoder.norm.weight"] = norm(H)
    s = "model.decoder.self_conditioning."
    t[s + "pre_norm.weight"] = norm(H)
    t[s + "gate_proj.weight"] = lin(I, H)
    t[s + "up_proj.weight"] = lin(I, H)
    t[s + "down_proj.weight"] = lin(H, I) * np.float32(SC_GAIN)
    for i in range(a.layers):
        enc = rng.uniform(1.0, 1.4, 1).astype(np.float32)  # drawn in both modes: the other weights do not move
        same = t[f"model.decoder.layers.{i}.layer_scalar"].copy()
        t[f"model.encoder.language_model.layers.{i}.layer_scalar"] = same if a.encoder_scalars == "same" else enc
    vis = {"model_type": "gemma4_vision", "hidden_size": VISION_HIDDEN, "intermediate_size": 32,
           "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8, "patch_size": 16,
           "pooling_kernel_size": 3}
    if not a.no_vision:
        vb = "model.encoder.vision_tower.encoder.layers.0.self_attn."
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[vb + p + ".weight"] = lin(VISION_HIDDEN, VISION_HIDDEN)
        t["model.encoder.embed_vision.embedding_projection.weight"] = lin(H, VISION_HIDDEN)
    eos = [ids[n] for n in EOS_NAMES]
    pad, bos = ids["<pad>"], ids["<bos>"]
    rope = {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    text = {"model_type": "diffusion_gemma_text", "hidden_size": H, "num_hidden_layers": a.layers,
            "num_attention_heads": nh, "num_key_value_heads": a.kv_heads,
            "num_global_key_value_heads": a.global_kv_heads, "head_dim": a.head_dim,
            "global_head_dim": a.global_head_dim, "intermediate_size": I, "num_experts": E,
            "top_k_experts": a.top_k, "moe_intermediate_size": Ie, "enable_moe_block": True,
            "attention_k_eq_v": True, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0, "sliding_window": a.sliding_window, "layer_types": types,
            "max_position_embeddings": a.max_pos, "rope_parameters": rope, "vocab_size": V,
            "attention_bias": False, "attention_dropout": 0.0, "use_bidirectional_attention": "vision",
            "tie_word_embeddings": True, "pad_token_id": pad, "eos_token_id": eos, "bos_token_id": bos,
            "dtype": torch_dtype}
    cfg = {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
           "canvas_length": a.canvas_length, "tie_word_embeddings": True, "eos_token_id": eos,
           "pad_token_id": pad, "bos_token_id": bos, "vision_soft_tokens_per_image": 280,
           "text_config": text, "vision_config": vis, "dtype": torch_dtype}
    tcfg = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
            "add_eos_token": False, "model_max_length": a.max_pos}
    gen = {"max_new_tokens": 16, "max_denoising_steps": 12,
           "sampler_config": {"type": "EntropyBoundSamplerConfig", "entropy_bound": 0.1},
           "t_min": 0.4, "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005,
           "eos_token_id": eos, "pad_token_id": pad, "bos_token_id": bos}
    return t, cfg, tcfg, gen
