"""Packing: lengthscan's simulation of TRL's packing against the installed trl's own
``pack_dataset`` on the same lengths, in one process each side timed separately.

    python bench/packing_bench.py [--rows 200000] [--max-length 2048] [--big 10000000]

Long-tailed lengths (log-normal, median about 400 tokens, a tail past L) stand for a corpus's
measured sequence lengths. Both sides must give identical packs (checked: seq_lengths of every
pack, in order). TRL needs the token lists themselves (its ``map`` moves every token); lengthscan
needs only the lengths. ``--big`` times the simulation alone on that many rows (TRL would take
minutes). Prints one table: seconds per side, rows per second, the ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def lengths_of(rows: int, seed: int = 0) -> np.ndarray:
    return np.maximum(np.random.default_rng(seed).lognormal(6.0, 1.0, rows).astype(np.int64), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--big", type=int, default=10_000_000)
    args = ap.parse_args()

    from datasets import Dataset, disable_progress_bars
    from trl import pack_dataset

    from lengthscan.pack.trl import pack_trl

    disable_progress_bars()
    lengths = lengths_of(args.rows)
    pack_trl(lengths[:2000], args.max_length, "bfd")  # numba compiles (or loads its cache) once
    ds = Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
    print(f"{args.rows:,} rows, {int(lengths.sum()):,} tokens, L = {args.max_length:,}")
    print(f"{'strategy':10} {'trl s':>8} {'lengthscan s':>13} {'ratio':>7}  identical")
    for strategy in ("bfd", "bfd_split", "wrapped"):
        t = time.perf_counter()
        ref = pack_dataset(ds, args.max_length, strategy)
        ref_sizes = [len(x) for x in ref["input_ids"]]
        trl_s = time.perf_counter() - t
        t = time.perf_counter()
        mine = pack_trl(lengths, args.max_length, strategy)
        ours_s = time.perf_counter() - t
        same = mine.pack_lengths().tolist() == ref_sizes
        if strategy != "wrapped":
            o = mine.offsets
            same = same and ref["seq_lengths"] == [mine.seq_lengths[o[p]:o[p + 1]].tolist() for p in range(mine.count)]
        print(f"{strategy:10} {trl_s:8.2f} {ours_s:13.3f} {trl_s / ours_s:6.0f}x  {same}")
    if args.big:
        big = lengths_of(args.big, seed=1)
        for strategy in ("bfd", "bfd_split", "wrapped"):
            t = time.perf_counter()
            packs = pack_trl(big, args.max_length, strategy)
            s = time.perf_counter() - t
            print(f"{args.big:,} rows, {strategy}: {s:.1f} s ({args.big / s:,.0f} rows/s), {packs.count:,} packs")


if __name__ == "__main__":
    main()
