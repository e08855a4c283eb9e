#!/usr/bin/env python3
"""Converts tessera's Hugging Face checkpoints (LLaDA, Dream, LLaDA-MoE, Nemotron-Labs-Diffusion) to GGUF, the way
llama.cpp does.

  hf_to_gguf.py HF_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k]
                [--vocab-only] [--gguf-py DIR] [--ggml-lib PATH] [--quiet]

Written with llama.cpp's own Python GGUF package (gguf-py: GGUFWriter, TensorNameMap, MODEL_ARCH,
SpecialVocab, gguf.quants) and the conventions of llama.cpp's official converter (convert_hf_to_gguf.py,
conversion/llada.py, dream.py, base.py of llama.cpp v0.5.0 = node-llama-cpp 3.22.1), which cannot run
here (it needs `transformers`) and would refuse tessera's tiny tokenizers (their pre-tokenizer hash is
not in its list). The differences to it are listed under DEVIATIONS below.

  --vocab-only    write only the metadata and the tokenizer, no tensors (as the official converter's
                  --vocab-only: same keys, general.architecture and the {arch}.* hyperparameters included,
                  minus general.size_label; llama.cpp loads it with vocab_only = true, e.g. to tokenize)
  --gguf-py DIR   llama.cpp's gguf-py (default: <repo>/.llamacpp/gguf-py from scripts/fetch_llamacpp.sh,
                  else an installed `gguf` package)
  --ggml-lib PATH libggml-base.so, used through ctypes (ggml_quantize_chunk) for the K-quants, which
                  gguf-py cannot quantize (default: <repo>/.llamacpp/lib/libggml-base.so)

Architectures: config.json model_type "llada" (with d_model) -> MODEL_ARCH.LLADA "llada";
"Dream"/"dream" -> MODEL_ARCH.DREAM "dream"; "lladamoe"/"llada_moe" (or "llada" with num_experts and no
d_model) -> MODEL_ARCH.LLADA_MOE "llada-moe"; "nemotron_labs_diffusion" -> "nemotron-diffusion", an
architecture of tessera's own (llama.cpp has none for tri-mode models; see NEMOTRON below).

Conventions (as the official converter):
  * LLaDA: q_proj / k_proj weights (and biases) are permuted like LLaDAModel.permute (HF rotate-half RoPE
    -> llama.cpp's LLAMA_ROPE_TYPE_NORM, which rotates adjacent pairs): rows reshaped (heads, 2, hd/2)
    -> (heads, hd/2, 2); q with n_heads, k with n_kv_heads. Dream and LLaDA-MoE use NEOX rope: no permute.
  * LLaDA-MoE experts: mlp.experts.E.{gate,up,down}_proj stacked (torch.stack dim 0) into
    blk.N.ffn_{gate,up,down}_exps.weight, numpy [E, out, in] = ggml ne {in, out, E}.
  * tensor types: 1-D tensors, *_norm.weight, biases and the MoE router (ffn_gate_inp) stay F32; every
    other tensor (token_embd and output included) gets --outtype. A quantized type whose block does not
    divide the row falls back (K-quants: q8_0 when the row is a multiple of 32, else f16; q8_0 / q4_0:
    f16), reported in the summary.
  * keys: general.architecture / type / name / file_type / quantization_version, {arch}.block_count,
    context_length, embedding_length, feed_forward_length, attention.head_count, head_count_kv,
    rope.freq_base, attention.layer_norm_rms_epsilon, [attention.key_length / value_length = head_dim],
    LLaDA: vocab_size, rope.dimension_count, attention.causal = false, diffusion.shift_logits = false;
    Dream: attention.causal = false (NO diffusion.shift_logits key, as the official converter: readers
    default it to true); LLaDA-MoE: expert_count, expert_used_count, expert_feed_forward_length,
    attention.causal = false, diffusion.shift_logits = false.
  * tokenizer: tokenizer.ggml.model "gpt2", tokenizer.ggml.pre from the pre-tokenizer regex, tokens in id
    order up to config vocab_size (holes "[PAD{i}]" UNUSED), token_type NORMAL / CONTROL (special added
    tokens; for LLaDA-MoE also added tokens that look special, <|...|>) / USER_DEFINED (other added
    tokens), merges, then gguf.SpecialVocab: bos / eos / pad / mask / ... ids (tokenizer_config.json
    *_token strings looked up in added_tokens, else config.json *_token_id), add_bos / add_eos from
    tokenizer_config.json, chat_template; LLaDA: tokenizer.ggml.add_bos_token = true.

NEMOTRON (Nemotron-Labs-Diffusion, shared/specs/nemotron-labs-diffusion.md; open point 9 chosen as a new
architecture): tensors renamed encoder. -> model. and diffusion_head -> lm_head (the spec's GGUF mapping), then
named with DREAM's tensor map (blk.N.attn_q ..., output.weight), no permutation (rotate-half = NEOX RoPE);
keys as the other families plus attention.key_length / value_length = head_dim, attention.causal = false,
diffusion.shift_logits = false, diffusion.block_size = config block_size, rope.scaling.type yarn with
rope.scaling.factor / original_context_length / yarn_beta_fast / yarn_beta_slow / attn_factor (HF's
attention_factor: attention_factor, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), else
0.1 ln(factor) + 1) / yarn_truncate (only when false), and attention.temperature_scale =
llama_4_scaling_beta with attention.temperature_length = original_max_position_embeddings (as llama.cpp writes
Ministral-3's). The draft adapter in linear_spec_lora/ is not converted (the GGUF drafts with the base model).

DEVIATIONS from the official converter (each only where it would fail or give a wrong model):
  * tokenizer.ggml.pre comes from comparing the pre-tokenizer regex (not from hashing a test string
    through transformers); known: qwen2, llama-bpe, gpt-2, llada-moe; anything else is an error.
  * LLaDA-MoE mask id: config.json mask_token_id (the official converter first writes 156895, the real
    LLaDA-MoE-7B's id, which SpecialVocab then overwrites when tokenizer_config.json names a mask_token).
  * LLaDA-MoE expert_feed_forward_length falls back to moe_intermediate_size; a tied LLaDA-MoE head (no
    lm_head tensor) is written as output.weight (llama.cpp's llada-moe requires that tensor).
  * LLaDA-MoE features llama.cpp's llada-moe graph cannot run (dense layers / moe_layer_freq 0, shared
    experts, partial rotary, norm_topk_prob, routed_scaling_factor != 1, no qk-norm, non-softmax router)
    are errors instead of a silently different model.
  * Tensors are streamed (memory-mapped safetensors, one tensor in memory at a time).
"""
import argparse
import ctypes
import json
import math
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OUTTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"]

