#!/usr/bin/env python3
"""Byte-level BPE for the bundled tiny dLLMs: train, write tokenizer.json, encode the corpus, check.

  bpe.py train  [--data DIR] [--vocab 4096]     corpus/train.jsonl -> tokenizer/tokenizer.json,
                                                tokenizer/tokenizer_config.json
  bpe.py encode [--data DIR]                    corpus/*.jsonl -> tokens/train.bin, tokens/test.bin
                                                (uint16, every document <|startoftext|> ... <|endoftext|>),
                                                tokens/meta.json (ids, counts, prompt ids for samples)
  bpe.py check  [--data DIR] [--tessera-build build] [--lines 400]
                                                held-out lines -> tokens/tokenizer_check.json (text + ids
                                                from this encoder); if a tessera build is given, compiles
                                                tools/train/tok_check.cpp against it and compares the ids

The tokenizer is GPT-2 style byte-level BPE: ids 0..255 are the 256 bytes (id == byte value, written
as GPT-2's printable byte symbols), then the merges in the order learnt, then the special tokens at
the top of the vocabulary. Pre-tokenizer: NFC, then the Qwen2 / LLaMA-3 split regex (one digit per
piece), then ByteLevel without its own regex, exactly as in Qwen2's tokenizer.json.

Training is the textbook algorithm made incremental: a table of unique pre-tokens with counts, pair
counts kept up to date on every merge (only the words that contain the merged pair are touched), a
max-heap with lazy deletion to find the best pair (ties: the smaller id pair). A few minutes on one
core for ~40 MB of text. Needs the `regex` module (Debian: python3-regex) for \\p{L}; without it a
close ASCII-safe approximation with `re` is used and a warning printed (only for prompts: training
and the corpus encoding require `regex`).
"""
import argparse
import array
import heapq
import json
import os
import sys
import unicodedata
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_tiny_checkpoint import bytes_to_unicode  # noqa: E402  GPT-2's reversible byte map

try:
    import regex as _re
    HAVE_REGEX = True
except ImportError:  # the GPU machine may lack it: only small prompts are encoded there
    import re as _re
    HAVE_REGEX = False

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# `re` fallback: \p{L} ~ [^\W\d_], \p{N} ~ \d (exact for ASCII text)
PATTERN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\w]?[^\W\d_]+|\d| ?[^\s\w]+[\r\n]*|_+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# The special tokens, in the order they take the top ids of the vocabulary.
# No chat markers (<|start_header_id|>, <|eot_id|>): these are base models, and tessera picks a chat
# template from model_type when the vocabulary has the family's markers.
SPECIALS = ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>"] + [f"<|reserved_{i}|>" for i in range(5)]
EOS, BOS, MASK = SPECIALS[0], SPECIALS[1], SPECIALS[2]

# Prompts whose ids are stored in tokens/meta.json, so that the training machine needs no `regex`.
SAMPLE_PROMPTS = ["Once upon a time", "The meaning of life is", "In the beginning",
                  "Elizabeth said to her sister", "A computer is", "The king of Israel",
                  "It is a truth universally acknowledged"]


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def compile_pattern(require_regex=False):
    if HAVE_REGEX:
        return _re.compile(PATTERN)
    if require_regex:
        raise SystemExit("the `regex` module is needed here: apt-get install python3-regex")
    print("warning: python `regex` module missing; using an approximate pre-tokenizer", file=sys.stderr)
    return _re.compile(PATTERN_RE)


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


# ------------------------------------------------------------------------------------------ train
def train(texts, vocab_size, n_special, min_count=2, log=print):
    """Returns merges [(id_a, id_b, id_new)] and pieces [str] (index = id) for the byte-level BPE."""
    pat = compile_pattern(require_regex=True)
    wc = Counter()
    for t in texts:
        wc.update(pat.findall(unicodedata.normalize("NFC", t)))
    log(f"bpe: {len(wc)} unique pre-tokens, {sum(wc.values())} in all")
    words, freqs = [], []
    for w, c in wc.items():
        b = w.encode("utf-8")
        if len(b) > 1:
            words.append(list(b))
            freqs.append(c)
    del wc
    pieces = [B2U[b] for b in range(256)]
    piece_id = {p: i for i, p in enumerate(pieces)}
    target = vocab_size - n_special
    pair_count = Counter()
    where = {}
    for wi, (w, c) in enumerate(zip(words, freqs)):
        for p in zip(w, w[1:]):
            pair_count[p] += c
            where.setdefault(p, set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(pieces) < target and heap:
        negc, pair = heapq.heappop(heap)
        c = pair_count.get(pair, 0)
        if c != -negc:
            if c > 0:
                heapq.heappush(heap, (-c, pair))
            continue
        if c < min_count:
            break
        a, b = pair
        s = pieces[a] + pieces[b]
        new = piece_id.get(s)
        if new is None:
            new = len(pieces)
            pieces.append(s)
            piece_id[s] = new
        merges.append((a, b, new))
        changed = Counter()
        for wi in where.pop(pair, ()):
            w, f = words[wi], freqs[wi]
            for p in zip(w, w[1:]):
                changed[p] -= f
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                changed[p] += f
                where.setdefault(p, set()).add(wi)
        for p, d in changed.items():
            if d == 0:
                continue
            nc = pair_count[p] + d
            if nc <= 0:
                pair_count.pop(p, None)
            else:
                pair_count[p] = nc
                if d > 0:
                    heapq.heappush(heap, (-nc, p))
        pair_count.pop(pair, None)
        if len(merges) % 500 == 0:
            log(f"bpe: {len(merges)} merges, last {s!r} x{c}")
    return merges, pieces


def tokenizer_json(merges, pieces, vocab_size):
    first_special = vocab_size - len(SPECIALS)
    added = [{"id": first_special + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, s in enumerate(SPECIALS)]
    split = {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False}
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, bl]},
        "post_processor": dict(bl),
        "decoder": dict(bl),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(pieces)},
                  "merges": [f"{pieces[a]} {pieces[b]}" for a, b, _ in merges]},
    }


