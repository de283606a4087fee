"""The text lines: the limit, the naive baseline, decide-only, the cache, sampling and memory scaling."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from harness import Proc, interleave
from report import Row, median, mib, rate, seconds

# the columns clean --tokenize adds: not part of "the same dataset rows"
TOKENIZE_COLUMNS = ("input_ids", "attention_mask", "labels")
# columns clean adds (decide-only may not): reported, not a difference in the rows
ADDED_COLUMNS = ("length",)


def _ok(runs: list) -> tuple[list[Proc], str | None]:
    """The runs that worked, and the first failure's message (a line with any failure has no ratio)."""
    errors = [r for r in runs if isinstance(r, str)]
    return [r for r in runs if not isinstance(r, str)], (errors[0] if errors else None)


def _cpu(a: list, b: list) -> list[float]:
    """Per-repeat CPU-second ratios ``b / a`` (as ``_pairs``: where both sides ran)."""
    return [y.cpu / x.cpu for x, y in zip(a, b) if not isinstance(x, str) and not isinstance(y, str) and x.cpu]


def _pairs(a: list, b: list, fn) -> tuple[list[float], str | None]:
    """Per-repeat ratios ``fn(a_i, b_i)`` where both sides ran; the first failure otherwise."""
    errors = [r for r in a + b if isinstance(r, str)]
    ratios = [fn(x, y) for x, y in zip(a, b) if not isinstance(x, str) and not isinstance(y, str)]
    return ratios, (errors[0] if errors else None)


# -------------------------------------------------------------------------------- text: the baselines


def _token_total(proc: Proc) -> int:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(proc.workdir / "out" / "lengths.parquet", columns=["input_tokens", "target_tokens"])
    return sum(pc.sum(table.column(c)).as_py() or 0 for c in table.column_names)


def text_lines(b) -> list[Row]:
    """Full audit vs raw encode_batch_fast (the limit) and vs Dataset.map (what users write)."""
    src = b.text / "corpus.jsonl"
    n = b.meta["text"][b.tier]["rows"]
    sides = {
        "lengthscan audit --full": b.side(b.audit_argv(src, "--full", "--no-cache"), post=_token_total),
        "raw encode_batch_fast": b.side(b.script("raw_encode.py", str(src), b.tok)),
        "datasets.map": b.side(b.script("naive_map.py", str(src), b.tok)),
        f"datasets.map num_proc={b.cores}": b.side(b.script("naive_map.py", str(src), b.tok,
                                                             "--num-proc", str(b.cores))),
    }
    helptext = subprocess.run(b.lengthscan("audit", "--help"), capture_output=True, text=True, check=False).stdout
    procs = f"lengthscan audit --full --num-proc {b.cores}"
    if "--num-proc" in helptext:
        sides[procs] = b.side(b.audit_argv(src, "--full", "--no-cache", "--num-proc", str(b.cores)))
    runs = interleave(sides, b.repeats, "text")
    ours, raw, map1, mapn = list(runs.values())[:4]
    rows = _raw_rows(ours, raw, n)
    rows += _naive_rows(b, ours, map1, mapn)
    if procs in runs:
        rows += _num_proc_rows(b, runs[procs], raw, map1, mapn)
    return rows


def _num_proc_rows(b, ours: list, raw: list, map1: list, mapn: list) -> list[Row]:
    """The same audit in ``--num-proc`` worker processes (reported, not the default)."""
    ok, err = _ok(ours)
    rok = _ok(raw)[0]
    ratios, e1 = _pairs(ours, raw, lambda o, r: r.out["tokenize_s"] / o.wall)
    best, e2 = _pairs(map1, mapn, lambda a, c: min(a.wall, c.wall))
    return [Row(f"full audit --num-proc {b.cores}, whole process, vs raw encode_batch_fast's tokenize phase (s)",
                seconds([p.wall for p in ok]) if ok else "-",
                seconds([p.out["tokenize_s"] for p in rok]) if rok else "-", ratios, None, error=err or e1),
            Row(f"full audit --num-proc {b.cores} vs Dataset.map, its best num_proc (s)",
                seconds([p.wall for p in ok]) if ok else "-", seconds(best) if best else "-",
                [m / o.wall for m, o in zip(best, ok)] if len(best) == len(ok) else [], None, error=err or e2),
            Row(f"full audit --num-proc {b.cores} vs raw encode_batch_fast, whole process (s)",
                seconds([p.wall for p in ok]) if ok else "-", seconds([p.wall for p in rok]) if rok else "-",
                _pairs(ours, raw, lambda o, r: r.wall / o.wall)[0], None, error=err, cpu_ratios=_cpu(ours, raw))]


