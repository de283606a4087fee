"""A block-sampled audit of a remote Parquet corpus: the bytes it reads, its time against downloading
the files and auditing the local copy, and its estimates against a full audit's exact percentiles.

Issue 17, item 7. ``lengthscan audit URL/*.parquet --sample 1% --sample-unit block`` draws whole
row groups ("blocks") at random, stratified by file, and reads only the footers and the measured
column's chunks of the drawn row groups. What that buys is measured here on a corpus of at least
2 GiB of Parquet files served by the local HTTP server of the tests (``RangeServer``: ranges, and
its own count of the file bytes it sends):

a. **Remote block sample**: the audit of ``{url}/files/*.parquet`` as a whole process; the bytes it
   read (``source.bytes_read`` of report.json) must equal the server's count, and be at most 5% of
   the files' bytes (goal).
b. **Baseline**: download every file over HTTP from the same server (a separate process, 4 files at
   a time), then the same audit (same seed, same unit) of the local copy; download + audit must take
   at least 10x the remote audit's time (goal). Over loopback the download costs little: the line
   also gives, as a model (not measured), what the ratio would be on a network of a given bandwidth.
c. The two audits' ``lengths.parquet`` must agree row for row on ``row``, ``file_row`` and
   ``input_tokens``: the remote reader draws and measures the same blocks as the local one.
d. The exact full audit (``--full``) of the local copy: p50, p90, p99 and p99.9 of ``input_tokens``,
   beside the block sample's estimates and 95% intervals (cluster bootstrap over the blocks), with the
   design effect and the effective rows.
e. With ``--row-sample``: the same 1% drawn as rows (``--sample-unit row``) over HTTP; its bytes read
   come near the whole text column, which is why block sampling exists.

The corpus (built once, cached under ``--data-dir``/remote, ``remote-quick`` with ``--quick``): 16
Parquet files ``train-0000i-of-00016.parquet`` with columns ``id``, ``url``, ``text`` and ``meta``
(a small JSON string), snappy-compressed as ``Dataset.to_parquet`` and datatrove write, in row groups
of ``--row-group-rows`` (1,000: their writer batch). Texts are long-tailed (most a few hundred to a
few thousand characters, a tail to 100,000) and made of real text found on this machine (man pages
and the standard library's docstrings, via ``bench/data.py``) cut at spaces into spans of a few
sentences and recombined with a seeded RNG: it compresses like the text it comes from, not like
repeated blocks. Most files mix lengths at random; one holds mostly long documents, one mostly short
ones, and one is sorted by length, so that blocks differ and the design effect shows.

    python bench/remote_bench.py --quick        # ~300 MB corpus, a smoke run (a few minutes)
    python bench/remote_bench.py                # >= 2 GiB corpus; the full audit is the slow part
    python bench/remote_bench.py --skip-full --repeats 3 --row-sample

The table goes to stdout and to ``--results`` (default ``bench/results-remote.md``), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(1, str(REPO))

from data import DEFAULT_DIR, docstring_rows, man_rows  # noqa: E402
from harness import PY, Proc, SideFailed, run_proc  # noqa: E402

from tests.support import range_server  # noqa: E402
from tests.support.range_server import RangeServer  # noqa: E402

CORPUS_VERSION = 1  # bump when what is built changes: an older corpus is rebuilt
SEED = 0
GIB = 1 << 30
FILES = 16
FULL_BYTES = 2 * GIB  # the corpus's files must total at least this (quick: QUICK_BYTES)
QUICK_BYTES = 300 * 10**6
MARGIN = 1.05  # files are sized for this much more, from a pilot's bytes per character
ROW_GROUP_ROWS = 1_000  # Dataset.to_parquet's and datatrove's writer batch
MAX_CHARS = 100_000
SAMPLE = "1%"
PERCENTILES = ("p50", "p90", "p99", "p99.9")
GOAL_BYTES = 0.05  # bytes read <= 5% of the files
GOAL_SPEEDUP = 10.0  # (download + local audit) / remote audit >= 10
MODEL_BANDWIDTH = 100e6  # bytes/s, for the modelled ratio (1 Gbit/s, a good cloud link)
MODEL_RTT = 0.02  # seconds a request, for the same model
DOWNLOAD_THREADS = 4

# -------------------------------------------------------------------------------------------- the corpus


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def text_pool(data_dir: Path) -> Path:
    """Real text from this machine, one file (cached): man pages and stdlib docstrings, blanks collapsed."""
    path = data_dir / "remote-pool.txt"
    if path.exists():
        return path
    _progress("  text pool: man pages and stdlib docstrings (~1 minute) ...")
    texts = [r["text"] for r in man_rows()] + [r["text"] for r in docstring_rows()]
    pool = re.sub(r"[ \t]+", " ", "\n\n".join(texts))
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(pool, encoding="utf-8")
    os.replace(tmp, path)
    return path


@dataclass
class Pool:
    """The pool as UTF-8 bytes, where its spaces are (spans start and end there: never inside a
    character), and some of its words for URLs."""

    data: object  # numpy uint8
    spaces: object  # numpy int64
    words: list[str]

    @classmethod
    def load(cls, path: Path) -> Pool:
        import numpy as np

        raw = path.read_bytes()
        data = np.frombuffer(raw, dtype=np.uint8)
        head = raw[:4_000_000].decode("utf-8", errors="ignore")
        words = sorted(set(re.findall(r"\b[a-z]{4,10}\b", head)))
        return cls(data, np.flatnonzero(data == 32), words)


# Lengths in characters by kind of file: (log-normal median, sigma, share drawn from the Pareto tail, its
# minimum). "sorted" draws like "mixed" and sorts the file by length.
KINDS = {
    "mixed": (1_200, 1.0, 0.03, 5_000),
    "long": (12_000, 0.8, 0.10, 30_000),
    "short": (350, 0.7, 0.005, 3_000),
}


def file_kinds(n: int) -> list[str]:
    """Most files mixed; one mostly long documents, one sorted by length, one mostly short documents."""
    kinds = ["mixed"] * n
    kinds[n // 4], kinds[n // 2], kinds[(3 * n) // 4] = "long", "sorted", "short"
    return kinds


def draw_lengths(rng, kind: str, n: int):
    import numpy as np

    median, sigma, tail, tail_min = KINDS["mixed" if kind == "sorted" else kind]
    lengths = rng.lognormal(np.log(median), sigma, n)
    in_tail = rng.random(n) < tail
    lengths[in_tail] = tail_min * (1 + rng.pareto(1.2, int(in_tail.sum())))
    # spans overshoot a length by up to one span: stay under MAX_CHARS
    return np.clip(lengths, 60, MAX_CHARS - 2_000).astype(np.int64)


def file_lengths(rng, kind: str, chars: int):
    """Lengths for one file, ``chars`` characters in all; sorted for a "sorted" file."""
    import numpy as np

    parts, total = [], 0
    while total < chars:
        part = draw_lengths(rng, kind, 10_000)
        parts.append(part)
        total += int(part.sum())
    lengths = np.concatenate(parts)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), chars)) + 1]
    return np.sort(lengths) if kind == "sorted" else lengths


def make_texts(rng, pool: Pool, lengths):
    """A string array of texts of about ``lengths`` bytes: spans of the pool (a few sentences each,
    from a space to a space) at random places, each text at least one span."""
    import numpy as np
    import pyarrow as pa

    total = int(lengths.sum())
    span = np.maximum(20, rng.exponential(250, total // 200 + 2 * len(lengths) + 100)).astype(np.int64)
    while span.sum() < total + 2 * MAX_CHARS:
        span = np.concatenate([span, np.maximum(20, rng.exponential(250, len(span))).astype(np.int64)])
    spaces = pool.spaces
    starts = spaces[np.searchsorted(spaces, rng.integers(0, len(pool.data) - 10 * MAX_CHARS, len(span)))] + 1
    ends = spaces[np.searchsorted(spaces, starts + span)] + 1
    keep = ends - starts <= 4_000  # not a long run without a space (a table, a base64 blob)
    starts, ends = starts[keep], ends[keep]
    cum = np.cumsum(ends - starts)
    # text i ends after the span where the running total passes its own running total; one span at least
    cut = np.searchsorted(cum, np.cumsum(lengths)) + 1
    idx = np.arange(len(cut))
    cut = np.maximum.accumulate(cut - idx) + idx
    used = int(cut[-1])
    if used > len(starts):
        raise RuntimeError("not enough spans drawn for the texts")
    data = np.concatenate([pool.data[s:e] for s, e in zip(starts[:used], ends[:used])])
    offsets = np.concatenate([[0], cum[cut - 1]]).astype(np.int32)  # a batch is far under 2 GiB
    return pa.StringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(data))


_TLDS = ("com", "org", "net", "io", "de", "fr", "co.uk", "edu", "info", "dev")


def make_batch(rng, pool: Pool, lengths, file_index: int, first_row: int):
    """One row group's rows: ``id`` (a urn:uuid), ``url``, ``text`` and ``meta`` (JSON)."""
    import pyarrow as pa

    n = len(lengths)
    texts = make_texts(rng, pool, lengths)
    words = pool.words
    w = rng.integers(0, len(words), (n, 3))
    ids, urls, metas = [], [], []
    for i in range(n):
        ids.append(f"<urn:uuid:{uuid.UUID(bytes=rng.bytes(16), version=4)}>")
        tld = _TLDS[int(w[i, 0]) % len(_TLDS)]
        urls.append(f"https://{words[w[i, 0]]}.{tld}/{words[w[i, 1]]}/{words[w[i, 2]]}-{first_row + i}.html")
        metas.append(json.dumps({"dump": f"CC-MAIN-2024-{10 + file_index % 40:02d}", "language": "en",
                                 "language_score": round(0.65 + 0.35 * float(rng.random()), 4)}))
    return pa.table({"id": ids, "url": urls, "text": texts, "meta": metas})


