"""Build the benchmark corpora from real text and speech found on this machine (offline).

    python bench/data.py [--data-dir DIR] [--clips N] [--force]

Text: rows of ``{"source", "id", "text", "summary"}`` (``text`` is the input, ``summary`` the
target), combined from

* Debian package descriptions (``/var/lib/apt/lists/*Translation-en*``: the long description as
  input, the one-line synopsis as target; as root, ``apt-get update -o Acquire::Languages=en`` is
  run once when those lists are missing, Docker images switch them off);
* man pages (``/usr/share/man/man*/*.gz``, English only, ``.so`` redirects and links skipped, roff
  stripped: the page as input, its NAME line as target);
* docstrings of this Python's standard library (``lengthscan.demo.docstring_rows``), and of
  site-packages only if the rows are still under ``--min-rows``,

shuffled with a fixed seed. Written as JSONL, Parquet and ``save_to_disk``, full size and a
``quick`` prefix, each also 10x (the rows repeated 10 times) as Parquet and ``save_to_disk`` for
the scaling lines (Parquet in row groups of 1,000 rows, as ``Dataset.to_parquet`` writes). A
byte-level BPE tokenizer (``lengthscan.demo.train_bpe_tokenizer``) is trained on a sample of the rows.

Speech: espeak-ng reads sentences of the corpus (several voices, speeds and pitches, a long tail of
lengths) into WAV (22.05 kHz), then soundfile writes FLAC (resampled to 16 kHz), OGG Vorbis and MP3
copies; a ``manifest.csv`` (``path``, ``text``) lists every file, and ``audio_disk/`` holds the same
clips as bytes in Arrow (``datasets.Audio(decode=False)``: ``{bytes, path}``).

Everything goes under ``--data-dir`` (default ``~/.cache/lengthscan-bench``) with a
``meta.json`` describing it; ``bench/run.py`` reads that.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("LENGTHSCAN_BENCH_DATA", Path.home() / ".cache" / "lengthscan-bench"))
QUICK_ROWS = 10_000
SCALE = 10
SEED = 0
ROW_GROUP = 1_000  # rows per Parquet row group, as Dataset.to_parquet writes them
DATA_VERSION = 2  # bump when what is built changes: older data is rebuilt

# ----------------------------------------------------------------------------- Debian descriptions


def _translation_files() -> list[str]:
    return sorted(glob.glob("/var/lib/apt/lists/*_i18n_Translation-en*"))


def _apt_cat(path: str) -> str:
    """Decompress an apt list file whatever its compression (apt-helper knows them all)."""
    out = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], capture_output=True, check=True)
    return out.stdout.decode("utf-8", errors="replace")


def _ensure_translations() -> list[str]:
    files = _translation_files()
    if files or os.geteuid() != 0 or not shutil.which("apt-get"):
        return files
    print("  no Translation-en lists: apt-get update -o Acquire::Languages=en", file=sys.stderr, flush=True)
    subprocess.run(["apt-get", "update", "-qq", "-o", "Acquire::Languages=en"], check=False,
                   stdout=subprocess.DEVNULL)
    return _translation_files()


def _debian_stanzas(text: str):
    """Yield (package, synopsis, long description) from a Translation-en or dpkg status file."""
    for stanza in text.split("\n\n"):
        package = re.search(r"^Package: (.+)$", stanza, re.MULTILINE)
        desc = re.search(r"^Description(?:-en)?: (.*)\n((?: .*\n?)*)", stanza, re.MULTILINE)
        if not package or not desc:
            continue
        lines = [line[1:] for line in desc.group(2).splitlines()]
        body = "\n".join("" if line == "." else line for line in lines).strip()
        if body:
            yield package.group(1).strip(), desc.group(1).strip(), body


def debian_rows():
    """One row per package with a long description (Translation-en lists, else dpkg status)."""
    files = _ensure_translations()
    texts = [_apt_cat(f) for f in files] if files else []
    if not texts and os.path.exists("/var/lib/dpkg/status"):
        texts = [Path("/var/lib/dpkg/status").read_text(encoding="utf-8", errors="replace")]
    seen = set()
    for text in texts:
        for package, synopsis, body in _debian_stanzas(text):
            if package in seen:
                continue
            seen.add(package)
            yield {"source": "debian", "id": package, "text": body, "summary": synopsis}


# ----------------------------------------------------------------------------------------- man pages

_TEXT_MACROS = {
    "B", "I", "BR", "BI", "IR", "RB", "IB", "RI", "SM", "SB", "SH", "SS", "IP", "UR", "MT",
    # mdoc
    "Nm", "Nd", "Fl", "Ar", "Op", "Pa", "Xr", "Em", "Sy", "Li", "Cm", "Dl", "Sh", "Ss", "It", "Va",
    "Ev", "Fa", "Fn", "Ft", "Dv", "Er", "Ic", "Ql", "Dq", "Sq", "Pq", "Aq", "Tn", "No", "Ns", "D1",
}
_BREAK_MACROS = {"PP", "P", "LP", "TP", "Pp", "sp", "br", "Bl", "El", "SH", "SS", "Sh", "Ss", "IP", "It"}
_GLYPHS = {"em": "\u2014", "en": "\u2013", "aq": "'", "lq": "\u201c", "rq": "\u201d", "oq": "\u2018",
           "cq": "\u2019", "dq": '"', "bu": "\u2022", "co": "\u00a9", "mu": "\u00d7", "ti": "~",
           "ha": "^", "rs": "\\", "ga": "`", "hy": "-", "at": "@", "sh": "#", "Fo": "\u00ab", "Fc": "\u00bb"}
_ESCAPES = [
    (re.compile(r"\\\[(\w\w)\]|\\\((\w\w)"), lambda m: _GLYPHS.get(m.group(1) or m.group(2), "")),
    (re.compile(r"\\[fF](\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\s[+-]?\d+|\\s\[[^\]]*\]"), ""),
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\[nk](\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\[&%/,|^c:)]"), ""),
    (re.compile(r"\\[-e]"), lambda m: "-" if m.group(0) == "\\-" else "\\"),
    (re.compile(r"\\(.)"), r"\1"),
]


def _unescape(line: str) -> str:
    for pattern, repl in _ESCAPES:
        line = pattern.sub(repl, line)
    return line


def _macro_args(rest: str) -> str:
    return " ".join(a.strip('"') for a in re.findall(r'"[^"]*"|\S+', rest))


def strip_roff(source: str) -> tuple[str, str]:
    """(plain text, NAME section) of a man page, with roff requests and escapes removed."""
    out: list[str] = []
    name: list[str] = []
    in_name = False
    skip_until = None  # the end of a macro definition (..) or a conditional block (\})
    for raw in source.splitlines():
        if skip_until:
            if raw.startswith(skip_until) or (skip_until == "\\}" and "\\}" in raw):
                skip_until = None
            continue
        if re.match(r"[.'](de|de1|am|ig)\b", raw):
            skip_until = ".."
            continue
        if raw.startswith((".", "'")) and "\\{" in raw and "\\}" not in raw:
            skip_until = "\\}"
            continue
        if raw.startswith(('.\\"', "'\\\"", '.\\\\"')) or raw.strip() in {".", "'"}:
            continue
        if raw.startswith((".", "'")):
            macro, _, rest = raw[1:].strip().partition(" ")
            if macro in {"SH", "Sh"}:
                in_name = rest.strip().strip('"').upper() == "NAME"
            if macro in _BREAK_MACROS:
                out.append("")
            if macro not in _TEXT_MACROS:
                continue
            line = _macro_args(rest)
        else:
            line = raw
        line = _unescape(line)
        out.append(line)
        if in_name and not raw.startswith((".SH", ".Sh")):
            name.append(line)
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()
    return text, " ".join(" ".join(name).split())


def man_rows():
    """One row per English man page (links, ``.so`` redirects and exact duplicates skipped)."""
    seen = set()
    for path in sorted(glob.glob("/usr/share/man/man*/*.gz")):
        if os.path.islink(path):
            continue
        try:
            source = gzip.decompress(Path(path).read_bytes()).decode("utf-8", errors="replace")
        except (OSError, EOFError):
            continue
        if re.match(r"\s*\.so\s", source[:200]):
            continue
        text, name = strip_roff(source)
        digest = hashlib.sha1(text.encode()).digest()
        if not text or not name or digest in seen:
            continue
        seen.add(digest)
        yield {"source": "man", "id": os.path.basename(path)[:-3], "text": text, "summary": name}


# ---------------------------------------------------------------------------------------- docstrings


def docstring_rows(site_packages: bool = False):
    """Rows from the standard library's docstrings (or site-packages', as a last resort)."""
    import sysconfig

    from lengthscan.demo import docstring_rows as rows

    root = sysconfig.get_paths()["purelib" if site_packages else "stdlib"]
    source = "site-packages" if site_packages else "stdlib"
    for row in rows(root):
        yield {"source": source, "id": f"{row['module']}:{row['name']}", "text": row["docstring"],
               "summary": row["summary"]}


def text_rows(min_rows: int) -> list[dict]:
    """Every source combined (site-packages docstrings only when short of ``min_rows``), shuffled."""
    rows: list[dict] = []
    for name, gen in (("debian", debian_rows), ("man", man_rows), ("stdlib", docstring_rows)):
        t0 = time.perf_counter()
        got = list(gen())
        print(f"  {name}: {len(got):,} rows ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        rows += got
    if len(rows) < min_rows:
        got = list(docstring_rows(site_packages=True))
        print(f"  site-packages docstrings: {len(got):,} rows", file=sys.stderr, flush=True)
        rows += got
    random.Random(SEED).shuffle(rows)
    return rows


# ------------------------------------------------------------------------------------------ writing


def write_jsonl(rows: list[dict], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    os.replace(tmp, path)


def write_copies(rows: list[dict], folder: Path) -> None:
    """corpus.jsonl, corpus.parquet, corpus_disk/ and their 10x Parquet / save_to_disk versions."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(rows, folder / "corpus.jsonl")
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, folder / "corpus.parquet", row_group_size=ROW_GROUP)
    big = pa.concat_tables([table] * SCALE)
    pq.write_table(big, folder / f"corpus{SCALE}x.parquet", row_group_size=ROW_GROUP)
    for name, tab in (("corpus_disk", table), (f"corpus{SCALE}x_disk", big)):
        shutil.rmtree(folder / name, ignore_errors=True)
        datasets.Dataset(tab).save_to_disk(str(folder / name))