def _raw_rows(ours: list, raw: list, n: int) -> list[Row]:
    ok, err = _ok(ours)
    rok, rerr = _ok(raw)
    same = ""
    if ok and rok:
        agree = ok[0].out.get("post") == rok[0].out.get("tokens")
        same = f"token counts {'equal' if agree else 'DIFFER'}: {rok[0].out.get('tokens'):,}"
    ratios, _ = _pairs(ours, raw, lambda o, r: r.out["tokenize_s"] / o.wall)
    phase = Row("full audit, whole process, vs raw encode_batch_fast's tokenize phase alone (rows/s)",
                rate(n, [p.wall for p in ok]) if ok else "-",
                rate(n, [p.out["tokenize_s"] for p in rok]) if rok else "-",
                ratios, ">= 0.9", note=same, error=err or rerr,
                failed="token counts differ" if same.startswith("token counts DIFFER") else None)
    ratios, _ = _pairs(ours, raw, lambda o, r: r.wall / o.wall)
    whole = Row("full audit vs raw encode_batch_fast, whole process against whole process (s)",
                seconds([p.wall for p in ok]) if ok else "-", seconds([p.wall for p in rok]) if rok else "-",
                ratios, ">= 0.9", error=err or rerr, cpu_ratios=_cpu(ours, raw),
                note=f"raw: read {median([p.out['read_s'] for p in rok]):.1f} s, tokenize "
                     f"{median([p.out['tokenize_s'] for p in rok]):.1f} s" if rok else "")
    return [phase, whole]


def _naive_rows(b, ours: list, map1: list, mapn: list) -> list[Row]:
    ok, err = _ok(ours)
    rows = []
    for label, runs in (("num_proc=None", map1), (f"num_proc={b.cores}", mapn)):
        rok, rerr = _ok(runs)
        ratios, _ = _pairs(ours, runs, lambda o, m: m.wall / o.wall)
        rows.append(Row(f"full audit vs load_dataset + Dataset.map(tokenizer) + len(), {label} (s)",
                        seconds([p.wall for p in ok]) if ok else "-",
                        seconds([p.wall for p in rok]) if rok else "-", ratios, None, error=err or rerr,
                        cpu_ratios=_cpu(ours, runs)))
    best, e2 = _pairs(map1, mapn, lambda a, c: min(a.wall, c.wall))
    ratios = [m / o.wall for m, o in zip(best, ok)] if len(best) == len(ok) else []
    best_cpu = [min((m, c), key=lambda p: p.wall) for m, c in zip(map1, mapn)
                if not isinstance(m, str) and not isinstance(c, str)]
    rows.append(Row("full audit vs Dataset.map, its best num_proc, whole process (s)",
                    seconds([p.wall for p in ok]) if ok else "-", seconds(best) if best else "-",
                    ratios, ">= 1.0", error=err or e2,
                    cpu_ratios=_cpu(ok, best_cpu) if len(best_cpu) == len(ok) else []))
    m_ok = [p for p in map1 + mapn if not isinstance(p, str)]
    if ok and m_ok:
        rows.append(Row("peak RSS: full audit vs Dataset.map (lowest of its num_proc runs)",
                        mib([p.rss_mb for p in ok]), f"{min(p.rss_mb for p in m_ok):,.0f} MiB",
                        [o.rss_mb / min(p.rss_mb for p in m_ok) for o in ok], None))
    return rows


# ------------------------------------------------------------------------------------ decide-only


