"""The count-only BPE engine against the floor every exact counter sits on: the raw
``encode_batch_fast`` script (``bench/raw_encode.py``), and against lengthscan as it was
(``--count-engine tokenizers``), on the same corpus, as whole processes, interleaved, median of N;
lengthscan both warm (the engine's proof cached by an earlier run) and cold (a first run, with a
cache of its own: the proof is made beside the counting).

    python bench/count_bench.py                  # ~15 minutes on 2 cores
    python bench/count_bench.py --quick          # the 10k-row corpus, ~3 minutes
    python bench/count_bench.py --repeats 5 --only long

Corpora (``bench/data.py`` builds the first): ``long`` is the long-tailed text corpus (Debian
descriptions, man pages, docstrings: inputs up to 176k tokens); ``short`` is the same text cut
into paragraphs of at most 300 characters (the regime where a thread pool over single texts loses
to ``encode_batch_fast``). Tokenizers: the bench's own byte-level BPE (GPT-2 style, trained on the
corpus), and, where their wheels are installed (tests/requirements-tokenizers.txt), Llama 3 and
o200k as transformers converts them, o200k's vocabulary and merges in the files Qwen's models ship
(``o200k-qwen``: NFC, Qwen 2's regex, ``tokenizer_class`` Qwen2Tokenizer, which transformers 5
rebuilds the backend with; ``o200k-qwen3.5``: the same as Qwen 3.5's 248k-vocabulary files are laid
out, its regex reading marks as letters, ``Qwen3_5Tokenizer``), Anthropic's (NFKC) and DeepSeek's
(three split regexes: the engine is refused, so this line shows what a refused tokenizer costs).

Per line: the three whole-process times (median), raw / engine (goal >= 1.8x where the engine is
proven), today / engine (never below 1), the tokenize phase alone in one process (backend
``encode_batch_fast`` against ``CountEngine.count``), the engine's first-run set-up (proof and
regex probe, cached after), and checks: every row's counts equal between the engine's and
today's ``lengths.parquet``, and the token totals equal the raw script's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from harness import PY, SideFailed, run_proc  # noqa: E402

RESULTS = BENCH / "results-count.md"


def short_corpus(src: Path, out: Path) -> Path:
    """Paragraphs of at most 300 characters, each a row (target: its first 60 characters)."""
    if out.exists():
        return out
    rows = 0
    with open(src, encoding="utf-8") as fh, open(out, "w", encoding="utf-8") as dst:
        for line in fh:
            for para in json.loads(line)["text"].split("\n\n"):
                para = para.strip()[:300]
                if para:
                    dst.write(json.dumps({"text": para, "summary": para[:60]}, ensure_ascii=False) + "\n")
                    rows += 1
    return out


def tokenizers(data: Path, work: Path) -> dict[str, Path]:
    """name -> tokenizer directory: the bench's own, and the real ones whose wheels are here."""
    from tests.support.bpe_vocab import converted_tokenizer, save_tokenizer_dir, wheel_file

    out = {"bench-bpe": data / "tokenizer"}
    for name in ("llama3", "o200k"):
        folder = work / "tok" / name
        if not (folder / "tokenizer.json").exists():
            tok = converted_tokenizer(name)
            if tok is None:
                continue
            save_tokenizer_dir(tok, folder)
        out[name] = folder
    for name, version in (("o200k-qwen", "2"), ("o200k-qwen3.5", "3.5")):  # as Qwen 2's and Qwen 3.5's files
        if "o200k" not in out:
            break
        if not (work / "tok" / name / "tokenizer.json").exists():
            from tests.support.bpe_vocab import qwen_files

            model = json.loads((out["o200k"] / "tokenizer.json").read_text(encoding="utf-8"))["model"]
            qwen_files(work / "tok" / name, model["vocab"], model["merges"], version)
        out[name] = work / "tok" / name
    for name, (package, relative) in {"anthropic": ("anthropic", "tokenizer.json"),
                                      "deepseek": ("litellm", "litellm_core_utils/tokenizers/deepseek_tokenizer.json")
                                      }.items():
        path = wheel_file(package, relative)
        if path is not None:
            folder = work / "tok" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "tokenizer.json").write_bytes(path.read_bytes())
            (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
            out[name] = folder
    return out


def audit_argv(corpus: Path, tok: Path, out: Path, engine: str) -> list[str]:
    return [PY, "-m", "lengthscan", "audit", str(corpus), "--tokenizer", str(tok), "--input", "text", "--target",
            "summary", "--full", "--no-cache", "--quiet", "--overwrite", "--out", str(out), "--count-engine", engine]


def phase(corpus: Path, tok: Path, cache: Path) -> dict:
    """The tokenize phase alone, in this process: backend encode_batch_fast vs the engine."""
    from transformers import AutoTokenizer

    from lengthscan.measure.text.countbpe.counting import engine_for

    texts = []
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            texts += [row["text"], row["summary"]]
    backend = AutoTokenizer.from_pretrained(str(tok)).backend_tokenizer
    t0 = time.perf_counter()
    engine, why = engine_for(backend, cache)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = [len(e) for e in backend.encode_batch_fast(texts)]
    fast = time.perf_counter() - t0
    if engine is None:
        return {"fast_s": fast, "engine_s": None, "setup_s": setup, "why": why}
    t0 = time.perf_counter()
    ours = engine.count(texts)
    count = time.perf_counter() - t0
    specials = len(backend.encode("x")) - len(backend.encode("x", add_special_tokens=False))
    left = [i for i, n in enumerate(ours) if n < 0]
    same = all(n + specials == theirs[i] for i, n in enumerate(ours) if n >= 0)
    return {"fast_s": fast, "engine_s": count, "setup_s": setup, "left": len(left), "same": same, "why": why}


def lengths_equal(a: Path, b: Path) -> bool:
    return pq.read_table(a / "lengths.parquet").equals(pq.read_table(b / "lengths.parquet"))


def totals(out: Path) -> int:
    t = pq.read_table(out / "lengths.parquet")
    return int(sum(t.column(c).to_numpy().clip(0).sum() for c in ("input_tokens", "target_tokens")))


def bench_line(corpus: Path, tok: Path, work: Path, repeats: int) -> dict:
    """Whole processes, interleaved, the order rotating each repeat: the raw script; ``cold``, a first
    run (an empty cache of its own: the engine is proven beside the counting); ``engine``, a warm run
    (the proof cached by an earlier run); ``today``, ``--count-engine tokenizers``."""
    shared = work / "shared"  # the count-only engine's cache (rank table, probe), as a second run finds it
    run_proc(audit_argv(corpus, tok, work / "engine-out", "auto"), work / "warm-up", cache_dir=shared)
    sides = ["raw", "cold", "engine", "today"]
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    raw_tokens = None
    for r in range(repeats):
        for side in sides[r % 4:] + sides[:r % 4]:  # the order rotates: no side always follows another
            where = work / f"{side}-{r}"
            if side == "raw":
                proc = run_proc([PY, str(BENCH / "raw_encode.py"), str(corpus), str(tok)], where)
                raw_tokens = proc.out.get("tokens")
            elif side == "cold":  # its own empty cache (the caches live in ``where``)
                proc = run_proc(audit_argv(corpus, tok, work / "cold-out", "auto"), where)
            else:
                proc = run_proc(audit_argv(corpus, tok, work / f"{side}-out", "auto" if side == "engine"
                                           else "tokenizers"), where, cache_dir=shared)
            times[side].append(proc.wall)
            cpu[side].append(proc.cpu)
            print(f"  {side:<6} run {r + 1}: {proc.wall:6.2f} s  {proc.cpu:6.2f} s CPU  {proc.rss_mb:7.0f} MiB",
                  file=sys.stderr)
    report = json.loads((work / "engine-out" / "report.json").read_text())
    cold_report = json.loads((work / "cold-out" / "report.json").read_text())
    med = {k: statistics.median(v) for k, v in times.items()}
    cores = {k: statistics.median(c / w for c, w in zip(cpu[k], times[k])) for k in sides}
    return {"median": med, "cores": cores, "cold_s": med["cold"],
            "same_rows": lengths_equal(work / "engine-out", work / "today-out")
            and lengths_equal(work / "cold-out", work / "today-out"),
            "tokens": totals(work / "engine-out"), "raw_tokens": raw_tokens,
            "counting": report["tokenizer"].get("counting", {}).get("input", {}),
            "cold_counting": cold_report["tokenizer"].get("counting", {}).get("input", {}),
            "phase": phase(corpus, tok, shared)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="long,short")
    parser.add_argument("--tokenizers", default=None, help="comma-separated names (default: all found)")
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "lengthscan-bench")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    size = "quick" if args.quick else "full"
    long_corpus = args.data_dir / "text" / size / "corpus.jsonl"
    if not long_corpus.exists():
        print(f"no corpus at {long_corpus}: run python bench/data.py first", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="lengthscan-count-bench-"))
    corpora = {"long": long_corpus, "short": short_corpus(long_corpus, args.data_dir / "text" / size / "short.jsonl")}
    toks = tokenizers(args.data_dir, args.data_dir / "count-bench")
    if args.tokenizers:
        toks = {k: v for k, v in toks.items() if k in args.tokenizers.split(",")}
    lines = []
    for cname in args.only.split(","):
        for tname, tok in toks.items():
            print(f"{cname} x {tname}", file=sys.stderr)
            try:
                got = bench_line(corpora[cname], tok, work / f"{cname}-{tname}", args.repeats)
            except SideFailed as exc:
                print(f"  failed: {exc}", file=sys.stderr)
                continue
            lines.append((cname, tname, got))
    table = render(lines, args, corpora)
    print(table)
    args.results.write_text(table)
    return 0