# Pre-tokenizer regexes: the original of tokenizer.json (as llama-vocab.cpp quotes it) and llama.cpp's
# adapted form, for each tokenizer.ggml.pre value we can name.
PRE_REGEXES = {
    "qwen2": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "llama-bpe": [
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    # GPT-2's regex: what a ByteLevel pre-tokenizer with use_regex = true applies (tokenizers' ByteLevel
    # uses it with the trailing |\s+; llama.cpp's "gpt-2" drops it, which changes nothing: \s+(?!\S)
    # followed by a lone whitespace run always leaves it to the next alternatives).
    "gpt-2": [
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    ],
    "llada-moe": [
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ],
}
GPT2_BYTELEVEL_REGEX = PRE_REGEXES["gpt-2"][0]


def die(msg):
    sys.stderr.write(f"hf_to_gguf: error: {msg}\n")
    sys.exit(1)


class Log:
    quiet = False

    @classmethod
    def info(cls, msg):
        if not cls.quiet:
            print(msg)

    @staticmethod
    def warn(msg):
        sys.stderr.write(f"hf_to_gguf: warning: {msg}\n")


# ---------------------------------------------------------------------------------------------
# gguf-py and libggml-base
# ---------------------------------------------------------------------------------------------

def import_gguf(path):
    cands = [path] if path else [os.path.join(REPO, ".llamacpp", "gguf-py")]
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "gguf", "__init__.py")):
            sys.path.insert(0, os.path.abspath(c))
            break
    else:
        if path:
            die(f"--gguf-py {path}: no gguf/__init__.py there")
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        die(f"cannot import llama.cpp's gguf-py ({e}); run scripts/fetch_llamacpp.sh or pass --gguf-py DIR")
    import gguf
    return gguf


class GgmlQuant:
    """ggml_quantize_chunk of the real libggml-base.so, through ctypes."""

    def __init__(self, path):
        if not path:
            path = os.path.join(REPO, ".llamacpp", "lib", "libggml-base.so")
        if not os.path.isfile(path):
            die(f"libggml-base.so not found at {path} (K-quants need it): run scripts/fetch_llamacpp.sh or "
                f"pass --ggml-lib PATH")
        try:
            self.lib = ctypes.CDLL(os.path.abspath(path))
        except OSError as e:
            die(f"cannot load {path}: {e}")
        f = self.lib.ggml_quantize_chunk
        f.restype = ctypes.c_size_t
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_int64, ctypes.c_void_p]
        self.lib.ggml_row_size.restype = ctypes.c_size_t
        self.lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        self.lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        self.lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        self.path = path

    def quantize(self, data, qtype):
        """float32 [..., n] -> uint8 [..., row bytes] of ggml type qtype (an int)."""
        data = np.ascontiguousarray(data, dtype=np.float32)
        n = data.shape[-1]
        rows = data.size // n
        if self.lib.ggml_quantize_requires_imatrix(int(qtype)):
            die(f"ggml type {qtype} needs an importance matrix")
        rb = self.lib.ggml_row_size(int(qtype), n)
        dst = np.empty((rows, rb), dtype=np.uint8)
        got = self.lib.ggml_quantize_chunk(int(qtype), data.ctypes.data, dst.ctypes.data, 0, rows, n, None)
        if got != dst.nbytes:
            die(f"ggml_quantize_chunk wrote {got} bytes, expected {dst.nbytes}")
        return dst.reshape(*data.shape[:-1], rb)