def _dataset_digest(proc: Proc) -> dict:
    """Per split and column, a digest of the written dataset's values; the rejects' row ids."""
    import datasets

    out = proc.workdir / "out"
    digest: dict = {}
    for part in ("dataset", "rejects"):
        obj = datasets.load_from_disk(str(out / part))
        splits = obj.items() if isinstance(obj, datasets.DatasetDict) else [("", obj)]
        for split, ds in splits:
            table = ds.data.table
            cols = table.column_names if part == "dataset" else ["row"]
            for col in cols:
                h = hashlib.sha256()
                for chunk in table.column(col).chunks:
                    h.update(repr(chunk.to_pylist()).encode())
                digest[f"{part}/{split}/{col}"] = h.hexdigest()
            digest[f"{part}/{split}/#rows"] = table.num_rows
    return digest


def _compare(fast: dict, full: dict) -> tuple[bool, str]:
    """Same rows kept (every column both wrote) and the same rows rejected? And a note saying so."""
    common = sorted(set(fast) & set(full))
    differ = [k for k in common if fast[k] != full[k]]
    only = {side: sorted({k.split("/")[-1] for k in set(a) - set(b)} - set(TOKENIZE_COLUMNS))
            for side, a, b in (("decide-only", fast, full), ("full count", full, fast))}
    unexpected = [c for cols in only.values() for c in cols if c not in ADDED_COLUMNS]
    kept = sum(v for k, v in fast.items() if k.startswith("dataset/") and k.endswith("#rows"))
    dropped = sum(v for k, v in fast.items() if k.startswith("rejects/") and k.endswith("#rows"))
    text = f"{kept:,} kept, {dropped:,} dropped"
    if differ or unexpected:
        return False, f"{text}; DIFFER in {', '.join(differ + unexpected)}"
    text += ", same rows and rejects"
    for side, cols in only.items():
        if cols:
            text += f"; only {side} writes {', '.join(cols)}"
    return True, text


def decide_lines(b) -> list[Row]:
    """``clean --limit input_tokens<=L`` (decide-only, when built) vs the full-count path."""
    helptext = subprocess.run(b.lengthscan("clean", "--help"), capture_output=True, text=True, check=False).stdout
    full_flag = "--no-decide-only" if "--no-decide-only" in helptext else "--tokenize"
    if full_flag == "--tokenize":
        b.notes.append("decide-only: this build has no --no-decide-only flag, so the full-count side is "
                       "`clean --tokenize` (it also writes input_ids/attention_mask/labels, compared without "
                       "them); until decide-only lands, both sides count every row")
    src = b.text / "corpus.jsonl"
    rows = []
    for limit in (256, 1024):
        argv = b.lengthscan("clean", str(src), "--tokenizer", b.tok, "--input", "text", "--limit",
                            f"input_tokens<={limit}", "--out", "out", "--no-cache", "--quiet")
        runs = interleave({"decide-only": b.side(argv, post=_dataset_digest),
                           f"full count ({full_flag})": b.side(argv + [full_flag], post=_dataset_digest)},
                          b.repeats, f"decide L={limit}")
        fast, full = runs.values()
        ratios, err = _pairs(fast, full, lambda f, c: c.wall / f.wall)
        same, note = True, ""
        for f, c in zip(fast, full):
            if not isinstance(f, str) and not isinstance(c, str):
                ok, note = _compare(f.out["post"], c.out["post"])
                same = same and ok
        fok, cok = _ok(fast)[0], _ok(full)[0]
        rows.append(Row(f"clean --limit 'input_tokens<={limit}': decide-only vs full count (s)",
                        seconds([p.wall for p in fok]) if fok else "-",
                        seconds([p.wall for p in cok]) if cok else "-",
                        ratios, ">= 2.0" if limit == 256 else None, note=note, error=err, cpu_ratios=_cpu(fast, full),
                        failed=None if same else "keep/drop or rows differ"))
    return rows


# ---------------------------------------------------------------------------------------- the cache