def _parquet_options(compression: str) -> dict:
    return {"compression": compression}


def chars_per_byte(pool: Pool, compression: str, row_group_rows: int) -> float:
    """Characters of text per byte of a Parquet file, from a pilot of mixed rows (seeded: the same each time)."""
    import io

    import numpy as np
    import pyarrow.parquet as pq

    rng = np.random.default_rng([SEED, 999])
    lengths = draw_lengths(rng, "mixed", 10 * row_group_rows)
    table = make_batch(rng, pool, lengths, 0, 0)
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_rows, **_parquet_options(compression))
    return int(lengths.sum()) / len(buf.getvalue())


def write_file(path: Path, pool: Pool, kind: str, index: int, chars: int, compression: str,
               row_group_rows: int) -> dict:
    """One Parquet file of about ``chars`` characters of text, one row group a batch (memory stays flat)."""
    import numpy as np
    import pyarrow.parquet as pq

    rng = np.random.default_rng([SEED, index])
    lengths = file_lengths(rng, kind, chars)
    writer = None
    try:
        for start in range(0, len(lengths), row_group_rows):
            table = make_batch(rng, pool, lengths[start:start + row_group_rows], index, start)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, **_parquet_options(compression))
            writer.write_table(table, row_group_size=row_group_rows)
    finally:
        if writer is not None:
            writer.close()
    meta = pq.ParquetFile(path).metadata
    return {"name": path.name, "kind": kind, "bytes": path.stat().st_size, "rows": meta.num_rows,
            "row_groups": meta.num_row_groups, "text_chars": int(lengths.sum())}


