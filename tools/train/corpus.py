#!/usr/bin/env python3
"""Builds the English training corpus of the bundled tiny dLLMs from Debian packages.

  /usr/bin/python3 tools/train/corpus.py [--data tools/train/data] [--test-percent 1] [--sources a,b]

Every source is a Debian package (bookworm, main) with public-domain or freely licensed English text.
The packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x` into DATA/pkgs/,
so nothing is installed system-wide and no dependency (R, dictd, SWORD) is needed: the few binary
formats (R's lazy-load database, SWORD zText/zCom modules, dictd .dict.dz) are read here in Python.
If `apt-get download` finds no package, `apt-get update` is run once (that needs root or sudo).

Output (DATA/corpus/):
  train.jsonl, test.jsonl   one document per line: {"src": source, "text": cleaned text}
  stats.json                per source: package, version, licence, documents, bytes, words
  DATA/licences/PKG.copyright  each package's /usr/share/doc/PKG/copyright

Cleaning: NFC; typographic quotes -> ASCII quotes, em/en dashes -> "--"/"-", no-break spaces ->
spaces, control characters dropped; hard-wrapped lines unwrapped into paragraphs (paragraphs are
separated by a blank line); markup (OSIS, Gutenberg _italics_) removed. Dedup: a paragraph of at
least 30 characters seen before (case- and space-insensitive) is dropped; a document left empty is
dropped. Split: a document goes to test when sha1(text) mod 100 < --test-percent (deterministic).
"""
import argparse
import gzip
import hashlib
import html
import json
import os
import re
import struct
import subprocess
import sys
import unicodedata
import zlib

# name: (packages, licence as stated in /usr/share/doc/PKG/copyright, description)
SOURCES = {
    "austen": (["r-cran-janeaustenr"],
               "texts public domain (Jane Austen, 1811-1818); R package MIT (Julia Silge)",
               "Jane Austen's six novels"),
    "web": (["sword-text-web"], "public domain", "World English Bible (modern English translation)"),
    "kjv": (["sword-text-kjv"], "public domain", "King James Version of the Bible"),
    "mhcc": (["sword-comm-mhcc"], "public domain", "Matthew Henry's Concise Commentary"),
    "tdavid": (["sword-comm-tdavid"], "public domain", "C. H. Spurgeon's Treasury of David"),
    "scofield": (["sword-comm-scofield"], "public domain", "Scofield Reference Notes (1917)"),
    "devil": (["dict-devil"], "public domain", "Ambrose Bierce, The Devil's Dictionary"),
    "jargon": (["jargon-text"], "public domain", "The Jargon File 4.4.7"),
    "fortunes": (["fortunes", "fortunes-min"], "BSD-3-Clause (fortune-mod data files)",
                 "fortune cookie quotations (non-offensive English files)"),
    "wordnet": (["wordnet-base"], "WordNet 3.0 licence (permissive, BSD-like)",
                "WordNet 3.0 glosses of the synsets that have example sentences"),
}

# Fortune files left out: not prose (ascii-art, perl, linux, computers...) or not English.
FORTUNE_FILES = ["art", "cookie", "definitions", "education", "food", "fortunes", "goedel", "humorists",
                 "kids", "law", "literature", "love", "magic", "medicine", "miscellaneous", "news",
                 "paradoxum", "people", "pets", "platitudes", "politics", "riddles", "science",
                 "songs-poems", "sports", "wisdom", "work"]