def train_tokenizer(rows: list[dict], out: Path) -> None:
    from lengthscan.demo import train_bpe_tokenizer

    sample = random.Random(SEED).sample(rows, min(len(rows), 20_000))
    texts = [r["text"] for r in sample] + [r["summary"] for r in sample]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    train_bpe_tokenizer(texts, tmp, vocab_size=16_000, model_max_length=1024)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def describe_text(rows: list[dict], tokenizer: Path) -> dict:
    """Row counts by source and token-length percentiles (input and target), for the table header."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    desc = {"rows": len(rows), "sources": {}, "chars": sum(len(r["text"]) + len(r["summary"]) for r in rows)}
    for r in rows:
        desc["sources"][r["source"]] = desc["sources"].get(r["source"], 0) + 1
    for col in ("text", "summary"):
        n = np.array([len(e.ids) for e in tok.encode_batch_fast([r[col] for r in rows])])
        desc[f"{col}_tokens"] = {p: int(np.percentile(n, q, method="inverted_cdf"))
                                 for p, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9))}
        desc[f"{col}_tokens"].update(max=int(n.max()), mean=round(float(n.mean()), 1), total=int(n.sum()))
    return desc


# ---------------------------------------------------------------------------------------------- speech

_VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us+f3", "en-gb+f2", "en-us+m3"]


def _sentences(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        s = " ".join(r["summary"].split())
        if 20 <= len(s) <= 200 and s.isascii():
            out.append(s.rstrip(".") + ".")
    return out


def _clip_text(rng: random.Random, sentences: list[str]) -> str:
    # long-tailed: most clips one or two sentences, a few dozens (up to ~2 minutes of speech)
    k = min(40, max(1, int(rng.paretovariate(1.5))))
    return " ".join(rng.choice(sentences) for _ in range(k))


def build_speech(rows: list[dict], folder: Path, clips: int) -> dict:
    """espeak-ng WAVs plus FLAC (16 kHz), OGG and MP3 copies, a manifest and an Arrow bytes copy."""
    import librosa
    import soundfile as sf

    rng = random.Random(SEED)
    sentences = _sentences(rows)
    shutil.rmtree(folder, ignore_errors=True)
    for fmt in ("wav", "flac", "ogg", "mp3"):
        (folder / fmt).mkdir(parents=True)
    manifest = []
    for i in range(clips):
        text = _clip_text(rng, sentences)
        voice, speed, pitch = rng.choice(_VOICES), rng.randint(120, 240), rng.randint(20, 80)
        wav = folder / "wav" / f"clip{i:04d}.wav"
        # the text on stdin: one that starts with "-" would be read as an option (and write no file)
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(wav), "--stdin"],
                       input=text.encode(), check=True, capture_output=True)
        audio, sr = sf.read(wav, dtype="float32")
        _write(folder / "flac" / f"clip{i:04d}.flac", librosa.resample(audio, orig_sr=sr, target_sr=16000),
               16000, "FLAC", "PCM_16")
        _write(folder / "ogg" / f"clip{i:04d}.ogg", audio, sr, "OGG", "VORBIS")
        _write(folder / "mp3" / f"clip{i:04d}.mp3", audio, sr, "MP3", "MPEG_LAYER_III")
        manifest += [(f"{fmt}/clip{i:04d}.{fmt}", text) for fmt in ("wav", "flac", "ogg", "mp3")]
    _write_manifest(manifest, folder)
    _write_audio_disk(manifest, folder)
    return _describe_speech(manifest, folder)


def _write(path: Path, audio, sr: int, fmt: str, subtype: str) -> None:
    # one second a write: libsndfile 1.2.2's Vorbis encoder segfaults on one ~2.5M-frame write
    import soundfile as sf

    with sf.SoundFile(path, "w", sr, 1, format=fmt, subtype=subtype) as f:
        for start in range(0, len(audio), sr):
            f.write(audio[start:start + sr])


def _write_manifest(manifest: list[tuple[str, str]], folder: Path) -> None:
    import csv

    with open(folder / "manifest.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "text"])
        w.writerows(manifest)


def _write_audio_disk(manifest: list[tuple[str, str]], folder: Path) -> None:
    import datasets

    data = {"audio": [{"bytes": (folder / p).read_bytes(), "path": os.path.basename(p)} for p, _ in manifest],
            "text": [t for _, t in manifest]}
    # cast, not features=: encoding through Audio needs torchcodec in datasets 5; the cast does not
    ds = datasets.Dataset.from_dict(data).cast_column("audio", datasets.Audio(decode=False))
    ds.save_to_disk(str(folder / "audio_disk"))


def _describe_speech(manifest: list[tuple[str, str]], folder: Path) -> dict:
    import numpy as np
    import soundfile as sf

    secs = np.array([sf.info(str(folder / p)).duration for p, _ in manifest if p.startswith("wav/")])
    size = sum((folder / p).stat().st_size for p, _ in manifest)
    return {"files": len(manifest), "clips": len(secs), "formats": ["wav", "flac", "ogg", "mp3"],
            "bytes": size, "seconds_total": round(float(secs.sum()), 1),
            "seconds": {"p50": round(float(np.median(secs)), 1), "p90": round(float(np.percentile(secs, 90)), 1),
                        "max": round(float(secs.max()), 1)}}


# ------------------------------------------------------------------------------------------------ main


def build(data_dir: Path, *, clips: int, min_rows: int, force: bool) -> dict:
    """Build everything that is missing (or everything with ``force``); return meta.json's content."""
    meta_path = data_dir / "meta.json"
    if meta_path.exists() and not force:
        meta = json.loads(meta_path.read_text())
        if (meta.get("clips_requested"), meta.get("min_rows"), meta.get("version")) == (clips, min_rows, DATA_VERSION):
            print(f"data already built in {data_dir} (--force rebuilds)", file=sys.stderr)
            return meta
    import datasets

    datasets.disable_progress_bars()
    data_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print("text rows:", file=sys.stderr, flush=True)
    rows = text_rows(min_rows)
    print(f"  total {len(rows):,} rows; tokenizer ...", file=sys.stderr, flush=True)
    train_tokenizer(rows, data_dir / "tokenizer")
    print("  writing JSONL / Parquet / save_to_disk (1x and 10x) ...", file=sys.stderr, flush=True)
    write_copies(rows, data_dir / "text" / "full")
    write_copies(rows[:QUICK_ROWS], data_dir / "text" / "quick")
    meta = {"version": DATA_VERSION, "min_rows": min_rows, "clips_requested": clips, "scale": SCALE,
            "parquet_row_group": ROW_GROUP,
            "text": {"full": describe_text(rows, data_dir / "tokenizer"),
                     "quick": describe_text(rows[:QUICK_ROWS], data_dir / "tokenizer")}}
    print(f"speech: {clips} espeak-ng clips x 4 formats ...", file=sys.stderr, flush=True)
    meta["speech"] = build_speech(rows, data_dir / "speech", clips)
    meta["build_seconds"] = round(time.perf_counter() - t0, 1)
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"built in {meta['build_seconds']} s: {data_dir}", file=sys.stderr)
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    ap.add_argument("--clips", type=int, default=300, help="espeak-ng clips (each written in 4 formats)")
    ap.add_argument("--min-rows", type=int, default=50_000, help="add sources until this many text rows")
    ap.add_argument("--force", action="store_true", help="rebuild even if built")
    args = ap.parse_args(argv)
    meta = build(args.data_dir, clips=args.clips, min_rows=args.min_rows, force=args.force)
    print(json.dumps(meta["text"]["full"], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
