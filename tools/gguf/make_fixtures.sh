#!/usr/bin/env bash
# make_fixtures.sh: regenerates the GGUF test fixtures of tests/data/gguf/ and their llama.cpp oracle data.
#
#   tools/gguf/make_fixtures.sh [OUT_DIR]        (default OUT_DIR: <repo>/tests/data/gguf)
#
# Needs: /usr/bin/python3 with numpy ($PYTHON overrides), and .llamacpp/ from scripts/fetch_llamacpp.sh
# (gguf-py, libggml-base.so for the K-quants, bin/llamacpp-oracle). No network. Deterministic: the tiny
# checkpoints are fixed by their --seed, the converter is deterministic, the token lists come from a seeded
# numpy Generator and the oracle runs llama.cpp's CPU backend with one thread. (The logits can differ in
# the last bits between CPU backend variants (AVX2 / AVX-512 ...), which the tests' tolerances absorb.)
# Leaves quant_vectors.bin (tools/gguf/make_quant_vectors.py) alone.
#
# Writes (about 1.7 MB in all):
#   llada-gqa-f32.gguf    make_tiny_checkpoint.py --family llada --kv-heads 2 --dtype f32 --seed 11     -> f32
#   dream-f16.gguf        make_tiny_checkpoint.py --family dream --dtype f32 --seed 12                  -> f16
#   llada-moe-bf16.gguf   make_tiny_checkpoint.py --family llada_moe --dtype f32 --seed 13              -> bf16
#                         (the defaults: 8 experts, top-2, expert_inter 32, every layer MoE, no shared
#                         expert, qk-norm, full rotary, routed scale 1: all within llama.cpp's llada-moe)
#   llada-w256-q4_k.gguf  make_tiny_checkpoint.py --family llada --hidden 256 --layers 1
#                         --intermediate 256 --dtype f32 --seed 14                                      -> q4_k
#                         (rows of 256: all 9 matrices really are Q4_K, the script checks there is no fallback)
#   tessera-tiny-vocab.gguf  models/tessera-tiny converted with --vocab-only (metadata + tokenizer)
#   <model>.llamacpp.f32  llama.cpp's raw logits [24, n_vocab] float32 little-endian (oracle `logits`, every
#                         position, NO Dream shift) of the model's 24 fixture tokens: 12 pseudo-random
#                         ordinary (token type NORMAL) ids, 6 x the model's mask id, 6 pseudo-random ordinary
#   manifest.json         {"models": [{file, family, checkpoint_args, outtype, tokens, llamacpp_logits,
#                         n_vocab, shift_logits}], "tokenizer": {file, cases: [{text, ids}]}, "llama_cpp"}
#                         tokenizer ids: oracle `tokenize` (add_special false, parse_special true)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$REPO/tests/data/gguf}"
PY="${PYTHON:-/usr/bin/python3}"
LC="$REPO/.llamacpp"
ORACLE="$LC/bin/llamacpp-oracle"

for f in "$ORACLE" "$LC/gguf-py/gguf/__init__.py" "$LC/lib/libggml-base.so"; do
    [[ -e "$f" ]] || { echo "make_fixtures: $f missing: run scripts/fetch_llamacpp.sh" >&2; exit 1; }
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# name | family | make_tiny_checkpoint args (without --family / --out) | outtype
MODELS=(
    "llada-gqa-f32|llada|--kv-heads 2 --dtype f32 --seed 11|f32"
    "dream-f16|dream|--dtype f32 --seed 12|f16"
    "llada-moe-bf16|llada_moe|--dtype f32 --seed 13|bf16"
    "llada-w256-q4_k|llada|--hidden 256 --layers 1 --intermediate 256 --dtype f32 --seed 14|q4_k"
)

: > "$WORK/models.txt"
for m in "${MODELS[@]}"; do
    IFS='|' read -r name family args outtype <<< "$m"
    echo "== $name: make_tiny_checkpoint.py --family $family $args; hf_to_gguf.py --outtype $outtype"
    # shellcheck disable=SC2086
    "$PY" "$REPO/tools/make_tiny_checkpoint.py" --family "$family" $args --out "$WORK/$name" > /dev/null
    "$PY" "$REPO/tools/gguf/hf_to_gguf.py" "$WORK/$name" "$OUT/$name.gguf" --outtype "$outtype" --quiet \
        | tee "$WORK/$name.summary"
    if [[ "$outtype" == q4_k ]]; then
        # every matrix a K-quant (Q4_K; Q6_K allowed), none fallen back to Q8_0 / F16
        grep -Eq "tensor types: F32 x[0-9]+, Q4_K x[0-9]+(, Q6_K x[0-9]+)?$" "$WORK/$name.summary" \
            || { echo "make_fixtures: $name: not all matrices are Q4_K / Q6_K" >&2; exit 1; }
        ! grep -q "fallbacks" "$WORK/$name.summary" \
            || { echo "make_fixtures: $name: unexpected fallbacks" >&2; exit 1; }
    fi
    echo "$name|$family|--family $family $args|$outtype" >> "$WORK/models.txt"