def corpus_params(quick: bool, row_group_rows: int, compression: str) -> dict:
    return {"version": CORPUS_VERSION, "files": FILES, "min_bytes": QUICK_BYTES if quick else FULL_BYTES,
            "row_group_rows": row_group_rows, "compression": compression, "seed": SEED}


def build_corpus(data_dir: Path, folder: Path, params: dict, *, rebuild: bool) -> dict:
    """The corpus in ``folder`` (its meta.json), built when missing, different or with ``rebuild``."""
    meta_path = folder / "meta.json"
    if meta_path.exists() and not rebuild:
        meta = json.loads(meta_path.read_text())
        if meta.get("params") == params:
            return meta
        _progress(f"corpus in {folder} was built with {meta.get('params')}: rebuilding")
    t0 = time.perf_counter()
    pool = Pool.load(text_pool(data_dir))
    ratio = chars_per_byte(pool, params["compression"], params["row_group_rows"])
    chars = int(params["min_bytes"] * MARGIN / params["files"] * ratio)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files = []
    for i, kind in enumerate(file_kinds(params["files"])):
        path = tmp / f"train-{i:05d}-of-{params['files']:05d}.parquet"
        files.append(write_file(path, pool, kind, i, chars, params["compression"], params["row_group_rows"]))
        f = files[-1]
        _progress(f"  {f['name']} ({kind}): {f['rows']:,} rows, {f['row_groups']} row groups, "
                  f"{f['bytes'] / 1e6:,.0f} MB ({time.perf_counter() - t0:.0f} s)")
    total = sum(f["bytes"] for f in files)
    if total < params["min_bytes"]:
        raise SystemExit(f"corpus built too small: {total:,} bytes < {params['min_bytes']:,} (raise MARGIN)")
    meta = {"params": params, "files": files, "bytes": total, "rows": sum(f["rows"] for f in files),
            "row_groups": sum(f["row_groups"] for f in files), "text_chars": sum(f["text_chars"] for f in files),
            "pool_bytes": len(pool.data), "build_seconds": round(time.perf_counter() - t0, 1)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    _progress(f"corpus built in {meta['build_seconds']} s: {folder}")
    return meta


def text_column_bytes(folder: Path, files: list[dict]) -> int:
    """Compressed bytes of the text column's chunks in every file (what a row sample must read)."""
    import pyarrow.parquet as pq

    total = 0
    for f in files:
        meta = pq.ParquetFile(folder / f["name"]).metadata
        col = meta.schema.names.index("text")
        total += sum(meta.row_group(g).column(col).total_compressed_size for g in range(meta.num_row_groups))
    return total


# ----------------------------------------------------------------------------------------------- download


def download(dest: Path, urls: list[str]) -> dict:
    """Every URL into ``dest``, DOWNLOAD_THREADS at a time, streamed in 1 MiB reads."""
    import urllib.request

    dest.mkdir(parents=True, exist_ok=True)

    def one(url: str) -> int:
        with urllib.request.urlopen(url, timeout=60) as resp, open(dest / url.rsplit("/", 1)[1], "wb") as fh:
            shutil.copyfileobj(resp, fh, 1 << 20)
            return fh.tell()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(DOWNLOAD_THREADS) as ex:
        sizes = list(ex.map(one, urls))
    return {"files": len(sizes), "bytes": sum(sizes), "seconds": time.perf_counter() - t0}


def download_main(argv: list[str]) -> int:
    """``remote_bench.py download DEST URL...``: the baseline's download as its own process."""
    print(json.dumps(download(Path(argv[0]), argv[1:])))
    return 0


# ------------------------------------------------------------------------------------------------ the runs


class _NoDelayHandler(range_server._Handler):
    # TCP_NODELAY, as object stores and CDNs answer: with Nagle's algorithm on (http.server's default) every
    # request after the first on a kept-alive connection waits ~40 ms for the client's delayed ACK
    disable_nagle_algorithm = True


def serve(folder: Path, nagle: bool) -> RangeServer:
    """The test server over ``folder``, started; TCP_NODELAY on its connections unless ``nagle``."""
    srv = RangeServer(folder).start()
    if not nagle:
        srv._server.RequestHandlerClass = _NoDelayHandler
    return srv


@dataclass
class Audit:
    """One audit process: its wall time, report.json and the lengths it wrote."""

    proc: Proc
    report: dict
    lengths: object  # pyarrow Table: row, file_row, input_tokens
    by_file: dict[str, int]  # rows measured in each file (its name)
    served: int | None = None  # the server's count of file bytes sent during the run

    @property
    def source(self) -> dict:
        return self.report["source"]

    @property
    def field(self) -> dict:
        return self.report["splits"][0]["fields"]["input_tokens"]


def audit_argv(src: str, tok: str, *extra: str) -> list[str]:
    return [PY, "-m", "lengthscan", "audit", src, "--tokenizer", tok, "--input", "text", "--seed", str(SEED),
            "--no-cache", "--quiet", "--out", "out", *extra]


def block_args() -> list[str]:
    return ["--sample", SAMPLE, "--sample-unit", "block"]


def run_audit(argv: list[str], workdir: Path, srv: RangeServer | None = None) -> Audit:
    import pyarrow.parquet as pq

    if srv is not None:
        srv.reset_counts()
    proc = run_proc(argv, workdir)
    served = srv.bytes_served if srv is not None else None
    out = workdir / "out"
    report = json.loads((out / "report.json").read_text())
    lengths = pq.read_table(out / "lengths.parquet", columns=["row", "file_row", "input_tokens", "source_file"])
    by_file: dict[str, int] = {}
    for name in lengths.column("source_file").to_pylist():
        name = name.rsplit("/", 1)[-1]
        by_file[name] = by_file.get(name, 0) + 1
    shutil.rmtree(workdir, ignore_errors=True)
    return Audit(proc, report, lengths.drop_columns(["source_file"]), by_file, served)


@dataclass
class Runs:
    """What the runs measured, for the table."""

    remote: list[Audit] = field(default_factory=list)
    downloads: list[tuple[Proc, dict]] = field(default_factory=list)
    local: list[Audit] = field(default_factory=list)
    full: Audit | None = None
    row_sample: Audit | None = None
    errors: list[str] = field(default_factory=list)


class Bench:
    def __init__(self, folder: Path, meta: dict, tok: str, scratch: Path, nagle: bool):
        self.folder, self.meta, self.tok, self.scratch, self.nagle = folder, meta, tok, scratch, nagle
        self.copy = scratch / "copy"
        self.runs = Runs()
        self._n = 0

    def workdir(self, name: str) -> Path:
        self._n += 1
        return self.scratch / f"{self._n:03d}-{name}"

    def names(self) -> list[str]:
        return [f["name"] for f in self.meta["files"]]

    def remote(self, srv: RangeServer) -> Audit:
        return run_audit(audit_argv(f"{srv.url}/files/*.parquet", self.tok, *block_args()), self.workdir("remote"),
                         srv)

    def download(self, srv: RangeServer) -> tuple[Proc, dict]:
        shutil.rmtree(self.copy, ignore_errors=True)
        urls = [srv.file_url(n) for n in self.names()]
        proc = run_proc([PY, str(Path(__file__).resolve()), "download", str(self.copy), *urls],
                        self.workdir("download"))
        return proc, proc.out

    def local(self, *extra: str) -> Audit:
        return run_audit(audit_argv(str(self.copy / "*.parquet"), self.tok, *extra), self.workdir("local"))

    def row_sample(self, srv: RangeServer) -> Audit:
        argv = audit_argv(f"{srv.url}/files/*.parquet", self.tok, "--sample", SAMPLE, "--sample-unit", "row")
        return run_audit(argv, self.workdir("row-sample"), srv)

    def attempt(self, label: str, fn, *args):
        """Run one side, print its progress line; a failure is kept as an error (None returned)."""
        try:
            got = fn(*args)
        except (SideFailed, OSError, ValueError, KeyError) as exc:
            self.runs.errors.append(f"{label}: {exc}")
            _progress(f"  {label:<28} FAILED {exc}")
            return None
        proc = got[0] if isinstance(got, tuple) else got.proc
        extra = ""
        if isinstance(got, Audit) and got.served is not None:
            extra = f"  bytes_read {got.source.get('bytes_read'):,} / served {got.served:,}"
        _progress(f"  {label:<28} {proc.wall:7.2f} s wall {proc.cpu:7.2f} s CPU {proc.rss_mb:6.0f} MiB{extra}")
        return got

    def measure(self, repeats: int, *, full: bool, row_sample: bool, reuse: bool = False) -> Runs:
        warm(self.folder, self.names())
        with serve(self.folder, self.nagle) as srv:
            for rep in range(repeats):
                _progress(f"repeat {rep + 1}/{repeats}")
                for label, fn, into in (("a. remote block sample", self.remote, self.runs.remote),
                                        ("b. download", self.download, self.runs.downloads)):
                    got = self.attempt(label, fn, srv)
                    if got is not None:
                        into.append(got)
                got = self.attempt("b. local block sample", self.local, *block_args())
                if got is not None:
                    self.runs.local.append(got)
            if row_sample:
                self.runs.row_sample = self.attempt("e. remote row sample", self.row_sample, srv)
        if full:
            self.runs.full = self.full_audit(reuse)
        return self.runs

    def full_audit(self, reuse: bool) -> Audit | None:
        """The full audit of the local copy (16 minutes on 2 cores), kept beside the corpus: its exact
        percentiles depend on the corpus and the tokenizer only, so ``--reuse-full`` reads them back
        when the sampling side changes."""
        import hashlib

        key = hashlib.sha256(f"{self.tok}|{json.dumps(self.meta, sort_keys=True)}".encode()).hexdigest()[:12]
        kept = self.folder / f"full-audit-{key}.json"
        if reuse and kept.exists():
            data = json.loads(kept.read_text())
            _progress(f"  d. full audit (local copy)   reused from {kept}")
            return Audit(Proc(data["wall"], data["rss_mb"], cpu=data["cpu"]), data["report"], None, {})
        got = self.attempt("d. full audit (local copy)", self.local, "--full")
        if got is not None:
            kept.write_text(json.dumps({"wall": got.proc.wall, "cpu": got.proc.cpu, "rss_mb": got.proc.rss_mb,
                                        "report": got.report}))
        return got


def warm(folder: Path, names: list[str]) -> None:
    """Read the files once, so that the server reads them from the page cache in every run."""
    for name in names:
        with open(folder / name, "rb") as fh:
            while fh.read(8 << 20):
                pass


# ----------------------------------------------------------------------------------------------- the table


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    if len(values) < 2:
        return ""
    return " [" + fmt.format(min(values)) + "-" + fmt.format(max(values)) + "]"


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:,.1f} MB"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def bytes_lines(runs: Runs, meta: dict, text_bytes: int) -> list[tuple]:
    lines = []
    if not runs.remote:
        return [("bytes read by the remote block sample", "n/a", "<= 5% of the files", "n/a")]
    a = runs.remote[0]
    read, total = a.source.get("bytes_read"), a.source.get("bytes_total")
    share = read / total if read is not None and total else None
    same = all(r.source.get("bytes_read") == r.served for r in runs.remote)
    lines.append(("bytes read by the remote 1% block sample (report's `bytes_read`)",
                  f"{_mb(read)} of {_mb(total)} = {share:.2%}" if share is not None else "n/a",
                  f"<= {GOAL_BYTES:.0%} of the files", _verdict(share <= GOAL_BYTES if share is not None else None)))
    counts = ", ".join(f"{r.source.get('bytes_read'):,} / {r.served:,}" for r in runs.remote)
    lines.append(("report's `bytes_read` / the server's own count, each run", counts, "equal", _verdict(same)))
    lines.append(("requests / retries (remote block sample)", f"{a.source.get('requests')} / {a.source.get('retries')}",
                  "", "info"))
    if total != meta["bytes"]:
        lines.append(("report's `bytes_total` vs the files on disk", f"{total:,} vs {meta['bytes']:,}", "equal",
                      "FAIL"))
    if runs.row_sample is not None:
        r = runs.row_sample
        rs_read = r.source.get("bytes_read")
        lines.append(("e. bytes read by a remote 1% **row** sample",
                      f"{_mb(rs_read)} = {rs_read / total:.1%} of the files ({rs_read / text_bytes:.0%} of the "
                      f"text column's {_mb(text_bytes)}); {r.proc.wall:.1f} s; served {r.served:,}", "", "info"))
    return lines


