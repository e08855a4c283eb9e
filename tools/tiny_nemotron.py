"""The Nemotron-Labs-Diffusion part of make_tiny_checkpoint.py (`--family nemotron`), written from
shared/specs/nemotron-labs-diffusion.md sections 1 and 2 (Ministral-3 backbone, HF remote-code names).

Tensors, in draw order: encoder.embed_tokens.weight [V, H]; per layer i encoder.layers.i.
input_layernorm.weight [H], self_attn.q_proj.weight [heads * head_dim, H], self_attn.k_proj.weight
[kv * head_dim, H], self_attn.v_proj.weight [kv * head_dim, H], self_attn.o_proj.weight [H, heads *
head_dim], post_attention_layernorm.weight [H], mlp.gate_proj.weight [I, H], mlp.up_proj.weight [I, H],
mlp.down_proj.weight [H, I]; encoder.norm.weight [H]; diffusion_head.weight [V, H] (untied).

head_dim is explicit (--head-dim, default 24): q_proj's output (4 * 24 = 96) differs from hidden (64) as
on the real 3B / 14B. rope_parameters: YaRN (factor 16, theta 1e6, beta_fast 32, beta_slow 1) with the
Llama-4 query scale (llama_4_scaling_beta 0.1); original_max_position_embeddings is 64 (the real one is
16384) so that positions >= 64 of a tiny canvas exercise the query scale, and no mscale / mscale_all_dim
keys, so HF's attention_factor = 0.1 ln(16) + 1 applies (--nemotron-mscale writes both as 1.0, the real
checkpoints' values, giving attention_factor 1).

--nemotron-lora R (spec section 2) adds the subfolder linear_spec_lora/ in PEFT's layout: adapter_config.json
(peft_type LORA, r R, lora_alpha 2R so the scale alpha / r = 2 is not 1, target_modules ["o_proj"]) and
adapter_model.safetensors (the checkpoint's dtype) with, per layer i,
base_model.model.encoder.layers.i.self_attn.o_proj.lora_A.weight [R, heads * head_dim] ~ N(0, 1 / (heads *
head_dim)) and ...o_proj.lora_B.weight [H, R] ~ N(0, 1 / R) (non-zero, unlike PEFT's zero init, so that the
adapter changes the drafts), drawn in that order after every base weight: the base weights of a seed do not
change.
"""

SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "<mask>"]

# The real chat template was not read (spec section 5); a Mistral-style stand-in over the tiny's tokens.
CHAT = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
        "{{ message['content'] + eos_token }}{% else %}{{ '[INST]' + message['content'] + '[/INST]' }}"
        "{% endif %}{% endfor %}")

MAX_POS = 262144
LORA_DIR = "linear_spec_lora"  # the draft-only adapter's subfolder (spec section 2)


def build_nemotron(a, rng, lin, norm, ids, kv, torch_dtype):
    """Nemotron-Labs-Diffusion tensors (in draw order), config.json and tokenizer_config.json."""
    d, f, V, hd, H = a.hidden, a.intermediate, a.vocab, a.head_dim, a.heads
    t = {"encoder.embed_tokens.weight": rng.standard_normal((V, d)).astype("float32")}
    for i in range(a.layers):
        b = f"encoder.layers.{i}."
        t[b + "input_layernorm.weight"] = norm(d)
        t[b + "self_attn.q_proj.weight"] = lin(H * hd, d)
        t[b + "self_attn.k_proj.weight"] = lin(kv * hd, d)
        t[b + "self_attn.v_proj.weight"] = lin(kv * hd, d)
        t[b + "self_attn.o_proj.weight"] = lin(d, H * hd)
        t[b + "post_attention_layernorm.weight"] = norm(d)
        t[b + "mlp.gate_proj.weight"] = lin(f, d)
        t[b + "mlp.up_proj.weight"] = lin(f, d)
        t[b + "mlp.down_proj.weight"] = lin(d, f)
    t["encoder.norm.weight"] = norm(d)
    t["diffusion_head.weight"] = lin(V, d)
    rope = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 64,
            "llama_4_scaling_beta": 0.1, "beta_fast": 32.0, "beta_slow": 1.0}
    if a.nemotron_mscale:
        rope.update({"mscale": 1.0, "mscale_all_dim": 1.0})
    cfg = {"architectures": ["NemotronLabsDiffusionModel"],
           "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                        "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
           "model_type": "nemotron_labs_diffusion", "hidden_size": d, "intermediate_size": f,
           "num_hidden_layers": a.layers, "num_attention_heads": H, "num_key_value_heads": kv, "head_dim": hd,
           "vocab_size": V, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
           "attention_bias": False, "attention_dropout": 0.0, "max_position_embeddings": MAX_POS,
           "rope_parameters": rope, "mask_token_id": ids["<mask>"], "bos_token_id": ids["<s>"],
           "eos_token_id": ids["</s>"], "pad_token_id": ids["</s>"], "block_size": 32,
           "dlm_paradigm": "bidirectional", "use_cache": False, "torch_dtype": torch_dtype}
    tcfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>",
            "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False, "model_max_length": MAX_POS,
            "chat_template": CHAT}
    return t, cfg, tcfg


def build_lora(a, lin):
    """The draft-only LoRA of linear self-speculation (--nemotron-lora R): (adapter tensors in draw order,
    adapter_config.json). Called after every base weight is drawn."""
    R = a.nemotron_lora
    t = {}
    for i in range(a.layers):
        b = f"base_model.model.encoder.layers.{i}.self_attn.o_proj."
        t[b + "lora_A.weight"] = lin(R, a.heads * a.head_dim)  # N(0, 1 / fan_in)
        t[b + "lora_B.weight"] = lin(a.hidden, R)  # N(0, 1 / R): non-zero, unlike PEFT's init
    cfg = {"peft_type": "LORA", "r": R, "lora_alpha": 2 * R, "target_modules": ["o_proj"], "lora_dropout": 0.0,
           "bias": "none", "use_rslora": False, "fan_in_fan_out": False, "task_type": None,
           "base_model_name_or_path": "tiny-nemotron"}
    return t, cfg