def render(lines, args, corpora) -> str:
    rows = sum(1 for _ in open(corpora["long"], encoding="utf-8"))
    short_rows = sum(1 for _ in open(corpora["short"], encoding="utf-8")) if "short" in args.only else 0
    out = [f"# Count-only engine: `python bench/count_bench.py{' --quick' if args.quick else ''}`", "",
           f"Median of {args.repeats} whole processes, interleaved (raw, cold, warm, today; the order rotates each "
           f"repeat). long: {rows:,} rows; "
           f"short: {short_rows:,} paragraphs of <= 300 characters. raw = `bench/raw_encode.py` "
           "(`encode_batch_fast`, the floor); warm = `lengthscan audit --full` (default `--count-engine auto`, the "
           "engine's proof cached by an earlier run); cold = the same as a first run (an empty cache of its own); "
           "today = the same with `--count-engine tokenizers`. Phase = the tokenize phase alone in one process.", "",
           "| corpus | tokenizer | engine | raw s | warm s | cold s | today s | raw/warm | raw/cold | cold/warm | "
           "today/warm | cores busy: raw / warm / cold | phase fast s | phase engine s | phase x | same rows | "
           "tokens = raw |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for cname, tname, g in lines:
        m, p, c = g["median"], g["phase"], g["cores"]
        proven = (g["counting"].get("engine") or "").startswith("tiktoken")
        ratio, cold = m["raw"] / m["engine"], m["raw"] / m["cold"]
        floor = 1.8 if proven else 1.0
        verdict = "PASS" if ratio >= floor else "FAIL"
        cold_verdict = "PASS" if cold >= floor else "FAIL"
        px = f"{p['fast_s'] / p['engine_s']:.2f}x" if p.get("engine_s") else "-"
        out.append(f"| {cname} | {tname} | {'proven' if proven else 'refused'} | {m['raw']:.1f} | {m['engine']:.1f} | "
                   f"{m['cold']:.1f} | {m['today']:.1f} | {ratio:.2f}x {verdict} | {cold:.2f}x {cold_verdict} | "
                   f"{m['cold'] / m['engine']:.2f}x | {m['today'] / m['engine']:.2f}x | "
                   f"{c['raw']:.2f} / {c['engine']:.2f} / {c['cold']:.2f} | {p['fast_s']:.1f} | "
                   f"{p['engine_s'] or 0:.1f} | {px} | {g['same_rows']} | {g['tokens'] == g['raw_tokens']} |")
    out += ["", "Goals (issue 32): raw/warm and raw/cold at least 1.8x where the engine is proven, at least 1.0x where "
            "it is refused; cold/warm at most 1.10x. Cores busy = CPU seconds (user + system) over wall seconds "
            "of the whole process, median.", "", "Why each engine was chosen (warm; cold in brackets):", ""]
    seen = set()
    for _, tname, g in lines:
        if tname not in seen:
            seen.add(tname)
            out.append(f"- {tname}: {g['counting'].get('reason', '?')} [{g['cold_counting'].get('reason', '?')}]")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
