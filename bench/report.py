"""The benchmark's table: one ``Row`` a line, the header (machine, data), markdown out."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from harness import BENCH, PY


@dataclass
class Row:
    """One line of the table. ``ratios`` holds one ratio per repeat; ``target`` is like ">= 0.9"."""

    line: str
    ours: str
    baseline: str
    ratios: list[float] = field(default_factory=list)
    target: str | None = None
    note: str = ""
    failed: str | None = None  # a correctness failure (e.g. rows differ): FAIL whatever the ratio
    error: str | None = None  # a side did not run: no ratio
    cpu_ratios: list[float] = field(default_factory=list)  # the same ratio in CPU seconds (whole processes)

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    def result(self) -> str:
        if self.error:
            return "n/a"
        if self.failed:
            return "FAIL"
        if self.target is None or self.ratio is None:
            return "info"
        op, value = self.target.split()
        ok = self.ratio >= float(value) if op == ">=" else self.ratio <= float(value)
        return "PASS" if ok else "FAIL"

    def cells(self) -> list[str]:
        if self.ratio is None:
            ratio = "-"
        elif len(self.ratios) > 1:
            ratio = f"{self.ratio:.2f}x [{min(self.ratios):.2f}-{max(self.ratios):.2f}]"
        else:
            ratio = f"{self.ratio:.2f}x"
        cpu = f"{statistics.median(self.cpu_ratios):.2f}x" if self.cpu_ratios else "-"
        target = f"{self.target.replace('>=', '≥').replace('<=', '≤')}x" if self.target else "-"
        line = self.line + (f" ({self.note})" if self.note else "")
        if self.error:
            line += f" [{self.error}]"
        if self.failed:
            line += f" [{self.failed}]"
        return [line, self.ours, self.baseline, ratio, cpu, target, self.result()]


def median(values) -> float:
    return statistics.median(values)


def seconds(values) -> str:
    return f"{median(values):.2f} s"


def rate(count: float, secs) -> str:
    return f"{count / median(secs):,.0f}/s"


def mib(values) -> str:
    return f"{median(values):,.0f} MiB"


# ----------------------------------------------------------------------------------------- header


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ram_gib() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("lengthscan", "tokenizers", "transformers", "datasets", "pyarrow", "soundfile", "librosa", "lhotse"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} -")
    return ", ".join(out)


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "../lengthscan"], cwd=BENCH,
                               capture_output=True, text=True, check=False).stdout.strip()
        return sha + (" + uncommitted changes in lengthscan/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _data_lines(bench) -> list[str]:
    t = bench.meta["text"][bench.tier]
    s = bench.meta["speech"]
    src = ", ".join(f"{k} {v:,}" for k, v in t["sources"].items())
    it, tt = t["text_tokens"], t["summary_tokens"]
    tok = (f"input tokens p50 {it['p50']:,} / p90 {it['p90']:,} / p99 {it['p99']:,} / max {it['max']:,}; "
           f"target p50 {tt['p50']} / p99 {tt['p99']} / max {tt['max']:,}")
    text = (f"- text ({bench.tier}): {t['rows']:,} rows ({src}), {t['chars'] / 1e6:,.1f} M characters, "
            f"{it['total'] + tt['total']:,} tokens; {tok} (byte-level BPE, 16k vocab, trained on the corpus)")
    speech = (f"- speech: {s['clips']} espeak-ng clips x {len(s['formats'])} formats ({'/'.join(s['formats'])}) "
              f"= {s['files']:,} files, {s['bytes'] / 2**20:,.0f} MiB, {s['seconds_total'] / 60:,.0f} min per "
              f"format; clip seconds p50 {s['seconds']['p50']} / p90 {s['seconds']['p90']} / max {s['seconds']['max']}")
    return [text, speech]


def load_average() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def header(bench, elapsed: float) -> list[str]:
    mode = "quick" if bench.quick else "full"
    run = (f"- run: {time.strftime('%Y-%m-%d %H:%M')}, {elapsed / 60:.1f} min, {bench.repeats} repeats a side, "
           f"commit {_commit()}")
    machine = (f"- machine: {bench.cores} cores ({_cpu_model()}), {_ram_gib():.0f} GiB RAM, Python "
               f"{platform.python_version()}, {platform.system()} {platform.release()}; load average (1/5/15 min) "
               f"{bench.load_start} at the start, {load_average()} at the end")
    how = ("- every side is a fresh process; ratio = median of the per-repeat ratios [min-max] of wall time (or "
           "RSS), > 1 is better for speed lines ('baseline / ours'), < 1 for the 10x lines ('10x / 1x'); "
           "CPU ratio: the same in CPU seconds (user + system) of the whole processes, which other load on the "
           "machine disturbs less; targets are judged on wall time")
    return [f"## lengthscan benchmark ({mode})", "", run, machine, f"- {_versions()}", *_data_lines(bench), how, ""]


def render(bench, rows: list[Row], elapsed: float) -> str:
    """Header, the markdown table, then the notes the lines left."""
    lines = header(bench, elapsed)
    lines.append("| line | ours | baseline | ratio | CPU ratio | target | result |")
    lines.append("|---|---:|---:|---:|---:|---:|:---:|")
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |")
    counts = {r: sum(row.result() == r for row in rows) for r in ("PASS", "FAIL", "info", "n/a")}
    lines += ["", "Targets: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)]
    # before the first run the load is other work's; at the end, over 5 minutes, ours is at most ~cores
    before = float(bench.load_start.split("/")[0]) if bench.load_start != "?" else 0.0
    after = float(load_average().split("/")[1]) if load_average() != "?" else 0.0
    if before > bench.cores / 2 or after > bench.cores:
        bench.notes.insert(0, f"the machine was busy with other work (load average {before:.1f} before the first "
                              f"run, {after:.1f} over the last 5 minutes, on {bench.cores} cores): wall-time ratios "
                              "are noisy (see the ranges); the CPU ratio column is steadier")
    if bench.notes:
        lines += ["", *[f"- {n}" for n in bench.notes]]
    return "\n".join(lines) + "\n"


def warm_up(bench) -> None:
    """Import the libraries once and read the data once, so no side pays for a cold disk alone."""
    bench.load_start = load_average()
    t0 = time.perf_counter()
    imports = "import lengthscan.cli, lengthscan.engines.api, transformers, datasets, tokenizers, librosa, soundfile"
    subprocess.run([PY, "-c", imports],
                   check=False, capture_output=True, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    for path in bench.text.glob("corpus*"):
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    print(f"warm-up {time.perf_counter() - t0:.1f} s", file=sys.stderr)
