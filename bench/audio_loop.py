"""One way of getting audio durations, timed inside one fresh process.

    python bench/audio_loop.py METHOD (--manifest CSV | --arrow DIR) [--limit N]

METHOD is ``ours`` (``lengthscan.measure.audio.durations.read_infos``), ``soundfile`` (a plain ``soundfile.info``
loop), ``librosa_duration`` (``librosa.get_duration(path=)``), ``lhotse``
(``Recording.from_file``, or ``Recording.from_bytes`` for bytes) or ``librosa_load`` (decoding:
``librosa.load(sr=None)``, then ``len(y) / sr``). With ``--manifest`` the inputs are file paths
(relative to the manifest); with ``--arrow`` they are the ``{bytes, path}`` values of a
``save_to_disk`` dataset's ``audio`` column, read into memory before the clock starts.

Imports and reading the list happen before timing; only the duration loop is timed (``loop_s``, the
mean of ``--passes`` passes: only the first pass can find the files out of the page cache).
Prints one JSON line: the time, the file count, failures and the total seconds found.
"""

import argparse
import csv
import io
import json
import os
import sys
import time


def inputs(args):
    """Paths (manifest) or ``{"bytes", "path"}`` dicts (Arrow), in order."""
    if args.manifest:
        base = os.path.dirname(os.path.abspath(args.manifest))
        with open(args.manifest, newline="", encoding="utf-8") as fh:
            items = [os.path.join(base, row["path"]) for row in csv.DictReader(fh)]
    else:
        import datasets

        # the stored {bytes, path} structs straight from the Arrow table: nothing decoded
        items = datasets.load_from_disk(args.arrow).data.table.column("audio").to_pylist()
    return items[: args.limit] if args.limit else items


def method(name, from_bytes):
    """A function from one input to its duration in seconds (None where it found none)."""
    if name == "soundfile":
        import soundfile as sf

        if from_bytes:
            return lambda v: sf.info(io.BytesIO(v["bytes"])).duration
        return lambda p: sf.info(p).duration
    if name == "librosa_duration":
        import librosa

        if from_bytes:
            raise SystemExit("librosa.get_duration(path=) needs a path")
        return lambda p: librosa.get_duration(path=p)
    if name == "librosa_load":
        import librosa

        def decode(v):
            y, sr = librosa.load(io.BytesIO(v["bytes"]) if from_bytes else v, sr=None, mono=False)
            return y.shape[-1] / sr

        return decode
    if name == "lhotse":
        from lhotse import Recording

        if from_bytes:
            return lambda v: Recording.from_bytes(v["bytes"], recording_id=v["path"]).duration
        return lambda p: Recording.from_file(p).duration
    raise SystemExit(f"unknown method {name}")


def run(args):
    from_bytes = args.arrow is not None
    items = inputs(args)
    if args.method == "ours":
        from lengthscan.measure.audio.durations import read_infos

        read_infos(items[:1])  # import-time work outside the clock, as for the others
        t0 = time.perf_counter()
        for _ in range(args.passes):
            infos = read_infos(items)
        loop_s = (time.perf_counter() - t0) / args.passes
        secs = [i.seconds for i in infos]
        failed = sum(s is None for s in secs)
    else:
        fn = method(args.method, from_bytes)
        t0 = time.perf_counter()
        for _ in range(args.passes):
            secs, failed, first_error = [], 0, None
            for item in items:
                try:
                    secs.append(fn(item))
                except Exception as exc:  # noqa: BLE001 - a baseline failing on a file is counted, not fatal
                    failed += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"[:200]
        loop_s = (time.perf_counter() - t0) / args.passes
    total = sum(s for s in secs if s is not None)
    out = {"method": args.method, "files": len(items), "loop_s": loop_s, "passes": args.passes, "failed": failed,
           "audio_seconds": round(total, 3)}
    if args.method != "ours" and failed:
        out["first_error"] = first_error
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("method")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--manifest")
    src.add_argument("--arrow")
    ap.add_argument("--limit", type=int, default=None, help="only the first N inputs")
    ap.add_argument("--passes", type=int, default=1, help="time N passes over the inputs; report one's mean")
    print(json.dumps(run(ap.parse_args())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