def tokenizer_config(vocab_size, max_len=512):
    first_special = vocab_size - len(SPECIALS)
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "mask_token": MASK,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(first_special + k): {"content": s, "special": True, "lstrip": False,
                                                           "rstrip": False, "normalized": False,
                                                           "single_word": False}
                                 for k, s in enumerate(SPECIALS)},
    }


# ------------------------------------------------------------------------------------------ use
class Tokenizer:
    """Encoder/decoder of a tokenizer.json written by this script (byte-level BPE)."""

    def __init__(self, path, require_regex=False):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        m = j["model"]
        self.vocab = m["vocab"]
        n = max(self.vocab.values()) + 1
        self.special = {a["content"]: a["id"] for a in j.get("added_tokens", [])}
        self.vocab_size = max([n] + [i + 1 for i in self.special.values()])
        self.pieces = [None] * self.vocab_size
        for p, i in self.vocab.items():
            self.pieces[i] = p
        for s, i in self.special.items():
            self.pieces[i] = s
        self.id_special = {i: s for s, i in self.special.items()}
        self.ranks = {}
        for r, mg in enumerate(m["merges"]):
            a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
            key = (self.vocab[a], self.vocab[b])
            if key not in self.ranks:
                self.ranks[key] = (r, self.vocab[a + b])
        self.pat = None
        self.require_regex = require_regex
        self.cache = {}
        self.special_re = _re.compile("|".join(_re.escape(s) for s in
                                               sorted(self.special, key=len, reverse=True)))

    def encode_word(self, w):
        ids = self.cache.get(w)
        if ids is not None:
            return ids
        syms = list(w.encode("utf-8"))
        ranks = self.ranks
        while len(syms) > 1:
            best, bi = None, -1
            for i in range(len(syms) - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r[0] < best[0]):
                    best, bi = r, i
            if best is None:
                break
            syms[bi:bi + 2] = [best[1]]
        if len(self.cache) < 1_000_000:
            self.cache[w] = syms
        return syms

    def encode(self, text, parse_special=True):
        if self.pat is None:
            self.pat = compile_pattern(self.require_regex)
        out = []
        segs, pos = [], 0
        if parse_special and self.special:
            for m in self.special_re.finditer(text):
                segs.append((text[pos:m.start()], None))
                segs.append((None, self.special[m.group(0)]))
                pos = m.end()
        segs.append((text[pos:], None))
        for seg, sid in segs:
            if sid is not None:
                out.append(sid)
            elif seg:
                for w in self.pat.findall(unicodedata.normalize("NFC", seg)):
                    out.extend(self.encode_word(w))
        return out

    def decode(self, ids, skip_special=False):
        out, buf = [], bytearray()
        for i in ids:
            i = int(i)
            if i in self.id_special:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                if not skip_special:
                    out.append(self.id_special[i])
                continue
            buf.extend(U2B[c] for c in self.pieces[i])
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)


# ------------------------------------------------------------------------------------------ commands
def cmd_train(a):
    import time
    t0 = time.time()
    src = os.path.join(a.data, "corpus", "train.jsonl")
    merges, pieces = train(read_docs(src), a.vocab, len(SPECIALS))
    if len(pieces) < a.vocab - len(SPECIALS):
        raise SystemExit(f"the corpus gave only {len(pieces)} pieces; lower --vocab")
    out = os.path.join(a.data, "tokenizer")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(merges, pieces, a.vocab), f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(a.vocab), f, indent=2)
    print(f"bpe: wrote {out}/tokenizer.json: vocab {a.vocab} = 256 bytes + {len(pieces) - 256} merged pieces "
          f"({len(merges)} merges) + {len(SPECIALS)} special; {time.time() - t0:.0f} s")