# ------------------------------------------------------------------------------------------ fetch
def run(cmd, cwd=None):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fetch(pkg, data):
    """Unpacks PKG's .deb into DATA/pkgs/PKG and returns (root dir, version)."""
    root = os.path.join(data, "pkgs", pkg)
    debs = os.path.join(data, "debs")
    os.makedirs(debs, exist_ok=True)
    have = [f for f in os.listdir(debs) if f.startswith(pkg + "_") and f.endswith(".deb")]
    if not have:
        r = run(["apt-get", "download", pkg], cwd=debs)
        if r.returncode != 0:
            sudo = [] if os.geteuid() == 0 else ["sudo"]
            print(f"apt-get download {pkg} failed ({r.stderr.strip()[:200]}); running apt-get update")
            subprocess.run(sudo + ["apt-get", "update", "-qq"], check=False)
            r = run(["apt-get", "download", pkg], cwd=debs)
            if r.returncode != 0:
                raise SystemExit(f"cannot download Debian package {pkg}: {r.stderr.strip()}")
        have = [f for f in os.listdir(debs) if f.startswith(pkg + "_") and f.endswith(".deb")]
    deb = sorted(have)[-1]
    version = deb[len(pkg) + 1:-len(".deb")].rsplit("_", 1)[0].replace("%3a", ":")
    if not os.path.isdir(root):
        os.makedirs(root)
        subprocess.run(["dpkg-deb", "-x", os.path.join(debs, deb), root], check=True)
    lic_dir = os.path.join(data, "licences")
    os.makedirs(lic_dir, exist_ok=True)
    cp = os.path.join(root, "usr/share/doc", pkg, "copyright")
    if os.path.exists(cp):
        with open(cp, "rb") as f, open(os.path.join(lic_dir, pkg + ".copyright"), "wb") as g:
            g.write(f.read())
    return root, version


# ------------------------------------------------------------------------------------------ text
QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
                        "\u2014": "--", "\u2013": "-", "\u2012": "-", "\u2010": "-", "\u2011": "-",
                        "\u00a0": " ", "\u2009": " ", "\u200a": " ", "\u2002": " ", "\u2003": " ",
                        "\u2026": "...", "\u00ad": None, "\u200b": None, "\ufeff": None,
                        "\t": " ", "\r": None})
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_paragraph(p):
    p = unicodedata.normalize("NFC", p).translate(QUOTES)
    p = CONTROL.sub("", p)
    p = re.sub(r" *\n *", "\n", p)
    p = re.sub(r" {2,}", " ", p)
    return p.strip()


def unwrap(text):
    """Hard-wrapped text -> paragraphs (lists of lines joined with spaces), split at blank lines."""
    paras = []
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [ln.strip() for ln in block.split("\n") if ln.strip()]
        if lines:
            paras.append(" ".join(lines))
    return paras


def doc_from_paragraphs(paras):
    out = [clean_paragraph(p) for p in paras]
    return "\n\n".join(p for p in out if p)


def split_long(paras, limit=6000):
    """Groups paragraphs into documents of at most ~limit characters (a paragraph is never cut)."""
    docs, cur, n = [], [], 0
    for p in paras:
        if cur and n + len(p) > limit:
            docs.append(cur)
            cur, n = [], 0
        cur.append(p)
        n += len(p) + 2
    if cur:
        docs.append(cur)
    return docs