def cache_lines(b) -> list[Row]:
    """A second audit, and clean after an audit, reuse cached lengths: vs the first, cold run."""
    src = b.text / "corpus.jsonl"
    shared: list[Path] = []

    def fresh_cache():
        shared.append(b.workdir())  # one cache (HF and lengthscan) for this repeat's sequence
        shared[-1].mkdir(parents=True)

    clean = b.lengthscan("clean", str(src), "--tokenizer", b.tok, "--input", "text", "--target", "summary",
                         "--limit", "input_tokens<=1024", "--limit", "target_tokens<=128", "--out", "out", "--quiet")
    audit = b.audit_argv(src, "--full")
    sides = {
        "first audit (cold)": b.side(audit, before=fresh_cache, cache_dir=lambda: shared[-1]),
        "second audit (cached)": b.side(audit, cache_dir=lambda: shared[-1]),
        "clean after audit": b.side(clean, cache_dir=lambda: shared[-1]),
        "clean (cold)": b.side(clean),
    }
    first, second, warm, cold = interleave(sides, b.repeats, "cache").values()
    r1, e1 = _pairs(first, second, lambda a, c: a.wall / c.wall)
    r2, e2 = _pairs(cold, warm, lambda a, c: a.wall / c.wall)
    ok = {k: [p.wall for p in _ok(v)[0]] for k, v in
          {"first": first, "second": second, "warm": warm, "cold": cold}.items()}
    def show(k):
        return seconds(ok[k]) if ok[k] else "-"

    return [Row("second audit of the same source and tokenizer vs the first, cold (s)", show("second"),
                show("first"), r1, ">= 10", error=e1, cpu_ratios=_cpu(second, first)),
            Row("clean after an audit (cached lengths) vs clean cold (s)", show("warm"), show("cold"), r2,
                ">= 10", error=e2, note=f"first audit {show('first')}", cpu_ratios=_cpu(warm, cold))]


# ----------------------------------------------------------------------------------- scaling by 10x


def sample_lines(b) -> list[Row]:
    """A sampled audit of a 10x larger Parquet / save_to_disk source at the same sample size."""
    n = 2_000 if b.quick else 10_000
    scale = b.meta["scale"]
    rows = []
    for kind, one, big in (("Parquet", "corpus.parquet", f"corpus{scale}x.parquet"),
                           ("save_to_disk", "corpus_disk", f"corpus{scale}x_disk")):
        runs = interleave({"1x": b.side(b.audit_argv(b.text / one, "--sample", str(n), "--no-cache")),
                           f"{scale}x": b.side(b.audit_argv(b.text / big, "--sample", str(n), "--no-cache"))},
                          b.repeats, f"sample {kind}")
        small, large = runs.values()
        ratios, err = _pairs(large, small, lambda x, y: x.wall / y.wall)
        rows.append(Row(f"sampled audit (--sample {n:,}) of a {kind} source {scale}x larger: {scale}x vs 1x (s)",
                        seconds([p.wall for p in _ok(large)[0]]) if _ok(large)[0] else "-",
                        seconds([p.wall for p in _ok(small)[0]]) if _ok(small)[0] else "-",
                        ratios, "<= 1.3", error=err, cpu_ratios=_cpu(small, large)))
    return rows


def memory_lines(b) -> list[Row]:
    """Peak RSS of a full audit of a 10x larger corpus (Parquet) vs the 1x corpus."""
    scale = b.meta["scale"]
    folder = b.data / "text" / "quick"  # 10k rows and 100k rows: a 10x full audit within minutes
    n = b.meta["text"]["quick"]["rows"]
    runs = interleave({"1x": b.side(b.audit_argv(folder / "corpus.parquet", "--full", "--no-cache")),
                       f"{scale}x": b.side(b.audit_argv(folder / f"corpus{scale}x.parquet", "--full", "--no-cache"))},
                      1 if b.quick else b.repeats, "memory")
    small, large = runs.values()
    ratios, err = _pairs(large, small, lambda x, y: x.rss_mb / y.rss_mb)
    sok, lok = _ok(small)[0], _ok(large)[0]
    rows = [Row(f"peak RSS, full audit of {n * scale:,} rows vs {n:,} rows (Parquet): {scale}x vs 1x",
                mib([p.rss_mb for p in lok]) if lok else "-", mib([p.rss_mb for p in sok]) if sok else "-",
                ratios, "<= 1.2", error=err)]
    ratios, _ = _pairs(large, small, lambda x, y: x.wall / y.wall)
    rows.append(Row(f"time of the same two audits: {scale}x vs 1x (s)",
                    seconds([p.wall for p in lok]) if lok else "-", seconds([p.wall for p in sok]) if sok else "-",
                    ratios, None, error=err, cpu_ratios=_cpu(small, large)))
    return rows


GROUPS = {"text": text_lines, "decide": decide_lines, "cache": cache_lines, "sample": sample_lines,
          "memory": memory_lines}