def cmd_encode(a):
    import time
    t0 = time.time()
    tok = Tokenizer(os.path.join(a.data, "tokenizer", "tokenizer.json"), require_regex=True)
    bos, eos = tok.special[BOS], tok.special[EOS]
    out = os.path.join(a.data, "tokens")
    os.makedirs(out, exist_ok=True)
    meta = {"vocab_size": tok.vocab_size, "bos_token_id": bos, "eos_token_id": eos,
            "mask_token_id": tok.special[MASK], "pad_token_id": eos,
            "special_tokens": tok.special, "dtype": "uint16",
            "layout": "every document: <|startoftext|> ids <|endoftext|>, concatenated"}
    if tok.vocab_size > 65535:
        raise SystemExit("vocab does not fit uint16")
    for split in ("train", "test"):
        arr = array.array("H")
        n_docs = n_bytes = 0
        for text in read_docs(os.path.join(a.data, "corpus", f"{split}.jsonl")):
            arr.append(bos)
            arr.extend(tok.encode(text, parse_special=False))
            arr.append(eos)
            n_docs += 1
            n_bytes += len(text.encode("utf-8"))
        if sys.byteorder != "little":
            arr.byteswap()
        with open(os.path.join(out, f"{split}.bin"), "wb") as f:
            arr.tofile(f)
        meta[split] = {"tokens": len(arr), "docs": n_docs, "bytes": n_bytes,
                       "bytes_per_token": round(n_bytes / max(1, len(arr) - 2 * n_docs), 3)}
        print(f"encode: {split}: {n_docs} docs, {n_bytes / 1e6:.2f} MB -> {len(arr)} tokens "
              f"({meta[split]['bytes_per_token']} bytes/token); {time.time() - t0:.0f} s", flush=True)
    meta["sample_prompts"] = {p: [bos] + tok.encode(p) for p in SAMPLE_PROMPTS}
    st = os.path.join(a.data, "corpus", "stats.json")
    if os.path.exists(st):  # so that tokens/ + tokenizer/ are all a training machine needs
        with open(st) as f, open(os.path.join(out, "corpus_stats.json"), "w") as g:
            g.write(f.read())
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, ensure_ascii=False)


def cmd_check(a):
    import subprocess
    tok = Tokenizer(os.path.join(a.data, "tokenizer", "tokenizer.json"), require_regex=True)
    lines = []
    for text in read_docs(os.path.join(a.data, "corpus", "test.jsonl")):
        for ln in text.split("\n"):
            if ln.strip() and len(lines) < a.lines:
                lines.append(ln)
    # a few hand-made edge cases: digits, contractions, unicode, odd spacing, specials as text
    lines += ["I'LL be there at 10:45 -- don't wait!", "  two  spaces\tand a tab", "caf\u00e9 na\u00efve \u00c6sir",
              "e\u0301 (decomposed e-acute, NFC makes it one character)", "\u4e2d\u6587 and \U0001f999 emoji",
              "trailing newline\n", "\n\nleading newlines", "x" * 300]
    cases = [{"text": t, "ids": tok.encode(t, parse_special=False)} for t in lines]
    out = os.path.join(a.data, "tokens", "tokenizer_check.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": os.path.join(a.data, "tokenizer", "tokenizer.json"), "cases": cases}, f,
                  ensure_ascii=False)
    bad = [c for c in cases if tok.decode(c["ids"]) != unicodedata.normalize("NFC", c["text"])]
    print(f"check: {len(cases)} lines written to {out}; python round trip failures: {len(bad)}")
    if not a.tessera_build:
        return 0 if not bad else 1
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    build = os.path.abspath(a.tessera_build)
    exe = os.path.join(a.data, "tok_check")
    lib = os.path.join(build, "libtessera_lib.a")
    cmd = ["g++", "-std=c++20", "-O1", "-I", os.path.join(root, "src"), os.path.join(here, "tok_check.cpp"),
           lib, "-lpcre2-8", "-lutf8proc", "-o", exe]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print("check: could not build tok_check.cpp against", lib, "\n", r.stdout[-3000:])
        return 2
    r = subprocess.run([exe, os.path.join(a.data, "tokenizer", "tokenizer.json"), out])
    return r.returncode or (1 if bad else 0)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("train", "encode", "check"):
        p = sub.add_parser(name)
        p.add_argument("--data", default=os.path.join(here, "data"))
        if name == "train":
            p.add_argument("--vocab", type=int, default=4096)
        if name == "check":
            p.add_argument("--tessera-build", default="", help="a tessera build dir (libtessera_lib.a)")
            p.add_argument("--lines", type=int, default=400)
    a = ap.parse_args()
    return {"train": cmd_train, "encode": cmd_encode, "check": cmd_check}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
