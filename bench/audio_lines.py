"""The audio lines: our header reads vs soundfile.info, librosa, lhotse and decoding; paths and bytes."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

from harness import evict, files_under, interleave
from lines import _ok, _pairs
from report import Row, median, seconds

# target: (op value) per baseline; None = reported, no target in the issue
TARGETS = {"soundfile": ">= 1.0", "librosa_duration": None, "lhotse": ">= 2.0", "librosa_load": ">= 50"}
LABELS = {"soundfile": "a plain soundfile.info loop", "librosa_duration": "librosa.get_duration(path=)",
          "lhotse": "lhotse Recording.from_file", "librosa_load": "decoding (librosa.load, sr=None)"}


def _manifest(b, n: int) -> tuple[Path, list[Path]]:
    """The first ``n`` rows of the speech manifest, with absolute paths, in the scratch directory."""
    speech = b.data / "speech"
    with open(speech / "manifest.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))[:n]
    path = b.scratch / f"manifest{n}.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "text"])
        w.writerows([str(speech / r["path"]), r["text"]] for r in rows)
    return path, [speech / r["path"] for r in rows]


def _files_per_s(runs: list) -> str:
    ok = _ok(runs)[0]
    return f"{median([p.out['files'] / p.out['loop_s'] for p in ok]):,.0f} files/s" if ok else "-"


def _loop_row(line: str, ours: list, base: list, target: str | None, note: str = "") -> Row:
    ratios, err = _pairs(ours, base, lambda o, x: x.out["loop_s"] / o.out["loop_s"])
    bok, ook = _ok(base)[0], _ok(ours)[0]
    if bok and ook and bok[0].out["files"] == ook[0].out["files"]:
        a, c = ook[0].out["audio_seconds"], bok[0].out["audio_seconds"]
        if abs(a - c) > 1e-3 * max(a, 1):
            note = (note + "; " if note else "") + f"baseline's total duration {c / a - 1:+.2%} off ours"
    if bok and bok[0].out.get("failed"):
        note = (note + "; " if note else "") + (f"baseline failed on {bok[0].out['failed']} files: "
                                                f"{bok[0].out.get('first_error', '')[:80]}")
    return Row(line, _files_per_s(ours), _files_per_s(base), ratios, target, note=note, error=err)


def _one_pass_wall(p) -> float:
    # a plain script makes one pass: take the extra passes out of the whole-process time
    return p.wall - (p.out.get("passes", 1) - 1) * p.out["loop_s"]


def _whole_row(line: str, ours: list, base: list) -> Row:
    ratios, err = _pairs(ours, base, lambda o, x: _one_pass_wall(x) / o.wall)
    oo, bo = _ok(ours)[0], _ok(base)[0]
    # info, not a target: the audio target is the loop over files (the lines above); a whole
    # `lengthscan audit` also parses its source (a CSV manifest through datasets: ~0.7 s of imports)
    # and writes lengths.parquet and the HTML report, which a 10-line script does not
    return Row(line, seconds([p.wall for p in oo]) if oo else "-",
               seconds([_one_pass_wall(p) for p in bo]) if bo else "-", ratios, None, error=err,
               note="info: includes reading the source and writing the report",
               cpu_ratios=[(x.cpu - x.wall + _one_pass_wall(x)) / o.cpu for o, x in zip(oo, bo)]
               if len(oo) == len(bo) else [])


def _seconds_note(ours: list, base: list) -> str:
    oo, bo = _ok(ours)[0], _ok(base)[0]
    if not oo or not bo:
        return ""
    a, c = oo[0].out["audio_seconds"], bo[0].out["audio_seconds"]
    return f"total {a / 3600:.2f} h, {'same as' if abs(a - c) < 1e-3 * max(a, 1) else 'DIFFERS from'} soundfile's"


def path_lines(b) -> list[Row]:
    n = 400 if b.quick else b.meta["speech"]["files"]
    k = 100 if b.quick else 400  # decoding is slow: the first k files (k/4 clips in 4 formats)
    manifest, files = _manifest(b, n)
    small, small_files = _manifest(b, k)

    def loop(method, m):
        return b.script("audio_loop.py", method, "--manifest", str(m))

    def cold(fs):
        return lambda: evict(fs)

    sides = {"ours": b.side(loop("ours", manifest), before=cold(files)),
             "soundfile": b.side(loop("soundfile", manifest), before=cold(files)),
             "ours (warm)": b.side(loop("ours", manifest) + ["--passes", "3"]),
             "soundfile (warm)": b.side(loop("soundfile", manifest) + ["--passes", "3"]),
             "librosa_duration": b.side(loop("librosa_duration", manifest), before=cold(files))}
    has_lhotse = importlib.util.find_spec("lhotse") is not None
    if has_lhotse:
        sides["lhotse"] = b.side(loop("lhotse", manifest), before=cold(files))
    sides["ours (first k)"] = b.side(loop("ours", small), before=cold(small_files))
    sides["librosa_load"] = b.side(loop("librosa_load", small), before=cold(small_files))
    sides["lengthscan audit (CLI)"] = b.side(b.lengthscan("audit", str(manifest), "--audio", "path", "--out", "out",
                                                          "--quiet", "--no-cache"), before=cold(files))
    runs = interleave(sides, b.repeats, "audio paths")
    ours = runs["ours"]
    rows = [_loop_row(f"audio durations, {n:,} files by path, page cache cold: read_infos vs {LABELS['soundfile']}",
                      ours, runs["soundfile"], ">= 1.0", _seconds_note(ours, runs["soundfile"])),
            _loop_row(f"the same, page cache warm: read_infos vs {LABELS['soundfile']}",
                      runs["ours (warm)"], runs["soundfile (warm)"], ">= 1.0"),
            _loop_row(f"the same (cold) vs {LABELS['librosa_duration']}", ours, runs["librosa_duration"], None)]
    if has_lhotse:
        rows.append(_loop_row(f"the same (cold) vs {LABELS['lhotse']}", ours, runs["lhotse"], ">= 2.0"))
    else:
        rows.append(Row(f"the same vs {LABELS['lhotse']}", "-", "-", error="lhotse not available (pip install lhotse)"))
    rows.append(_loop_row(f"the first {k} files (cold) vs {LABELS['librosa_load']}", runs["ours (first k)"],
                          runs["librosa_load"], ">= 50"))
    rows.append(_whole_row(f"whole process: `lengthscan audit` of the {n:,}-file manifest vs a plain "
                           "soundfile.info script (s)", runs["lengthscan audit (CLI)"], runs["soundfile"]))
    return rows


def bytes_lines(b) -> list[Row]:
    arrow = b.data / "speech" / "audio_disk"
    n = b.meta["speech"]["files"]
    k = 100 if b.quick else 400

    def loop(method, *extra):
        return b.script("audio_loop.py", method, "--arrow", str(arrow), *extra)

    def cold():
        return evict(files_under(arrow))

    # the bytes are in memory before the clock starts: 3 passes a process steady the small times
    sides = {"ours": b.side(loop("ours", "--passes", "3"), before=cold),
             "soundfile": b.side(loop("soundfile", "--passes", "3"), before=cold)}
    has_lhotse = importlib.util.find_spec("lhotse") is not None
    if has_lhotse:
        sides["lhotse"] = b.side(loop("lhotse", "--passes", "3"), before=cold)
    sides["ours (first k)"] = b.side(loop("ours", "--limit", str(k)), before=cold)
    sides["librosa_load"] = b.side(loop("librosa_load", "--limit", str(k)), before=cold)
    sides["lengthscan audit (CLI)"] = b.side(b.lengthscan("audit", str(arrow), "--audio", "audio", "--out", "out",
                                                          "--quiet", "--no-cache"), before=cold)
    runs = interleave(sides, b.repeats, "audio bytes")
    ours = runs["ours"]
    rows = [_loop_row(f"audio as bytes in Arrow ({n:,} values): read_infos vs a soundfile.info(BytesIO) loop",
                      ours, runs["soundfile"], ">= 1.0", _seconds_note(ours, runs["soundfile"]))]
    if has_lhotse:
        rows.append(_loop_row("the same bytes vs lhotse Recording.from_bytes", ours, runs["lhotse"], ">= 2.0"))
    rows.append(_loop_row(f"the first {k} values vs decoding (librosa.load(BytesIO), sr=None)",
                          runs["ours (first k)"], runs["librosa_load"], ">= 50"))
    rows.append(_whole_row("whole process: `lengthscan audit` of the Arrow dataset vs a plain script "
                           "(load_from_disk + soundfile.info(BytesIO) loop) (s)",
                           runs["lengthscan audit (CLI)"], runs["soundfile"]))
    return rows


def audio_lines(b) -> list[Row]:
    """Paths (cold and warm page cache) and bytes in Arrow, each against every baseline."""
    return path_lines(b) + bytes_lines(b)