# ------------------------------------------------------------------------------------------ R data
class RReader:
    """Minimal reader of R's XDR serialization (format 2 and 3): enough for character vectors."""

    def __init__(self, buf):
        self.b, self.i, self.refs = buf, 0, []

    def int(self):
        v = struct.unpack_from(">i", self.b, self.i)[0]
        self.i += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def header(self):
        if self.b[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.i = 2
        version = self.int()
        self.int()
        self.int()
        if version == 3:
            n = self.int()
            self.i += n

    def item(self):
        flags = self.int()
        t, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if t in (254, 242, 253, 251, 241, 247, 252):  # NILVALUE, EMPTYENV, GLOBALENV, ...
            return None
        if t == 255:  # REFSXP
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            name = self.item()
            self.refs.append(name)
            return name
        if t in (2, 239, 6, 240):  # LISTSXP, ATTRLISTSXP, LANGSXP, ATTRLANGSXP
            out = {}
            attr = self.item() if has_attr else None
            del attr
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            out[tag] = car
            if isinstance(cdr, dict):
                out.update(cdr)
            return out
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.b[self.i:self.i + n].decode("utf-8", "replace")
            self.i += n
            return s
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self.length()
            v = struct.unpack_from(f">{n}i", self.b, self.i)
            self.i += 4 * n
        elif t == 14:  # REALSXP
            n = self.length()
            v = struct.unpack_from(f">{n}d", self.b, self.i)
            self.i += 8 * n
        elif t in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
            n = self.length()
            v = [self.item() for _ in range(n)]
        else:
            raise ValueError(f"unsupported R SEXP type {t}")
        if has_attr:
            attrs = self.item()
            names = attrs.get("names") if isinstance(attrs, dict) else None
            if t == 19 and isinstance(names, list) and len(names) == len(v):
                return dict(zip(names, v))
        return v


def r_object(buf):
    r = RReader(buf)
    r.header()
    return r.item()


def r_lazyload(rdb, rdx):
    """{name: object} of an R lazy-load database (R/ or data/ *.rdb + *.rdx)."""
    with open(rdx, "rb") as f:
        raw = f.read()
    idx = r_object(zlib.decompress(raw[4:]) if raw[:2] != b"\x1f\x8b" else gzip.decompress(raw))
    with open(rdb, "rb") as f:
        db = f.read()
    out = {}
    for name, (off, n) in idx["variables"].items():
        blob = db[off:off + n]
        ctype = blob[4:5]
        if ctype == b"Z":
            data = zlib.decompress(blob[5:])
        elif ctype in (b"2", b"X", b"0"):
            import bz2
            import lzma
            data = {b"2": bz2.decompress, b"X": lzma.decompress, b"0": lambda x: x}[ctype](blob[5:])
        else:
            data = zlib.decompress(blob[4:])
        out[name] = r_object(data)
    return out


def src_austen(root):
    base = os.path.join(root, "usr/lib/R/site-library/janeaustenr/data/Rdata")
    objs = r_lazyload(base + ".rdb", base + ".rdx")
    docs = []
    for name in sorted(objs):
        lines = objs[name]
        if not isinstance(lines, list) or not all(isinstance(x, (str, type(None))) for x in lines):
            continue
        text = "\n".join(x or "" for x in lines)
        text = re.sub(r"_([^_]+)_", r"\1", text)  # Gutenberg _italics_
        # chapters: "CHAPTER 1", "Chapter 1", "CHAPTER I" headings start a new document
        parts = re.split(r"\n\s*(?:CHAPTER|Chapter) [0-9IVXLC]+\.?\s*\n", text)
        for part in parts[1:] if len(parts) > 1 else parts:
            paras = [p for p in unwrap(part) if not re.fullmatch(r"(VOLUME|Volume) [0-9IVX]+\.?", p)
                     and p.strip() not in ("THE END", "FINIS")]
            for d in split_long(paras):
                docs.append(doc_from_paragraphs(d))
    return docs


# ------------------------------------------------------------------------------------------ SWORD
def sword_entries(moddir):
    """Entries of a SWORD zText/zCom/zCom4 module in index order, linked duplicates skipped."""
    out = []
    for testament in ("ot", "nt"):
        for ext, vsz in (("b", 10), ("c", 12)):
            vpath = os.path.join(moddir, f"{testament}.{ext}zv")
            if os.path.exists(vpath):
                break
        else:
            continue
        with open(os.path.join(moddir, f"{testament}.{ext}zs"), "rb") as f:
            s = f.read()
        with open(vpath, "rb") as f:
            v = f.read()
        with open(os.path.join(moddir, f"{testament}.{ext}zz"), "rb") as f:
            z = f.read()
        blocks = [struct.unpack_from("<III", s, i) for i in range(0, len(s) - 11, 12)]
        cache, seen = {}, set()
        for i in range(0, len(v) - vsz + 1, vsz):
            b, o, n = struct.unpack_from("<IIH" if vsz == 10 else "<III", v, i)
            if n == 0 or (b, o, n) in seen or b >= len(blocks):
                continue
            seen.add((b, o, n))
            if b not in cache:
                off, sz, _ = blocks[b]
                cache = {b: zlib.decompress(z[off:off + sz])}  # entries come in block order
            out.append(cache[b][o:o + n].decode("utf-8", "replace"))
    return out


OSIS_DROP = re.compile(r"<(note|title|rdg)\b[^>]*?(?<!/)>.*?</\1>", re.S)
OSIS_BREAK = re.compile(r"<(?:div|p|lb|lg|l|list|item|milestone)\b[^>]*>|</(?:p|l|lg|item)>")
CHAPTER = re.compile(r"<chapter\b[^>]*\bsID=|<div\b[^>]*\btype=\"book\"")


def osis_text(x):
    x = OSIS_DROP.sub(" ", x)
    x = OSIS_BREAK.sub("\n\n", x)
    x = re.sub(r"<[^>]+>", "", x)
    return html.unescape(x)


def src_sword(root, kind):
    moddirs = []
    for sub in ("texts/ztext", "comments/zcom"):
        d = os.path.join(root, "usr/share/sword/modules", sub)
        if os.path.isdir(d):
            moddirs += [os.path.join(d, m) for m in sorted(os.listdir(d))]
    docs = []
    for md in moddirs:
        cur = []
        for e in sword_entries(md) + ["<chapter sID=\"end\"/>"]:
            if CHAPTER.search(e):
                text = "\n".join(cur)
                paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
                paras = [p for p in paras if len(p) > 1 and not re.fullmatch(r"[\d\s:.,;()-]*", p)]
                if kind == "comm":  # commentary headings like "Verses 1-12" carry nothing
                    paras = [p for p in paras if not re.fullmatch(r"(Verses?|Ver\.) [\d\s,-]+\.?", p)]
                for d in split_long(paras):
                    docs.append(doc_from_paragraphs(d))
                cur = []
            cur.append(osis_text(e))
    return docs


def src_bible(root):
    """Verses of one chapter flow together; OSIS paragraph marks give the paragraph breaks."""
    return src_sword(root, "text")


def src_comm(root):
    return src_sword(root, "comm")


# ------------------------------------------------------------------------------------------ others
def dictd_entries(root, name):
    d = os.path.join(root, "usr/share/dictd")
    with gzip.open(os.path.join(d, name + ".dict.dz"), "rb") as f:
        body = f.read()
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def num(s):
        v = 0
        for c in s:
            v = v * 64 + b64.index(c)
        return v

    out = []
    with open(os.path.join(d, name + ".index"), encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00database"):
                continue
            off, n = num(parts[1]), num(parts[2])
            out.append((off, body[off:off + n].decode("utf-8", "replace")))
    out.sort()
    return [t for _, t in out]


def src_devil(root):
    docs, group = [], []
    for e in dictd_entries(root, "devil"):
        lines = e.split("\n")
        # the first line repeats the headword; the body is hard-wrapped with indented verse
        body = "\n".join(lines[1:]) if len(lines) > 1 and lines[0].strip().isupper() else e
        paras = unwrap(re.sub(r"\{([^{}]*)\}", r"\1", body))  # {cross references}
        if paras:
            group.append(doc_from_paragraphs(paras))
        if sum(len(g) for g in group) > 3000:
            docs.append("\n\n".join(group))
            group = []
    if group:
        docs.append("\n\n".join(group))
    return docs


def src_jargon(root):
    with gzip.open(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz"), "rt",
                   encoding="utf-8", errors="replace") as f:
        text = f.read()
    # skip the table of contents: the body starts at the second "Chapter 1." heading
    starts = [m.start() for m in re.finditer(r"\nChapter 1\. ", text)]
    text = text[starts[1] if len(starts) > 1 else 0:]
    text = re.sub(r"\{([^{}]*)\}", r"\1", text)  # {cross references}
    paras = []
    for p in unwrap(text):
        m = re.fullmatch(r":([^:]+):\s*(.*)", p)
        if m:  # ":term: n." -> "term, n."
            p = m.group(1) + (", " + m.group(2) if m.group(2) else "")
        elif len(p) < 40 and not re.search(r"[.!?:]$", p):
            continue  # headings and left-over index lines
        if set(p) <= set("═─━-=_ "):
            continue
        paras.append(p)
    return [doc_from_paragraphs(d) for d in split_long(paras, 3000)]


def src_fortunes(root):
    docs = []
    d = os.path.join(root, "usr/share/games/fortunes")
    for name in FORTUNE_FILES:
        p = os.path.join(d, name)
        if not os.path.exists(p):
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for cookie in re.split(r"\n%\n", text):
            lines = [ln.rstrip() for ln in cookie.strip("\n%").split("\n")]
            if not any(ln.strip() for ln in lines):
                continue
            # keep the cookie's own line structure (poems, attributions); drop indentation
            docs.append(clean_paragraph("\n".join(ln.strip() for ln in lines)))
    return docs


def src_wordnet(root):
    d = os.path.join(root, "usr/share/wordnet")
    pos_name = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}
    entries = []
    for f in ("data.noun", "data.verb", "data.adj", "data.adv"):
        with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("  ") or "|" not in line:
                    continue
                head, gloss = line.split("|", 1)
                fields = head.split()
                pos, n = fields[2], int(fields[3], 16)
                words = [fields[4 + 2 * k].replace("_", " ") for k in range(n)]
                words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]
                gloss = gloss.strip()
                parts = [g.strip() for g in gloss.split(";")]
                defs = [g for g in parts if not g.startswith('"')]
                exs = [g.strip('" ') for g in parts if g.startswith('"')]
                definition = "; ".join(defs).strip()
                if not definition or not exs:  # only synsets with example sentences: less list, more prose
                    continue
                s = f"{', '.join(words)} ({pos_name.get(pos, pos)}): {definition}."
                if exs:
                    s += " For example: " + " ".join(e.rstrip(".") + "." for e in exs[:3])
                entries.append((words[0].lower(), s))
    entries.sort()
    docs = []
    for k in range(0, len(entries), 25):
        docs.append("\n".join(clean_paragraph(s) for _, s in entries[k:k + 25]))
    return docs