# ---------------------------------------------------------------------------------------------
# safetensors, memory-mapped
# ---------------------------------------------------------------------------------------------

class Checkpoint:
    """Tensors of an HF checkpoint directory, read lazily (np.memmap) and widened to float32."""

    DT = {"BF16": ("<u2", 2), "F16": ("<f2", 2), "F32": ("<f4", 4)}

    def __init__(self, d):
        index = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = sorted(p for p in os.listdir(d) if p.endswith(".safetensors"))
        if not files:
            die(f"{d}: no .safetensors files")
        self.meta = {}  # name -> (path, dtype, shape, begin)
        self.order = []
        for fn in files:
            path = os.path.join(d, fn)
            with open(path, "rb") as f:
                hlen = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(hlen))
            base = 8 + hlen
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                if t["dtype"] not in self.DT:
                    die(f"{path}: unsupported dtype {t['dtype']} of {name}")
                if name in self.meta:
                    die(f"{d}: tensor {name} appears twice")
                self.meta[name] = (path, t["dtype"], tuple(t["shape"]), base + t["data_offsets"][0])
                self.order.append(name)
        self.src_dtypes = sorted({m[1] for m in self.meta.values()})

    def __contains__(self, name):
        return name in self.meta

    def shape(self, name):
        return self.meta[name][2]

    def load(self, name):
        path, dt, shape, off = self.meta[name]
        np_dt, size = self.DT[dt]
        n = int(np.prod(shape, dtype=np.int64))
        raw = np.memmap(path, dtype=np_dt, mode="r", offset=off, shape=(n,))
        if dt == "BF16":
            arr = (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
        else:
            arr = raw.astype(np.float32)
        return arr.reshape(shape)


# ---------------------------------------------------------------------------------------------
# model description
# ---------------------------------------------------------------------------------------------

def find(cfg, keys, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def detect_family(cfg):
    mt = cfg.get("model_type", "")
    archs = cfg.get("architectures") or []
    if mt in ("lladamoe", "llada_moe") or (mt == "llada" and "num_experts" in cfg and "d_model" not in cfg) \
            or any(a in ("LLaDAMoEModel", "LLaDAMoEModelLM") for a in archs):
        return "llada_moe"
    if mt == "llada" or "LLaDAModelLM" in archs:
        return "llada"
    if mt in ("Dream", "dream") or "DreamModel" in archs:
        return "dream"
    if mt == "nemotron_labs_diffusion" or "NemotronLabsDiffusionModel" in archs:
        return "nemotron"
    if mt == "llada2_moe":
        die("LLaDA2 (llada2_moe) has no llama.cpp architecture in llama.cpp v0.5.0")
    die(f"unsupported model_type {mt!r} / architectures {archs} (llada, Dream, lladamoe, nemotron_labs_diffusion)")


def llada_permute(w, n_head, n_head_kv):
    """LLaDAModel.permute of llama.cpp's converter: rows (heads, 2, hd/2) -> (heads, hd/2, 2)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def check_moe_supported(cfg, ck):
    """Errors for LLaDA-MoE features llama.cpp's llada-moe graph (src/models/llada-moe.cpp) cannot run."""
    nl = cfg["num_hidden_layers"]
    problems = []
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list) and any(f == 0 for f in freq):
        problems.append(f"dense (non-MoE) layers: moe_layer_freq = {freq}")
    elif isinstance(freq, int) and freq != 1:
        problems.append(f"moe_layer_freq = {freq}")
    if cfg.get("shared_expert_intermediate_size") or cfg.get("num_shared_experts"):
        problems.append("a shared expert (shared_expert_intermediate_size / num_shared_experts)")
    prf = cfg.get("partial_rotary_factor")
    if prf is not None and float(prf) != 1.0:
        problems.append(f"partial_rotary_factor = {prf} (llama.cpp's llada-moe rotates the whole head)")
    if cfg.get("norm_topk_prob"):
        problems.append("norm_topk_prob = true (llama.cpp's llada-moe never renormalises the top-k weights)")
    rsf = cfg.get("routed_scaling_factor")
    if rsf is not None and float(rsf) != 1.0:
        problems.append(f"routed_scaling_factor = {rsf} (llada-moe reads no expert_weights_scale)")
    if cfg.get("qk_layernorm") is False:
        problems.append("qk_layernorm = false (llada-moe requires attn_q_norm / attn_k_norm)")
    sf = cfg.get("moe_router_score_function", "softmax")
    if sf not in (None, "softmax"):
        problems.append(f"moe_router_score_function = {sf!r} (llada-moe gates with softmax)")
    if cfg.get("moe_router_enable_expert_bias"):
        problems.append("moe_router_enable_expert_bias = true")
    for i in range(nl):
        if f"model.layers.{i}.mlp.gate.weight" not in ck:
            problems.append(f"layer {i} has no router mlp.gate.weight")
            break
    if problems:
        die("this LLaDA-MoE checkpoint uses features llama.cpp's llada-moe architecture cannot represent:\n  - "
            + "\n  - ".join(problems))


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def detect_pre(tok):
    """tokenizer.ggml.pre from tokenizer.json's pre_tokenizer (regex comparison)."""
    pt = tok.get("pre_tokenizer")
    if pt is None:
        die("tokenizer.json has no pre_tokenizer: cannot choose tokenizer.ggml.pre")
    items = pt.get("pretokenizers", []) if pt.get("type") == "Sequence" else [pt]
    regexes, bytelevel = [], None
    for it in items:
        t = it.get("type")
        if t == "Split":
            pat = it.get("pattern", {})
            if "Regex" in pat:
                regexes.append(pat["Regex"])
            else:
                die(f"unsupported Split pattern {pat} in tokenizer.json")
        elif t == "ByteLevel":
            bytelevel = it
        else:
            die(f"unsupported pre-tokenizer {t!r} in tokenizer.json (known: Split + ByteLevel, ByteLevel)")
    if bytelevel is None:
        die("tokenizer.json's pre-tokenizer has no ByteLevel step: not a GPT-2 style BPE")
    if bytelevel.get("add_prefix_space", False):
        die("ByteLevel add_prefix_space = true is not supported by llama.cpp's BPE pre-tokenizers")
    if bytelevel.get("use_regex", True):
        regexes.append(GPT2_BYTELEVEL_REGEX)
    if len(regexes) != 1:
        die(f"expected exactly one pre-tokenizer regex, found {len(regexes)}: {regexes}")
    rx = regexes[0]
    for name, forms in PRE_REGEXES.items():
        if rx in forms:
            return name, rx
    die(f"unknown pre-tokenizer regex {rx!r}; known: {', '.join(PRE_REGEXES)} (src/llama-vocab.cpp)")


def build_vocab(gguf, d, family, vocab_size):
    """(tokens, toktypes, pre) as the official converter's get_vocab_base of the family."""
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        die(f"tokenizer.json model type {model.get('type')!r}: only BPE (tokenizer.ggml.model gpt2) is supported")
    pre, rx = detect_pre(tok)
    norm = tok.get("normalizer")
    if norm is not None and norm.get("type") not in ("NFC",):
        Log.warn(f"tokenizer.json normalizer {norm.get('type')!r} is ignored by llama.cpp's BPE tokenizer")
    vocab = dict(model["vocab"])
    added = {}  # id -> added token entry
    for at in tok.get("added_tokens", []):
        added[at["id"]] = at
        vocab[at["content"]] = at["id"]  # AutoTokenizer.get_vocab() includes the added tokens
    if max(vocab.values()) >= vocab_size:
        die(f"token id {max(vocab.values())} >= config vocab_size {vocab_size}")
    reverse = {i: t for t, i in vocab.items()}
    T = gguf.TokenType
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(T.UNUSED)
            continue
        t = reverse[i]
        if i in added and added[i]["content"] == t:
            special = bool(added[i].get("special", False))
            if family in ("llada", "dream", "nemotron"):
                # LLaDAModel / DreamModel.get_vocab_base (nemotron: as the spec's converter, DREAM's)
                types.append(T.CONTROL if special else T.USER_DEFINED)
            else:
                # TextModel.get_vocab_base (LLaDA-MoE): special or looks special -> CONTROL
                looks = (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
                         or (t.startswith("<|") and t.endswith("|>"))
                         or (t.startswith("<\uff5c") and t.endswith("\uff5c>"))
                         or (t.startswith("<unused") and t.endswith(">")))
                if special or looks:
                    types.append(T.CONTROL)
                else:
                    t = t.replace("\u2581", " ")
                    types.append(T.USER_DEFINED)
        else:
            types.append(T.NORMAL)
        tokens.append(t)
    return tokens, types, pre, rx


# ---------------------------------------------------------------------------------------------
# conversion
# ---------------------------------------------------------------------------------------------

class Plan:
    """One output tensor: GGUF name, numpy shape, ggml type, loader of its float32 data."""

    def __init__(self, name, shape, loader, src):
        self.name, self.shape, self.loader, self.src = name, tuple(shape), loader, src
        self.qtype = None
        self.note = ""


def tensor_plan(gguf, family, cfg, ck, arch):
    """[Plan] in checkpoint order (stacked experts at their layer's first expert)."""
    nl = find(cfg, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"])
    tmap = gguf.get_tensor_name_map(arch, nl)
    n_head = find(cfg, ["num_attention_heads", "n_heads"])
    n_kv = find(cfg, ["num_key_value_heads", "n_kv_heads"])
    plans, done = [], set()

    def mapped(name):
        if family == "nemotron":  # the spec's GGUF mapping onto the llama-style names
            name = "model." + name[len("encoder."):] if name.startswith("encoder.") else name
            name = "lm_head" + name[len("diffusion_head"):] if name.startswith("diffusion_head") else name
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            die(f"cannot map tensor {name!r} to a {gguf.MODEL_ARCH_NAMES[arch]} GGUF tensor")
        return new

    n_exp = find(cfg, ["num_local_experts", "num_experts"]) if family == "llada_moe" else None
    exp_re = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    for name in ck.order:
        if name in done:
            continue
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        m = exp_re.match(name)
        if m:
            if family != "llada_moe":
                die(f"unexpected expert tensor {name}")
            bid = int(m.group(1))
            for w in ("down_proj", "gate_proj", "up_proj"):  # LLaDAMoEModel.modify_tensors order
                names = [f"model.layers.{bid}.mlp.experts.{x}.{w}.weight" for x in range(n_exp)]
                for nm in names:
                    if nm not in ck:
                        die(f"missing expert tensor {nm}")
                shp = ck.shape(names[0])
                if any(ck.shape(nm) != shp for nm in names):
                    die(f"layer {bid} {w}: experts of different shapes")
                done.update(names)
                plans.append(Plan(mapped(f"model.layers.{bid}.mlp.experts.{w}.weight"), (n_exp,) + shp,
                                  (lambda ns=names: np.stack([ck.load(x) for x in ns], axis=0)),
                                  f"model.layers.{bid}.mlp.experts.*.{w}.weight"))
            continue
        new = mapped(name)
        loader = (lambda nm=name: ck.load(nm))
        if family == "llada":
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                loader = (lambda nm=name: llada_permute(ck.load(nm), n_head, n_head))
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                loader = (lambda nm=name: llada_permute(ck.load(nm), n_head, n_kv))
        plans.append(Plan(new, ck.shape(name), loader, name))
        done.add(name)
    names = {p.name for p in plans}
    if len(names) != len(plans):
        die("two checkpoint tensors map to the same GGUF tensor")
    if "output.weight" not in names:
        if family == "llada_moe":
            Log.warn("no lm_head: writing output.weight as a copy of token_embd.weight "
                     "(llama.cpp's llada-moe requires output.weight)")
            emb = next(p for p in plans if p.name == "token_embd.weight")
            plans.append(Plan("output.weight", emb.shape, emb.loader, emb.src + " (tied)"))
        else:
            Log.info("note: no output.weight (tied embeddings): llama.cpp uses token_embd.weight as the head")
    return plans


def choose_types(gguf, plans, outtype):
    Q = gguf.GGMLQuantizationType
    want = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0,
            "q4_k": Q.Q4_K, "q5_k": Q.Q5_K, "q6_k": Q.Q6_K}[outtype]
    for p in plans:
        n_dims = len(p.shape)
        if n_dims <= 1 or p.name.endswith("_norm.weight") or not p.name.endswith(".weight") \
                or re.match(r"^blk\.\d+\.ffn_gate_inp(_shexp)?\.weight$", p.name):
            p.qtype = Q.F32
            continue
        q = want
        if q not in (Q.F32, Q.F16, Q.BF16):
            blk = gguf.GGML_QUANT_SIZES[q][0]
            if p.shape[-1] % blk:
                if q in (Q.Q4_K, Q.Q5_K, Q.Q6_K) and p.shape[-1] % 32 == 0:
                    fb = Q.Q8_0
                else:
                    fb = Q.F16
                p.note = f"row of {p.shape[-1]} is not a multiple of the {q.name} block {blk}: {fb.name}"
                q = fb
        p.qtype = q
    return want


def nbytes(gguf, shape, qtype):
    n = int(np.prod(shape, dtype=np.int64))
    blk, size = gguf.GGML_QUANT_SIZES[qtype]
    return n // blk * size


def encode(gguf, data, qtype, ggml):
    Q = gguf.GGMLQuantizationType
    if qtype == Q.F32:
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(data, dtype=np.float16)
    if qtype in (Q.BF16, Q.Q8_0, Q.Q4_0):
        return gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), qtype)
    return ggml.quantize(data, int(qtype))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=OUTTYPES, default="f32")
    ap.add_argument("--gguf-py", default="", help="llama.cpp's gguf-py directory")
    ap.add_argument("--ggml-lib", default="", help="libggml-base.so (K-quants)")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    ap.add_argument("--vocab-only", action="store_true", help="metadata and tokenizer only, no tensors")
    a = ap.parse_args()
    Log.quiet = a.quiet
    gguf = import_gguf(a.gguf_py)
    d = a.hf_dir
    if not os.path.isfile(os.path.join(d, "config.json")):
        die(f"{d}: no config.json")
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    family = detect_family(cfg)
    arch = {"llada": gguf.MODEL_ARCH.LLADA, "dream": gguf.MODEL_ARCH.DREAM,
            "llada_moe": gguf.MODEL_ARCH.LLADA_MOE, "nemotron": gguf.MODEL_ARCH.DREAM}[family]
    arch_name = "nemotron-diffusion" if family == "nemotron" else gguf.MODEL_ARCH_NAMES[arch]
    if family == "nemotron":
        if cfg.get("dlm_paradigm", "bidirectional") != "bidirectional":
            die(f"dlm_paradigm {cfg['dlm_paradigm']!r}: only the released 'bidirectional' is supported")
        if os.path.isdir(os.path.join(d, "linear_spec_lora")):
            Log.warn("linear_spec_lora/ (the draft adapter) is not converted: the GGUF drafts with the base model")
    ck = Checkpoint(d)
    if family == "llada_moe":
        check_moe_supported(cfg, ck)
    if family == "llada":
        for k, v in (("alibi", False), ("rope", True), ("layer_norm_type", "rms"), ("block_type", "llama"),
                     ("activation_type", "silu")):
            if k in cfg and cfg[k] != v:
                die(f"LLaDA config {k} = {cfg[k]!r}: llama.cpp's llada architecture needs {v!r}")

    # ---- tensors (plan only; data is streamed at write time)
    plans = tensor_plan(gguf, family, cfg, ck, arch)
    want = choose_types(gguf, plans, a.outtype)
    ggml = GgmlQuant(a.ggml_lib) if not a.vocab_only and any(p.qtype.name.endswith("_K") for p in plans) else None

    # ---- metadata
    W = gguf.GGUFWriter(a.out, arch_name)
    FT = gguf.LlamaFileType
    ftype = {"f32": FT.ALL_F32, "f16": FT.MOSTLY_F16, "bf16": FT.MOSTLY_BF16, "q8_0": FT.MOSTLY_Q8_0,
             "q4_0": FT.MOSTLY_Q4_0, "q4_k": FT.MOSTLY_Q4_K_S, "q5_k": FT.MOSTLY_Q5_K_S,
             "q6_k": FT.MOSTLY_Q6_K}[a.outtype]
    W.add_type(gguf.GGUFType.MODEL)
    total = sum(int(np.prod(p.shape)) for p in plans if p.src.endswith("(tied)") is False)
    name = os.path.basename(os.path.normpath(d))
    W.add_name(name)
    try:
        if a.vocab_only:  # the official converter counts no parameters without tensors: no size label
            raise ValueError
        n_exp = find(cfg, ["num_local_experts", "num_experts"]) or 0
        exp_params = sum(int(np.prod(p.shape)) for p in plans if "_exps." in p.name)
        W.add_size_label(gguf.size_label(total, total - exp_params, exp_params // max(n_exp, 1) if n_exp else 0,
                                         n_exp))
    except Exception:  # noqa: BLE001 - a label is cosmetic
        pass

    hp = {}  # what we wrote, for the summary

    def put(key, fn, val):
        fn(val)
        hp[key] = val

    nl = find(cfg, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"])
    n_head = find(cfg, ["num_attention_heads", "n_head", "n_heads"])
    n_kv = find(cfg, ["num_key_value_heads", "n_kv_heads"])
    # TextModel.set_gguf_parameters
    put("block_count", W.add_block_count, nl)
    if family == "llada":
        put("context_length", W.add_context_length, cfg.get("max_sequence_length", 4096))
        put("embedding_length", W.add_embedding_length, cfg.get("d_model", 4096))
        put("feed_forward_length", W.add_feed_forward_length, cfg.get("mlp_hidden_size", 12288))
    else:
        n_ctx = find(cfg, ["max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                           "model_max_length"])
        if n_ctx is not None:
            put("context_length", W.add_context_length, n_ctx)
        put("embedding_length", W.add_embedding_length, find(cfg, ["hidden_size", "n_embd", "dim"]))
        n_ff = find(cfg, ["prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
                          "n_inner", "hidden_dim"])
        if n_ff is not None:
            put("feed_forward_length", W.add_feed_forward_length, n_ff)
    put("head_count", W.add_head_count, n_head)
    if n_kv is not None:
        put("head_count_kv", W.add_head_count_kv, n_kv)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope:
        rt = rope.get("rope_type", rope.get("type"))
        if rt not in (None, "default") and not (family == "nemotron" and rt == "yarn"):
            die(f"rope scaling {rope} is not supported by this converter")
    theta = find(cfg, ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                       "rotary_emb_base"])
    if theta is None:
        theta = rope.get("rope_theta")
    if theta is not None:
        put("rope.freq_base", W.add_rope_freq_base, float(theta))
    eps = find(cfg, ["rms_norm_eps", "norm_eps"])
    if eps is not None:
        put("attention.layer_norm_rms_epsilon", W.add_layer_norm_rms_eps, float(eps))
    if family == "llada_moe":
        put("expert_count", W.add_expert_count, find(cfg, ["num_local_experts", "num_experts", "n_routed_experts"]))
        put("expert_used_count", W.add_expert_used_count,
            find(cfg, ["num_experts_per_tok", "num_experts_per_token", "top_k_experts"]))
    if cfg.get("head_dim") is not None:
        put("attention.key_length", W.add_key_length, cfg["head_dim"])
        put("attention.value_length", W.add_value_length, cfg["head_dim"])
    W.add_file_type(ftype)
    # family-specific (LLaDAModel / DreamModel / LLaDAMoEModel.set_gguf_parameters)
    if family == "llada":
        put("vocab_size", W.add_vocab_size, cfg["vocab_size"])
        rope_dim = cfg.get("head_dim") or cfg.get("hidden_size", cfg.get("d_model")) // n_head
        put("rope.dimension_count", W.add_rope_dimension_count, rope_dim)
        put("attention.causal", W.add_causal_attention, False)
        put("diffusion.shift_logits", W.add_diffusion_shift_logits, False)
    elif family == "nemotron":
        put("attention.causal", W.add_causal_attention, False)
        put("diffusion.shift_logits", W.add_diffusion_shift_logits, False)
        put("diffusion.block_size", lambda v: W.add_uint32("diffusion.block_size", v), int(cfg.get("block_size", 32)))
        orig = int(rope.get("original_max_position_embeddings", n_ctx))
        if rope.get("rope_type", rope.get("type")) == "yarn":
            factor = float(rope.get("factor", 1.0))

            def mscale(scale, m):
                return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
            if rope.get("attention_factor") is not None:
                attn = float(rope["attention_factor"])
            elif rope.get("mscale") and rope.get("mscale_all_dim"):
                attn = mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
            else:
                attn = mscale(factor, 1.0)
            put("rope.scaling.type", W.add_rope_scaling_type, gguf.RopeScalingType.YARN)
            put("rope.scaling.factor", W.add_rope_scaling_factor, factor)
            put("rope.scaling.yarn_beta_fast", W.add_rope_scaling_yarn_beta_fast, float(rope.get("beta_fast", 32.0)))
            put("rope.scaling.yarn_beta_slow", W.add_rope_scaling_yarn_beta_slow, float(rope.get("beta_slow", 1.0)))
            put("rope.scaling.attn_factor", W.add_rope_scaling_attn_factors, attn)
            if rope.get("truncate", True) is False:
                put("rope.scaling.yarn_truncate", lambda v: W.add_bool(f"{arch_name}.rope.scaling.yarn_truncate", v),
                    False)
        put("rope.scaling.original_context_length", W.add_rope_scaling_orig_ctx_len, orig)
        beta = rope.get("llama_4_scaling_beta")
        if beta:
            put("attention.temperature_scale", W.add_attn_temperature_scale, float(beta))
            put("attention.temperature_length", W.add_attn_temperature_length, orig)
    elif family == "dream":
        put("attention.causal", W.add_causal_attention, False)
        # DreamModel writes mask_token_id here; SpecialVocab below writes the same key again
    else:
        eff = find(cfg, ["expert_intermediate_size", "moe_intermediate_size"])
        if eff is not None:
            put("expert_feed_forward_length", W.add_expert_feed_forward_length, eff)
        put("attention.causal", W.add_causal_attention, False)
        put("diffusion.shift_logits", W.add_diffusion_shift_logits, False)
    W.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # ---- vocabulary (_set_vocab_gpt2)
    vocab_size = cfg.get("vocab_size")
    emb = next((p for p in plans if p.name == "token_embd.weight"), None)
    if emb is None:
        die("no token embedding tensor")
    if vocab_size is None:
        vocab_size = emb.shape[0]
    if emb.shape[0] != vocab_size:
        die(f"token_embd has {emb.shape[0]} rows but config vocab_size is {vocab_size}")
    tokens, toktypes, pre, rx = build_vocab(gguf, d, family, vocab_size)
    W.add_tokenizer_model("gpt2")
    W.add_tokenizer_pre(pre)
    W.add_token_list(tokens)
    W.add_token_types(toktypes)
    sv = gguf.SpecialVocab(d, load_merges=True)
    if family in ("dream", "llada_moe", "nemotron") and cfg.get("mask_token_id") is not None \
            and "mask" not in sv.special_token_ids:
        sv.special_token_ids["mask"] = int(cfg["mask_token_id"])
    sv.add_to_gguf(W, quiet=True)
    if family == "llada":  # LLaDAModel.set_vocab (overwrites SpecialVocab's value)
        if any(gguf.Keys.Tokenizer.ADD_BOS in kv for kv in W.kv_data):
            W.remove_key(gguf.Keys.Tokenizer.ADD_BOS)
        W.add_add_bos_token(True)
    hp_special = dict(sv.special_token_ids)

    # ---- tensors
    if a.vocab_only:
        plans = []
    for p in plans:
        dt = np.float32 if p.qtype == gguf.GGMLQuantizationType.F32 else (
            np.float16 if p.qtype == gguf.GGMLQuantizationType.F16 else np.uint8)
        if dt == np.uint8:
            blk, size = gguf.GGML_QUANT_SIZES[p.qtype]
            byte_shape = p.shape[:-1] + (p.shape[-1] // blk * size,)
            W.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), nbytes(gguf, p.shape, p.qtype), raw_dtype=p.qtype)
        else:
            W.add_tensor_info(p.name, p.shape, np.dtype(dt), nbytes(gguf, p.shape, p.qtype))
    W.write_header_to_file()
    W.write_kv_data_to_file()
    W.write_ti_data_to_file()
    checked = set()
    for p in plans:
        data = p.loader()
        if tuple(data.shape) != p.shape:
            die(f"{p.src}: shape {data.shape}, planned {p.shape}")
        enc = encode(gguf, data, p.qtype, ggml)
        if p.qtype.name.endswith("_K") and p.qtype not in checked:
            # self-check of the ctypes path: gguf-py's dequantizer must give the data back
            back = gguf.quants.dequantize(enc, p.qtype).reshape(data.shape)
            rel = float(np.sqrt(np.mean((back - data) ** 2)) / (np.sqrt(np.mean(data ** 2)) + 1e-30))
            if rel > 0.2:
                die(f"{p.name}: {p.qtype.name} round trip error {rel:.3g}: ggml type numbering mismatch?")
            checked.add(p.qtype)
            Log.info(f"check: {p.name} {p.qtype.name} via ggml_quantize_chunk, gguf-py dequantize relative "
                     f"RMS error {rel:.4f}")
        W.write_tensor_data(enc)
        Log.info(f"{p.name:32s} {str(tuple(reversed(p.shape))):>20s} {p.qtype.name:5s}  <- {p.src}"
                 + (f"  [{p.note}]" if p.note else ""))
    W.close()

    # ---- summary
    counts = {}
    for p in plans:
        counts[p.qtype.name] = counts.get(p.qtype.name, 0) + 1
    size = os.path.getsize(a.out)
    print(f"wrote {a.out}: arch {arch_name} ({family}), {len(plans)} tensors{' (--vocab-only)' if a.vocab_only else ''}, {size / 1e6:.2f} MB, outtype "
          f"{a.outtype} (file_type {ftype.name}), source {'/'.join(ck.src_dtypes)}")
    if plans:
        print("  tensor types: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    fb = [p for p in plans if p.note]
    if fb:
        print(f"  fallbacks ({len(fb)}): " + "; ".join(f"{p.name}: {p.note}" for p in fb[:6])
              + (" ..." if len(fb) > 6 else ""))
    print("  hparams: " + ", ".join(f"{k}={v}" for k, v in hp.items()))
    print(f"  tokenizer: gpt2, pre {pre!r}, {len(tokens)} tokens ("
          + ", ".join(f"{gguf.TokenType(t).name} {toktypes.count(t)}" for t in sorted(set(toktypes)))
          + f"), {len(sv.merges)} merges, special ids {hp_special}, add_special {dict(sv.add_special_token)}"
          + (", add_bos forced true" if family == "llada" else "")
          + (", chat template" if sv.chat_template else ""))
    head = next((p for p in plans if p.name == "output.weight"), None)
    if plans:
        print("  head: " + ("none: tied, llama.cpp uses token_embd.weight" if head is None else f"output.weight <- {head.src}"))
    if family == "llada" and plans:
        print(f"  permuted (LLaDAModel.permute): attn_q with {n_head} heads, attn_k with {n_kv or n_head} kv heads")


if __name__ == "__main__":
    main()