done

echo "== tessera-tiny-vocab: hf_to_gguf.py models/tessera-tiny --vocab-only"
"$PY" "$REPO/tools/gguf/hf_to_gguf.py" "$REPO/models/tessera-tiny" "$OUT/tessera-tiny-vocab.gguf" --vocab-only --quiet

echo "== oracle logits, tokenizer cases, manifest.json"
"$PY" - "$REPO" "$OUT" "$ORACLE" "$WORK/models.txt" <<'EOF'
import json, os, subprocess, sys
import numpy as np

repo, out, oracle, models_txt = sys.argv[1:5]
sys.path.insert(0, os.path.join(repo, ".llamacpp", "gguf-py"))
import gguf  # noqa: E402


def run(*args):
    r = subprocess.run([oracle, *args], capture_output=True, text=True, encoding="utf-8")
    if r.returncode != 0:
        sys.exit(f"make_fixtures: oracle {args[0]} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


models = []
for line in open(models_txt).read().split("\n"):
    if not line:
        continue
    name, family, args, outtype = line.split("|")
    path = os.path.join(out, name + ".gguf")
    r = gguf.GGUFReader(path)
    types = np.asarray(field(r, "tokenizer.ggml.token_type"))
    n_vocab = len(types)
    mask = int(field(r, "tokenizer.ggml.mask_token_id"))
    normal = np.flatnonzero(types == int(gguf.TokenType.NORMAL))
    seed = int(args.split("--seed ")[1].split()[0])
    rng = np.random.default_rng(1000 + seed)
    pick = rng.choice(normal, size=18, replace=False)
    tokens = [int(t) for t in pick[:12]] + [mask] * 6 + [int(t) for t in pick[12:]]
    assert all(t < n_vocab for t in tokens) and mask not in normal
    logits = name + ".llamacpp.f32"
    got = int(run("logits", path, ",".join(map(str, tokens)), os.path.join(out, logits)))
    assert got == n_vocab, (got, n_vocab)
    assert os.path.getsize(os.path.join(out, logits)) == 4 * len(tokens) * n_vocab
    models.append({"file": name + ".gguf", "family": family, "checkpoint_args": args, "outtype": outtype,
                   "tokens": tokens, "llamacpp_logits": logits, "n_vocab": n_vocab,
                   "shift_logits": family == "dream"})
    print(f"{name}: n_vocab {n_vocab}, mask {mask}, tokens {tokens}")

texts = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, there was a little girl who loved to play in the park.",
    "I'm sure you'll like it, they'd said; we're here and it's fine. I'M SURE YOU'LL",
    "In 2026 and 1234567 there were 3.14159 reasons, 42nd street, 0x1F.",
    "Wait... what?!?! (really) -- yes: [ok] {done} ***bold*** ~~~ ;;; ,,,",
    "line one\nline two\n\n\nline five\r\n  indented\n\ttabbed\t\tcell",
    "spaces:  two   three    four     end   \t \n trailing   ",
    "Café naïve façade résumé Ångström Zürich déjà vu, São Paulo, Łódź, Ελληνικά, Русский",
    "中文测试：你好，世界！日本語のテキスト、한국어 문장.",
    "Emoji: 😀👍🏽🎉 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 ok ✅",
    "<|startoftext|>Hello<|endoftext|><|mdm_mask|><|mdm_mask|> world<|reserved_0|>",
    "User: what is 7*8?<|mdm_mask|>\n<|endoftext|> <|mdm_mask|>end",
]
tok_file = "tessera-tiny-vocab.gguf"
cases = []
for t in texts:
    ids = [int(x) for x in run("tokenize", os.path.join(out, tok_file), "--", t).split(",") if x]
    cases.append({"text": t, "ids": ids})
    print(f"tokenize {t[:40]!r}: {len(ids)} ids")

info = {}
p = os.path.join(repo, ".llamacpp", "llama.cpp.info.json")
if os.path.exists(p):
    info = json.load(open(p))
commit = open(os.path.join(repo, ".llamacpp", "llama.cpp.commit")).read().strip()
llama_cpp = f"{info.get('llamaCppGithubRepo', 'ggml-org/llama.cpp')} {info.get('tag', '?')} ({commit})"

manifest = {"models": models, "tokenizer": {"file": tok_file, "cases": cases}, "llama_cpp": llama_cpp}
with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1, ensure_ascii=False)
    f.write("\n")
EOF

echo "== sizes"
( cd "$OUT" && ls -l -- *.gguf *.llamacpp.f32 manifest.json && du -ch -- *.gguf *.llamacpp.f32 manifest.json | tail -1 )
