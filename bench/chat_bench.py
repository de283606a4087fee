"""The chat line: a whole-process conversation audit against the scripts a user would write.

    python bench/chat_bench.py                    # 50,000 conversations, 3 repeats
    python bench/chat_bench.py --rows 5000 --repeats 1

Corpus: conversations built from the bench's real texts (Debian package descriptions, man pages,
the standard library's docstrings; ``bench/data.py``), 1 to 12 exchanges with a long tail of
lengths, a system prompt on some; a byte-level BPE trained on those texts with the control tokens
of ChatML templates; TRL's ``qwen3_training.jinja`` (with ``{% generation %}`` blocks), so every
side computes the assistant mask. Sides, each a fresh process, interleaved:

* ``lengthscan audit --messages messages --chat-template ... --full --no-cache``;
* ``bench/chat_loop.py``: a loop of ``apply_chat_template(..., return_assistant_tokens_mask=True)``;
* ``bench/chat_map.py``: ``load_dataset("json")`` + ``Dataset.map`` of the same, num_proc 1 and 2.

Counts must be identical (sequence and completion tokens, every row). Peak RSS of the audit is
compared with a run on a tenth of the rows (``--scale``). Ratios are medians of per-repeat ratios.
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
from harness import SideFailed, run_proc  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def build(folder: Path, rows: int, scale: int) -> tuple[Path, Path, Path, Path]:
    """(corpus, its first rows / ``scale``, tokenizer directory, template)."""
    import trl

    folder.mkdir(parents=True, exist_ok=True)
    texts = [r["text"] for r in bench_data.text_rows(rows)]
    rng = random.Random(0)
    corpus = folder / f"chat{rows}.jsonl"
    lines = []
    for i in range(rows):
        msgs = [{"role": "system", "content": rng.choice(texts)[:300]}] if rng.random() < 0.3 else []
        for _ in range(rng.choice([1, 1, 1, 1, 2, 2, 3, 4, 6, 12])):
            msgs.append({"role": "user", "content": rng.choice(texts)[:rng.randint(20, 3000)]})
            msgs.append({"role": "assistant", "content": rng.choice(texts)[:rng.randint(5, 4000)]})
        lines.append(json.dumps({"id": i, "messages": msgs}, ensure_ascii=False) + "\n")
    corpus.write_text("".join(lines), encoding="utf-8")
    small = folder / f"chat{rows}-first{rows // scale}.jsonl"  # the RSS check: 1/scale of the rows
    small.write_text("".join(lines[:rows // scale]), encoding="utf-8")
    tok = folder / "chat-tok"
    if not (tok / "tokenizer.json").exists():
        _train(texts[:20_000], tok)
    template = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--scale", type=int, default=10, help="the RSS check compares with 1/scale of the rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=bench_data.DEFAULT_DIR / "chat")
    args = ap.parse_args(argv)
    corpus, small, tok, template = build(args.data_dir, args.rows, args.scale)
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="lengthscan-chat-bench-") as scratch:
        scratch = Path(scratch)
        sides = {
            "lengthscan audit": lambda w: [py, "-m", "lengthscan", "audit", str(corpus), "--tokenizer", str(tok),
                                           "--chat-template", str(template), "--messages", "messages", "--full",
                                           "--no-cache", "--quiet", "--out", str(w / "out")],
            "loop apply_chat_template": lambda w: [py, str(BENCH / "chat_loop.py"), str(corpus), str(tok),
                                                   str(template), str(w / "lengths.json")],
            "Dataset.map num_proc=1": lambda w: [py, str(BENCH / "chat_map.py"), str(corpus), str(tok), str(template),
                                                 str(w / "lengths.json"), "1"],
            "Dataset.map num_proc=2": lambda w: [py, str(BENCH / "chat_map.py"), str(corpus), str(tok), str(template),
                                                 str(w / "lengths.json"), "2"],
        }
        runs: dict = {name: [] for name in sides}
        for rep in range(args.repeats):
            for name, argv_of in sides.items():
                work = scratch / f"{name.replace(' ', '_')}-{rep}"
                try:
                    p = run_proc(argv_of(work), work)
                except SideFailed as exc:
                    print(f"  {name}: FAILED {exc}", file=sys.stderr)
                    return 1
                runs[name].append(p)
                print(f"  {rep + 1}/{args.repeats} {name:<26} {p.wall:7.2f} s wall {p.cpu:7.2f} s CPU "
                      f"{p.rss_mb:6.0f} MiB", file=sys.stderr, flush=True)
        same = _identical(runs, scratch)
        small_argv = [str(small) if x == str(corpus) else x for x in sides["lengthscan audit"](scratch / "small")]
        small_run = run_proc(small_argv, scratch / "small")
    ours = runs["lengthscan audit"]
    print(f"\nchat audit, {args.rows:,} conversations (TRL qwen3_training.jinja, assistant masks), "
          f"{args.repeats} repeats; counts identical on every row: {same}")
    print("| line | ours | baseline | ratio (median [range]) | CPU ratio |")
    print("|---|---:|---:|---:|---:|")
    for name in list(sides)[1:]:
        ratios = [b.wall / a.wall for a, b in zip(ours, runs[name])]
        cpu = [b.cpu / a.cpu for a, b in zip(ours, runs[name])]
        print(f"| whole process vs {name} | {statistics.median(a.wall for a in ours):.2f} s | "
              f"{statistics.median(b.wall for b in runs[name]):.2f} s | {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}] | {statistics.median(cpu):.2f}x |")
    big = statistics.median(a.rss_mb for a in ours)
    print(f"| peak RSS of the audit, {args.rows:,} rows vs {args.rows // args.scale:,} ({args.scale}x the rows) | "
          f"{big:.0f} MiB | {small_run.rss_mb:.0f} MiB | {big / small_run.rss_mb:.2f}x | - |")
    return 0


def _identical(runs: dict, scratch: Path) -> bool:
    """Every side's (sequence, completion) per row equals the audit's lengths.parquet."""
    import pyarrow.parquet as pq

    ours = runs["lengthscan audit"][0].workdir / "out" / "lengths.parquet"
    table = pq.read_table(ours, columns=["sequence_tokens", "completion_tokens"]).to_pydict()
    mine = [list(p) for p in zip(table["sequence_tokens"], table["completion_tokens"])]
    for name, procs in runs.items():
        if name == "lengthscan audit":
            continue
        theirs = json.loads((procs[0].workdir / "lengths.json").read_text())
        if theirs != mine:
            print(f"  counts differ from {name}", file=sys.stderr)
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