def time_lines(runs: Runs) -> list[tuple]:
    n = min(len(runs.remote), len(runs.downloads), len(runs.local))
    if not n:
        return [("time: download + local audit / remote audit", "n/a", f">= {GOAL_SPEEDUP:.0f}x", "n/a")]
    a = [r.proc.wall for r in runs.remote[:n]]
    dl = [p.wall for p, _ in runs.downloads[:n]]
    loc = [r.proc.wall for r in runs.local[:n]]
    ratios = [(d + c) / r for d, c, r in zip(dl, loc, a)]
    ratio = statistics.median(ratios)
    dl_bytes = runs.downloads[0][1].get("bytes", 0)
    lines = [
        ("a. remote block sample, whole process", f"{_median(a):.2f} s{_span(a)}", "", "info"),
        ("b. download every file (4 at a time), whole process",
         f"{_median(dl):.2f} s{_span(dl)} ({dl_bytes / _median(dl) / 1e6:,.0f} MB/s)", "", "info"),
        ("b. local block sample of the copy, whole process", f"{_median(loc):.2f} s{_span(loc)}", "", "info"),
        ("b / a: (download + local audit) / remote audit", f"{ratio:.2f}x{_span(ratios, '{:.2f}')}",
         f">= {GOAL_SPEEDUP:.0f}x", _verdict(ratio >= GOAL_SPEEDUP)),
    ]
    lines.append(model_line(runs, _median(a), _median(loc)))
    if runs.full is not None:
        whole = (_median(dl) + runs.full.proc.wall) / _median(a)
        lines.append(("b' / a: (download + a full audit of the copy) / remote audit",
                      f"{whole:,.1f}x ({_median(dl) + runs.full.proc.wall:,.0f} s)", "", "info"))
    return lines


