"""The lengthscan benchmark: whole processes, interleaved, medians of ratios; prints one table.

    python bench/data.py            # once: builds the corpora (~3 minutes)
    python bench/run.py --quick     # a few minutes
    python bench/run.py             # the full table (~25 minutes on 2 cores)
    python bench/run.py --only text,audio --repeats 5

Every side of every comparison is a fresh process (``python -m lengthscan ...`` or a small
baseline script in ``bench/``), run A B A B ... ``--repeats`` times; a line's ratio is the median of
the per-repeat ratios (range in brackets). "Cold" runs get their own empty ``HF_DATASETS_CACHE``
and ``LENGTHSCAN_CACHE`` (and ``--no-cache``); audio runs start with the files evicted from the
page cache (``posix_fadvise(DONTNEED)``) unless the line says warm. Peak memory is the maximum
resident set size as ``/usr/bin/time -v`` reports it (``wait4``'s when that is missing). The table
goes to stdout and to ``bench/results.md`` (``bench/results-quick.md`` with ``--quick``).
See bench/README.md for what each line means.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import data as bench_data
import report
from audio_lines import audio_lines
from harness import Bench
from lines import GROUPS as TEXT_GROUPS

GROUPS = {**TEXT_GROUPS, "audio": audio_lines}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=bench_data.DEFAULT_DIR,
                    help=f"where bench/data.py built the data (default {bench_data.DEFAULT_DIR})")
    ap.add_argument("--quick", action="store_true", help="the 10k-row corpus and fewer audio files: a few minutes")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side (default 3)")
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups: {','.join(GROUPS)}")
    ap.add_argument("--results", type=Path, default=None,
                    help="markdown copy of the table (default bench/results.md, bench/results-quick.md with --quick)")
    args = ap.parse_args(argv)
    only = [g.strip() for g in args.only.split(",") if g.strip()]
    if set(only) - set(GROUPS):
        ap.error(f"unknown group(s) {sorted(set(only) - set(GROUPS))}; choose from {', '.join(GROUPS)}")
    # builds what is missing or out of date (a no-op when the data is there)
    bench_data.build(args.data_dir, clips=300, min_rows=50_000, force=False)
    results = args.results or BENCH / ("results-quick.md" if args.quick else "results.md")

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lengthscan-bench-") as scratch:
        bench = Bench(args.data_dir, quick=args.quick, repeats=args.repeats, scratch=Path(scratch))
        report.warm_up(bench)
        rows = []
        for group in only:
            print(f"[{group}]", file=sys.stderr, flush=True)
            rows += GROUPS[group](bench)
    text = report.render(bench, rows, time.perf_counter() - t0)
    print(text)
    results.write_text(text)
    print(f"(written to {results})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
