"""The chat line: a whole-process conversation audit against the scripts a user would write.

    python bench/chat_bench.py                    # 50,000 conversations, 3 repeats
    python bench/chat_bench.py --rows 5000 --repeats 1

Corpus: conversations built from the bench's real texts (Debian package descriptions, man pages,
the standard library's docstrings; ``bench/data.py``), 1 to 12 exchanges with a long tail of
lengths, a system prompt on some; a byte-level BPE trained on those texts with the control tokens
of ChatML templates; TRL's ``qwen3_training.jinja`` (with ``{% generation %}`` blocks), so every
side computes the assistant mask. Sides, each a fresh process, interleaved, the order rotating
each repeat:

* ``lengthscan audit --messages messages --chat-template ... --full --no-cache``, in one process
  (``--num-proc 1``) and as it runs by default (from 2,000 conversations: one process per core, at
  most 4, the workers holding no tokenizer; the table says how many), each cold (a first run: an
  empty cache of its own) and warm (a cache an earlier run filled, as every later run finds it;
  ``--no-cache`` still measures every row);
* ``bench/chat_loop.py``: a loop of ``apply_chat_template(..., return_assistant_tokens_mask=True)``;
* ``bench/chat_map.py``: ``load_dataset("json")`` + ``Dataset.map`` of the same, num_proc 1 and 2.

Per side: wall and CPU seconds, the largest single process's peak RSS, and the peak over time of
the memory summed over the process and all its descendants (RSS, and PSS, which shares a page
among the processes mapping it: ``harness.TreeMemory``). Counts must be identical (sequence and
completion tokens, every row, every run). Peak RSS of the audit is compared with a run on a tenth
of the rows (``--scale``). Ratios are medians of per-repeat ratios.
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
from harness import rotated_runs, run_proc  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def build(folder: Path, rows: int, scale: int) -> tuple[Path, Path, Path, Path]:
    """(corpus, its first rows / ``scale``, tokenizer directory, template)."""
    import trl

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / f"chat{rows}.jsonl"
    small = folder / f"chat{rows}-first{rows // scale}.jsonl"  # the RSS check: 1/scale of the rows
    tok = folder / "chat-tok"
    template = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
    if corpus.exists() and small.exists() and (tok / "tokenizer.json").exists():  # built before (seed 0: the same)
        return corpus, small, tok, template
    texts = [r["text"] for r in bench_data.text_rows(rows)]
    rng = random.Random(0)
    lines = []
    for i in range(rows):
        msgs = [{"role": "system", "content": rng.choice(texts)[:300]}] if rng.random() < 0.3 else []
        for _ in range(rng.choice([1, 1, 1, 1, 2, 2, 3, 4, 6, 12])):
            msgs.append({"role": "user", "content": rng.choice(texts)[:rng.randint(20, 3000)]})
            msgs.append({"role": "assistant", "content": rng.choice(texts)[:rng.randint(5, 4000)]})
        lines.append(json.dumps({"id": i, "messages": msgs}, ensure_ascii=False) + "\n")
    corpus.write_text("".join(lines), encoding="utf-8")
    small.write_text("".join(lines[:rows // scale]), encoding="utf-8")
    if not (tok / "tokenizer.json").exists():
        _train(texts[:20_000], tok)
    return corpus, small, tok, template


def _train(texts: list[str], out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=16_000, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in ADDED])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))


OURS = "lengthscan audit --num-proc 1"
OURS2 = "lengthscan audit (default)"
LOOP = "loop apply_chat_template"
MAP1 = "Dataset.map num_proc=1"
MAP2 = "Dataset.map num_proc=2"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--scale", type=int, default=10, help="the RSS check compares with 1/scale of the rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-map1", action="store_true", help="leave out Dataset.map num_proc=1 (the slowest side)")
    ap.add_argument("--data-dir", type=Path, default=bench_data.DEFAULT_DIR / "chat")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="a tokenizer folder to measure with instead of the bench's 16k BPE (its vocabulary must "
                         "hold the template's special tokens), e.g. count_bench.py's o200k-qwen3.5")
    args = ap.parse_args(argv)
    corpus, small, tok, template = build(args.data_dir, args.rows, args.scale)
    tok = args.tokenizer or tok
    py = sys.executable

    def ours(*extra):
        return lambda w: [py, "-m", "lengthscan", "audit", str(corpus), "--tokenizer", str(tok), "--chat-template",
                          str(template), "--messages", "messages", "--full", "--no-cache", "--quiet",
                          "--out", str(w / "out"), *extra]

    def script(name, *extra):
        return lambda w: [py, str(BENCH / name), str(corpus), str(tok), str(template), str(w / "lengths.json"),
                          *extra]

    argvs = {OURS: ours("--num-proc", "1"), OURS2: ours(), LOOP: script("chat_loop.py"),
             MAP1: script("chat_map.py", "1"), MAP2: script("chat_map.py", "2")}
    if args.no_map1:
        del argvs[MAP1]
    # (name, argv, warm): lengthscan cold (an empty cache of its own: a first run) and warm (a cache an
    # earlier run filled: the tokenizer's proven fast path, as every later run finds it); scripts have none
    sides = [(f"{OURS} (cold)", argvs[OURS], False), (f"{OURS} (warm)", argvs[OURS], True),
             (f"{OURS2} (cold)", argvs[OURS2], False), (f"{OURS2} (warm)", argvs[OURS2], True),
             *((name, argv, False) for name, argv in argvs.items() if not name.startswith("lengthscan"))]
    with tempfile.TemporaryDirectory(prefix="lengthscan-chat-bench-") as scratch:
        scratch = Path(scratch)
        shared = scratch / "shared-cache"
        run_proc(argvs[OURS](scratch / "warm-up"), scratch / "warm-up", cache_dir=shared)
        runs = rotated_runs(sides, args.repeats, scratch, shared, lambda p: (
            f"{p.wall:7.2f} s wall {p.cpu:7.2f} s CPU {p.rss_mb:6.0f} MiB largest process, {p.tree_rss_mb:6.0f} MiB "
            f"RSS / {p.tree_pss_mb:6.0f} MiB PSS summed over {p.tree_procs} processes"))
        if runs is None:
            return 1
        same = _identical(runs, scratch)
        small_argv = [str(small) if x == str(corpus) else x for x in argvs[OURS](scratch / "small")]
        small_run = run_proc(small_argv, scratch / "small")
        processes = _processes(runs[f"{OURS2} (warm)"] + runs[f"{OURS2} (cold)"])
    print(_table(runs, args, same, small_run, processes))
    return 0


def _med(procs, attr: str) -> float:
    return statistics.median(getattr(p, attr) for p in procs)


def _table(runs: dict, args, same: bool, small_run, processes: str) -> str:
    """The sides' medians, then ratios (medians of per-repeat ratios, [range])."""
    tokenizer = f"tokenizer {args.tokenizer.name}" if args.tokenizer else "the bench's 16k BPE"
    out = [f"\nchat audit, {args.rows:,} conversations (TRL qwen3_training.jinja, assistant masks, {tokenizer}), "
           f"{args.repeats} "
           f"repeats, interleaved, the order rotating; counts identical on every row, every side: {same}", "",
           "| side | wall s | CPU s | largest process MiB | summed RSS MiB | summed PSS MiB | processes |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, procs in runs.items():
        out.append(f"| {name} | {_med(procs, 'wall'):.2f} | {_med(procs, 'cpu'):.2f} | {_med(procs, 'rss_mb'):.0f} | "
                   f"{_med(procs, 'tree_rss_mb'):.0f} | {_med(procs, 'tree_pss_mb'):.0f} | "
                   f"{max(p.tree_procs for p in procs)} |")
    out += ["", "| ratio | wall (median [range]) | CPU |", "|---|---:|---:|"]

    def ratio(label, num, den, attr="wall"):
        if num not in runs or den not in runs:
            return
        r = [getattr(b, attr) / getattr(a, attr) for a, b in zip(runs[den], runs[num])]
        c = [b.cpu / a.cpu for a, b in zip(runs[den], runs[num])]
        out.append(f"| {label} | {statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}] | "
                   f"{statistics.median(c):.2f}x |")

    for mode in ("warm", "cold"):
        for ours_name in (OURS, OURS2):
            for base in (LOOP, MAP2, MAP1):
                ratio(f"{base} / {ours_name} ({mode}): speed-up", base, f"{ours_name} ({mode})")
        ratio(f"{OURS} / {OURS2} ({mode}): speed-up of the default's processes", f"{OURS} ({mode})",
              f"{OURS2} ({mode})")
    out += ["", "| memory | summed RSS (median [range]) | summed PSS |", "|---|---:|---:|"]
    for mode in ("warm", "cold"):
        one, two = runs[f"{OURS} ({mode})"], runs[f"{OURS2} ({mode})"]
        r = [b.tree_rss_mb / a.tree_rss_mb for a, b in zip(one, two)]
        q = [b.tree_pss_mb / a.tree_pss_mb for a, b in zip(one, two) if a.tree_pss_mb]
        out.append(f"| the default ({processes} processes) / one process ({mode}; goal <= 1.5x) | "
                   f"{statistics.median(r):.2f}x "
                   f"[{min(r):.2f}-{max(r):.2f}] | {f'{statistics.median(q):.2f}x' if q else '-'} |")
    for base in (MAP2, LOOP):
        if base in runs:
            r = [b.tree_rss_mb / a.tree_rss_mb for a, b in zip(runs[f"{OURS2} (warm)"], runs[base])]
            out.append(f"| {base} / {OURS2} (warm) | {statistics.median(r):.2f}x | - |")
    big = _med(runs[f"{OURS} (cold)"], "rss_mb")
    out.append(f"| peak RSS of the audit, {args.rows:,} rows vs {args.rows // args.scale:,} ({args.scale}x the rows) | "
               f"{big / small_run.rss_mb:.2f}x ({big:.0f} / {small_run.rss_mb:.0f} MiB) | - |")
    return "\n".join(out)


def _processes(procs) -> str:
    """How many processes the default's runs measured with (``report.json``'s ``chat.processes``)."""
    seen = set()
    for proc in procs:
        report = proc.workdir / "out" / "report.json"
        shared = json.loads(report.read_text()).get("chat", {}).get("processes") if report.exists() else None
        seen.add(shared["processes"] if shared else 1)
    return "/".join(map(str, sorted(seen)))


def _identical(runs: dict, scratch: Path) -> bool:
    """Every side's (sequence, completion) per row equals the one-process audit's lengths.parquet."""
    import pyarrow.parquet as pq

    def counts(proc) -> list:
        out = proc.workdir / "out" / "lengths.parquet"
        if out.exists():
            table = pq.read_table(out, columns=["sequence_tokens", "completion_tokens"]).to_pydict()
            return [list(p) for p in zip(table["sequence_tokens"], table["completion_tokens"])]
        return json.loads((proc.workdir / "lengths.json").read_text())

    mine = counts(runs[f"{OURS} (cold)"][0])
    same = True
    for name, procs in runs.items():
        for proc in procs:
            if counts(proc) != mine:
                print(f"  counts differ from {name}", file=sys.stderr)
                same = False
                break
    return same


if __name__ == "__main__":
    sys.exit(main())