def model_line(runs: Runs, remote_s: float, local_s: float) -> tuple:
    """The ratio on a network of MODEL_BANDWIDTH and MODEL_RTT: transfer times added to the measured
    compute; a model, not a measurement (loopback moves gigabytes a second)."""
    src = runs.remote[0].source
    read, total, requests = src.get("bytes_read") or 0, src.get("bytes_total") or 0, src.get("requests") or 0
    remote = remote_s + read / MODEL_BANDWIDTH + requests * MODEL_RTT
    base = total / MODEL_BANDWIDTH + local_s
    # (total/bw + local) / (remote + read/bw + requests*rtt) = GOAL  <=>  bw = (total - GOAL*read) / (...)
    slack = GOAL_SPEEDUP * (remote_s + requests * MODEL_RTT) - local_s
    even = (total - GOAL_SPEEDUP * read) / slack if slack > 0 else float("inf")
    return (f"model, not measured: b / a at {MODEL_BANDWIDTH / 1e6:.0f} MB/s and {MODEL_RTT * 1e3:.0f} ms a request "
            "(the measured compute plus transfer times)",
            f"{base / remote:.1f}x (b {base:.0f} s, a {remote:.1f} s); {GOAL_SPEEDUP:.0f}x below "
            f"{even / 1e6:.1f} MB/s", "", "info")


