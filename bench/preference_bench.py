"""The preference line: a whole-process audit of DPO pairs against TRL's own dataset preparation.

    python bench/preference_bench.py                  # 20,000 pairs, 3 repeats
    python bench/preference_bench.py --rows 2000 --repeats 1

Corpus: conversational pairs built from the bench's real texts (``bench/data.py``): a prompt of 1
to 3 exchanges, a chosen and a rejected answer of different lengths (some sharing their start); the
chat bench's byte-level BPE and TRL's ``qwen3.jinja``. Sides, each a fresh process, interleaved:

* ``lengthscan audit --prompt prompt --chosen chosen --rejected rejected --full --no-cache``, cold
  (a first run: an empty cache of its own) and warm (the cache an earlier run filled);
* ``bench/dpo_prep.py``: ``DPOTrainer`` built over ``load_dataset("json")`` of the corpus, its
  ``_prepare_dataset`` (extract, tokenize prompt, prompt+chosen, prompt+rejected per row).

Per side: wall and CPU seconds and peak RSS; the prompt, chosen and rejected lengths must be
identical on every row. Ratios are medians of per-repeat ratios (goal: at least 2x).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import data as bench_data  # noqa: E402
from chat_bench import _train  # noqa: E402
from harness import rotated_runs, run_proc  # noqa: E402

OURS = "lengthscan audit"
TRL = "DPOTrainer preparation"


def build(folder: Path, rows: int) -> tuple[Path, Path, Path]:
    """(corpus, tokenizer directory, template)."""
    import trl

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / f"pairs{rows}.jsonl"
    tok = folder / "chat-tok"
    template = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"
    if corpus.exists() and (tok / "tokenizer.json").exists():  # built before (seed 0: the same)
        return corpus, tok, template
    texts = [r["text"] for r in bench_data.text_rows(max(rows, 20_000))]
    if not (tok / "tokenizer.json").exists():
        _train(texts[:20_000], tok)
    rng = random.Random(0)
    lines = []
    for i in range(rows):
        prompt = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            prompt.append({"role": "user", "content": rng.choice(texts)[:rng.randint(20, 1500)]})
            prompt.append({"role": "assistant", "content": rng.choice(texts)[:rng.randint(5, 800)]})
        prompt.pop()
        chosen = rng.choice(texts)[:rng.randint(5, 2000)]
        rejected = chosen[:rng.randint(0, len(chosen))] + rng.choice(texts)[:rng.randint(5, 800)]
        lines.append(json.dumps({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                                 "rejected": [{"role": "assistant", "content": rejected}]}, ensure_ascii=False) + "\n")
    corpus.write_text("".join(lines), encoding="utf-8")
    return corpus, tok, template


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=bench_data.DEFAULT_DIR / "chat")
    args = ap.parse_args(argv)
    corpus, tok, template = build(args.data_dir, args.rows)
    py = sys.executable

    def ours(w):
        return [py, "-m", "lengthscan", "audit", str(corpus), "--tokenizer", str(tok), "--chat-template", str(template),
                "--prompt", "prompt", "--chosen", "chosen", "--rejected", "rejected", "--full", "--no-cache",
                "--quiet", "--out", str(w / "out")]

    def trl_side(w):
        return [py, str(BENCH / "dpo_prep.py"), str(corpus), str(tok), str(template), str(w / "lengths.json")]

    sides = [(f"{OURS} (cold)", ours, False), (f"{OURS} (warm)", ours, True), (TRL, trl_side, False)]
    with tempfile.TemporaryDirectory(prefix="lengthscan-preference-bench-") as scratch:
        scratch = Path(scratch)
        shared = scratch / "shared-cache"
        run_proc(ours(scratch / "warm-up"), scratch / "warm-up", cache_dir=shared)
        runs = rotated_runs(sides, args.repeats, scratch, shared,
                            lambda p: f"{p.wall:7.2f} s wall {p.cpu:7.2f} s CPU {p.rss_mb:6.0f} MiB")
        if runs is None:
            return 1
        same = _identical(runs)
    print(_table(runs, args, same))
    return 0


def _table(runs: dict, args, same: bool) -> str:
    med = lambda procs, attr: statistics.median(getattr(p, attr) for p in procs)  # noqa: E731
    out = [f"\npreference audit, {args.rows:,} conversational pairs (TRL qwen3.jinja), {args.repeats} repeats, "
           f"interleaved; prompt, chosen and rejected lengths identical on every row: {same}", "",
           "| side | wall s | CPU s | peak RSS MiB |", "|---|---:|---:|---:|"]
    for name, procs in runs.items():
        out.append(f"| {name} | {med(procs, 'wall'):.2f} | {med(procs, 'cpu'):.2f} | {med(procs, 'rss_mb'):.0f} |")
    out += ["", "| ratio (goal >= 2x) | wall (median [range]) | CPU |", "|---|---:|---:|"]
    for mode in ("cold", "warm"):
        mine = runs[f"{OURS} ({mode})"]
        r = [b.wall / a.wall for a, b in zip(mine, runs[TRL])]
        c = [b.cpu / a.cpu for a, b in zip(mine, runs[TRL])]
        out.append(f"| {TRL} / {OURS} ({mode}) | {statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}] | "
                   f"{statistics.median(c):.2f}x |")
    return "\n".join(out)


def _identical(runs: dict) -> bool:
    import pyarrow.parquet as pq

    def lengths(proc) -> list:
        out = proc.workdir / "out" / "lengths.parquet"
        if out.exists():
            t = pq.read_table(out, columns=["prompt_tokens", "chosen_tokens", "rejected_tokens"]).to_pydict()
            return [list(x) for x in zip(t["prompt_tokens"], t["chosen_tokens"], t["rejected_tokens"])]
        return json.loads((proc.workdir / "lengths.json").read_text())

    mine = lengths(runs[f"{OURS} (cold)"][0])
    same = True
    for name, procs in runs.items():
        if any(lengths(p) != mine for p in procs):
            print(f"  lengths differ from {name}", file=sys.stderr)
            same = False
    return same


if __name__ == "__main__":
    sys.exit(main())