EXTRACT = {"austen": src_austen, "web": src_bible, "kjv": src_bible, "mhcc": src_comm,
           "tdavid": src_comm, "scofield": src_comm, "devil": src_devil, "jargon": src_jargon,
           "fortunes": src_fortunes, "wordnet": src_wordnet}


# ------------------------------------------------------------------------------------------ main
def norm_key(p):
    return re.sub(r"\W+", " ", p.lower()).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--data", default=os.path.join(here, "data"))
    ap.add_argument("--test-percent", type=float, default=1.0)
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of " +
                    ",".join(SOURCES))
    a = ap.parse_args()
    names = [s for s in a.sources.split(",") if s]
    for s in names:
        if s not in SOURCES:
            raise SystemExit(f"unknown source {s}; known: {', '.join(SOURCES)}")
    out_dir = os.path.join(a.data, "corpus")
    os.makedirs(out_dir, exist_ok=True)
    seen = set()
    stats = {}
    n_test = 0
    with open(os.path.join(out_dir, "train.jsonl"), "w", encoding="utf-8") as ftr, \
            open(os.path.join(out_dir, "test.jsonl"), "w", encoding="utf-8") as fte:
        for name in names:
            pkgs, licence, desc = SOURCES[name]
            roots, versions = [], []
            for p in pkgs:
                r, v = fetch(p, a.data)
                roots.append(r)
                versions.append(f"{p} {v}")
            docs = []
            for r in roots:
                try:
                    docs += EXTRACT[name](r)
                except FileNotFoundError:
                    if r == roots[0]:
                        raise
            st = {"packages": versions, "licence": licence, "description": desc, "docs": 0,
                  "bytes": 0, "words": 0, "test_docs": 0, "test_bytes": 0, "dropped_dup_paragraphs": 0}
            for doc in docs:
                kept = []
                for para in doc.split("\n\n"):
                    k = norm_key(para)
                    if len(k) >= 30:
                        if k in seen:
                            st["dropped_dup_paragraphs"] += 1
                            continue
                        seen.add(k)
                    kept.append(para)
                text = "\n\n".join(kept).strip()
                if len(text) < 20:
                    continue
                h = int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:8], 16)
                is_test = (h % 10000) < a.test_percent * 100
                line = json.dumps({"src": name, "text": text}, ensure_ascii=False) + "\n"
                (fte if is_test else ftr).write(line)
                nb = len(text.encode("utf-8"))
                st["docs"] += 1
                st["bytes"] += nb
                st["words"] += len(text.split())
                if is_test:
                    st["test_docs"] += 1
                    st["test_bytes"] += nb
                    n_test += 1
            stats[name] = st
            print(f"{name:9s} {st['docs']:7d} docs {st['bytes'] / 1e6:7.2f} MB {st['words'] / 1e6:6.2f} M words"
                  f"  test {st['test_docs']:4d} docs  dup paragraphs dropped {st['dropped_dup_paragraphs']:5d}"
                  f"  [{', '.join(versions)}; {licence}]", flush=True)
    tot = {k: sum(s[k] for s in stats.values()) for k in ("docs", "bytes", "words", "test_docs", "test_bytes")}
    print(f"{'total':9s} {tot['docs']:7d} docs {tot['bytes'] / 1e6:7.2f} MB {tot['words'] / 1e6:6.2f} M words"
          f"  test {tot['test_docs']} docs ({tot['test_bytes'] / 1e6:.2f} MB)")
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump({"sources": stats, "total": tot, "test_percent": a.test_percent,
                   "split": "sha1(text)[:8] as int mod 10000 < test_percent*100 -> test"}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