def same_lengths(runs: Runs) -> tuple:
    if not runs.remote or not runs.local:
        return ("c. lengths.parquet remote = local (row, file_row, input_tokens)", "n/a", "equal", "n/a")
    a, b = runs.remote[0].lengths, runs.local[0].lengths
    equal = a.equals(b)
    value = f"{a.num_rows:,} rows, identical" if equal else f"{a.num_rows:,} vs {b.num_rows:,} rows, DIFFERENT"
    if not equal and a.num_rows == b.num_rows:
        same_sorted = a.sort_by("row").equals(b.sort_by("row"))
        value += " (equal once sorted by row)" if same_sorted else ""
    return ("c. lengths.parquet remote = local (row, file_row, input_tokens)", value, "equal", _verdict(equal))


def _fmt(v) -> str:
    if v is None:
        return "open"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def percentile_rows(runs: Runs) -> list[tuple]:
    """(percentile, exact, estimate, interval, inside) for p50 ... p99.9."""
    if not runs.remote:
        return []
    est = runs.remote[0].field
    exact = runs.full.field["percentiles"] if runs.full is not None else {}
    rows = []
    for p in PERCENTILES:
        lo, hi = (est.get("intervals") or {}).get(p, [None, None])
        x = exact.get(p)
        inside = None if x is None or lo is None else (lo <= x and (hi is None or x <= hi))
        e = est["percentiles"].get(p)
        err = f"{(e - x) / x:+.1%}" if x and e is not None else "n/a"
        rows.append((p, _fmt(x) if x is not None else "n/a", _fmt(e), err, f"[{_fmt(lo)}, {_fmt(hi)}]",
                     {None: "n/a", True: "yes", False: "**no**"}[inside]))
    return rows


def design_line(runs: Runs, meta: dict) -> str:
    if not runs.remote:
        return ""
    a = runs.remote[0]
    d, s = a.field.get("design") or {}, a.source.get("sampling") or {}
    kind = {f["name"]: f["kind"] for f in meta["files"]}
    drawn: dict[str, int] = {}
    corpus: dict[str, int] = {}
    for name, rows in a.by_file.items():
        drawn[kind[name]] = drawn.get(kind[name], 0) + rows
    for f in meta["files"]:
        corpus[f["kind"]] = corpus.get(f["kind"], 0) + f["rows"]
    n = sum(drawn.values()) or 1
    mix = ", ".join(f"{k} {drawn.get(k, 0) / n:.0%} ({v / meta['rows']:.0%})" for k, v in corpus.items())
    return (f"Block sample: {s.get('blocks_drawn')} of {s.get('blocks_total')} blocks drawn, from {len(a.by_file)} of "
            f"{len(meta['files'])} files ({d.get('rows'):,} rows of {meta['rows']:,}); design effect "
            f"{d.get('design_effect'):.2f}, effective rows {d.get('effective_rows'):,.0f}. Rows of the sample by kind "
            f"of file (of the corpus): {mix}.")


# ---------------------------------------------------------------------------------------------- the report


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def machine() -> dict:
    cpu = "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return {"cores": len(os.sched_getaffinity(0)), "cpu": cpu, "ram_gib": round(ram, 1),
            "python": platform.python_version(), "load": os.getloadavg()[0]}


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("lengthscan", "pyarrow", "tokenizers", "fsspec", "aiohttp"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(out)


def header(args, meta: dict, tok: str, host: dict, text_bytes: int, load_end: float) -> list[str]:
    kinds = {}
    for f in meta["files"]:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    dirty = " (uncommitted changes in lengthscan/)" if _git("status", "--porcelain", "lengthscan") else ""
    return [
        f"# Remote block sampling ({'quick' if args.quick else 'full'})",
        "",
        f"`python bench/remote_bench.py{' --quick' if args.quick else ''}`, {time.strftime('%Y-%m-%d %H:%M')}; "
        f"commit {_git('rev-parse', '--short', 'HEAD')}{dirty}.",
        "",
        f"* Machine: {host['cores']} cores ({host['cpu']}), {host['ram_gib']} GiB RAM, Python {host['python']}; "
        f"load average {host['load']:.2f} at the start, {load_end:.2f} at the end. {versions()}.",
        f"* Corpus: {len(meta['files'])} Parquet files, {meta['bytes']:,} bytes ({meta['bytes'] / GIB:.2f} GiB), "
        f"{meta['rows']:,} rows, {meta['row_groups']:,} row groups of {meta['params']['row_group_rows']:,} rows, "
        f"{meta['params']['compression']}; {meta['text_chars'] / 1e9:.2f} G characters of text, the text column "
        f"{text_bytes / meta['bytes']:.1%} of the bytes. Files: "
        + ", ".join(f"{n} {k}" for k, n in kinds.items()) + ".",
        f"* Served by `tests.support.range_server.RangeServer` on 127.0.0.1 (loopback), files in the page cache, "
        f"{'Nagle on (`--nagle`)' if args.nagle else 'TCP_NODELAY on its sockets'}. "
        f"Tokenizer: `{tok}`. Sample: `--sample {SAMPLE} --sample-unit block --seed {SEED}`; each side a whole "
        f"process with fresh caches and `--no-cache`; {args.repeats} repeat(s) of a and b (median [range]).",
        "",
    ]


def render(args, meta: dict, tok: str, runs: Runs, host: dict, text_bytes: int) -> str:
    lines = header(args, meta, tok, host, text_bytes, os.getloadavg()[0])
    lines += ["| line | value | goal | result |", "|---|---|---|---|"]
    for row in [*bytes_lines(runs, meta, text_bytes), *time_lines(runs), same_lengths(runs)]:
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Token lengths of `text` (input_tokens): the 1% block sample against the full audit's exact values.",
              "", "| percentile | exact (full audit) | block sample | error | its 95% interval | exact inside |",
              "|---|---:|---:|---:|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in percentile_rows(runs)]
    lines += ["", design_line(runs, meta)]
    if runs.full is not None:
        lines.append(f"The full audit of the local copy took {runs.full.proc.wall:,.0f} s "
                     f"({runs.full.proc.cpu:,.0f} s CPU, {runs.full.proc.rss_mb:,.0f} MiB peak).")
    elif args.skip_full:
        lines.append("Full audit skipped (`--skip-full`): no exact values.")
    if runs.errors:
        lines += ["", "Errors:", *[f"* {e}" for e in runs.errors]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------ main


def default_tokenizer(data_dir: Path) -> str:
    """bench/data.py's tokenizer when it is built, else ``lengthscan demo``'s."""
    for path in (data_dir / "tokenizer", Path.home() / ".cache" / "lengthscan" / "demo" / "py311" / "tokenizer"):
        if (path / "tokenizer.json").exists():
            return str(path)
    raise SystemExit("no tokenizer: run `python bench/data.py` or `lengthscan demo`, or give --tokenizer")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a ~300 MB corpus (remote-quick/), one repeat: a smoke run")
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    ap.add_argument("--repeats", type=int, default=1, help="runs of a and b (default 1); the full audit runs once")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the corpus even if built")
    ap.add_argument("--skip-full", action="store_true", help="no full audit (no exact percentiles)")
    ap.add_argument("--reuse-full", action="store_true",
                    help="the full audit kept from an earlier run on the same corpus and tokenizer, if any")
    ap.add_argument("--row-sample", action="store_true", help="also the same 1%% drawn as rows, remote")
    ap.add_argument("--row-group-rows", type=int, default=ROW_GROUP_ROWS, help="rows per row group (default 1,000)")
    ap.add_argument("--compression", choices=("snappy", "zstd"), default="snappy", help="default snappy")
    ap.add_argument("--tokenizer", help="default: bench/data.py's, else lengthscan demo's")
    ap.add_argument("--results", type=Path, default=BENCH / "results-remote.md", help="the markdown copy")
    ap.add_argument("--nagle", action="store_true",
                    help="leave Nagle's algorithm on in the server (its default: ~40 ms a request)")
    ap.add_argument("--build-only", action="store_true", help="build the corpus and stop")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["download"]:
        return download_main(argv[1:])
    args = parse_args(argv)
    host = machine()
    folder = args.data_dir / ("remote-quick" if args.quick else "remote")
    params = corpus_params(args.quick, args.row_group_rows, args.compression)
    meta = build_corpus(args.data_dir, folder, params, rebuild=args.rebuild)
    _progress(f"corpus: {len(meta['files'])} files, {meta['bytes'] / GIB:.2f} GiB, {meta['rows']:,} rows, "
              f"{meta['row_groups']:,} row groups")
    if args.build_only:
        return 0
    tok = args.tokenizer or default_tokenizer(args.data_dir)
    text_bytes = text_column_bytes(folder, meta["files"])
    with tempfile.TemporaryDirectory(prefix="remote-bench-") as scratch:
        runs = Bench(folder, meta, tok, Path(scratch), args.nagle).measure(args.repeats, full=not args.skip_full,
                                                               reuse=args.reuse_full,
                                                               row_sample=args.row_sample)
    table = render(args, meta, tok, runs, host, text_bytes)
    print(table)
    args.results.write_text(table)
    _progress(f"written to {args.results}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
