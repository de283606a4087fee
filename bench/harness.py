"""Processes for the benchmark: one side run cold as a whole process, sides run in turn, the context."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PY = sys.executable
TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
TIMEOUT = 3600


class SideFailed(Exception):
    """A measured process exited non-zero (its line reports this instead of a number)."""


@dataclass
class Proc:
    """One measured process: wall seconds, peak RSS in MiB, the JSON line it printed last."""

    wall: float
    rss_mb: float
    out: dict = field(default_factory=dict)
    workdir: Path | None = None
    cpu: float = 0.0  # user + system seconds of the process tree
    tree_rss_mb: float = 0.0  # peak over time of the summed RSS of the process and its descendants
    tree_pss_mb: float = 0.0  # the same of PSS (shared pages divided among their sharers); 0: unreadable
    tree_procs: int = 0  # the most processes of the tree seen at once


def _env(workdir: Path) -> dict:
    # per-run caches: a cold run finds nothing (the workdir is fresh); offline like the rest
    env = dict(os.environ)
    env.update(TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(workdir / "hf"), LENGTHSCAN_CACHE=str(workdir / "ls"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH), env.get("PYTHONPATH")])))
    return env


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return {}
    return {}


def run_proc(argv: list[str], workdir: Path, *, cache_dir: Path | None = None) -> Proc:
    """Run ``argv`` once in ``workdir`` (its caches too, unless ``cache_dir`` shares them)."""
    workdir.mkdir(parents=True, exist_ok=True)
    timef = workdir / "time.txt"
    cmd = [TIME, "-v", "-o", str(timef), *argv] if TIME else argv
    with open(workdir / "stdout", "w+") as out, open(workdir / "stderr", "w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=_env(cache_dir or workdir), cwd=workdir)
        tree = TreeMemory(proc.pid)
        status, usage = _wait4(proc, tree)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = " | ".join(line for line in stderr.strip().splitlines()[-3:] if not line.startswith("\t"))
        raise SideFailed(f"exit {code}: {tail[-300:]}")
    rss_kb = usage.ru_maxrss  # wait4's, what /usr/bin/time reads too; its own report wins below
    if TIME and timef.exists():
        for line in timef.read_text().splitlines():
            if "Maximum resident set size" in line:
                rss_kb = int(line.rsplit(":", 1)[1])
    return Proc(wall=wall, rss_mb=rss_kb / 1024, out=_last_json(stdout), workdir=workdir,
                cpu=usage.ru_utime + usage.ru_stime, tree_rss_mb=tree.peak_rss / 1024,
                tree_pss_mb=tree.peak_pss / 1024 if tree.pss_ok else 0.0, tree_procs=tree.most)


def _wait4(proc: subprocess.Popen, tree: TreeMemory | None = None):
    deadline = time.monotonic() + TIMEOUT
    next_sample = 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, usage
        now = time.monotonic()
        if now > deadline:
            proc.kill()
        if tree is not None and now >= next_sample:
            tree.sample()
            next_sample = now + SAMPLE_S
        time.sleep(0.01)


#: seconds between two samples of a process tree's memory (RSS), and the samples per PSS reading
SAMPLE_S = 0.2
PSS_EVERY = 3
#: the kernel lists each thread's children (CONFIG_PROC_CHILDREN)
CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


class TreeMemory:
    """The memory of a process and all its descendants, summed at each sample (``/proc``): the
    peak of the summed RSS, and of the summed PSS where ``smaps_rollup`` is readable (PSS counts a
    page shared by k processes as 1/k in each: the tree's real footprint). ``wait4``'s
    ``ru_maxrss`` is the largest single process only; worker processes need this."""

    def __init__(self, root: int):
        self.root = root
        self.peak_rss = 0  # KiB
        self.peak_pss = 0  # KiB
        self.most = 0
        self.pss_ok = True
        self.samples = 0

    def pids(self) -> list[int]:
        """The root and its descendants, by each thread's ``children`` file (one read per process,
        not a scan of /proc: the sampler's own CPU is taken from the sides it measures); by a scan
        where the kernel has no such files."""
        if not CHILDREN_FILES:
            return self._scanned()
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                        todo.extend(int(c) for c in fh.read().split())
                except OSError:  # the thread or process ended meanwhile
                    continue
        return out

    def _scanned(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2:].split(None, 2)[1])
            children.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def sample(self) -> None:
        """RSS at every sample; PSS at every ``PSS_EVERY``-th (``smaps_rollup`` walks a process's
        page tables: on 2 cores, reading it every 0.1 s took a quarter of a core from the sides)."""
        if not os.path.isdir("/proc"):
            return
        with_pss = self.pss_ok and self.samples % PSS_EVERY == 0
        self.samples += 1
        rss = pss = alive = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/statm", "rb") as fh:
                    rss += int(fh.read().split()[1]) * PAGE_KB
                alive += 1
            except (OSError, ValueError, IndexError):
                continue
            if with_pss:
                pss += self._pss(pid)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.most = max(self.most, alive)

    def _pss(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        return int(line.split()[1])
        except PermissionError:
            self.pss_ok = False
        except OSError:  # the process ended meanwhile
            pass
        return 0


def evict(paths) -> None:
    """Drop these files from the page cache, so the next reader pays for the disk (cold)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(path: Path) -> list[Path]:
    """Every file of a file or directory (what to evict for a source)."""
    path = Path(path)
    return [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]


def interleave(sides: dict, repeats: int, label: str) -> dict[str, list]:
    """Run every side once per repeat, in turn (A B C A B C ...); a failed run keeps its message."""
    runs: dict[str, list] = {name: [] for name in sides}
    for rep in range(repeats):
        for name, side in sides.items():
            try:
                p = side()
                msg = f"{p.wall:7.2f} s wall {p.cpu:7.2f} s CPU {p.rss_mb:7.0f} MiB"
            except SideFailed as exc:
                p = str(exc)
                msg = f"FAILED {exc}"
            runs[name].append(p)
            print(f"  [{label}] {rep + 1}/{repeats} {name:<24} {msg}", file=sys.stderr, flush=True)
    return runs


def rotated_runs(sides: list, repeats: int, scratch: Path, shared: Path, describe) -> dict | None:
    """Every side ``(name, argv_of(workdir), warm)`` once per repeat, the order rotating each repeat
    (no side always follows another); warm sides share ``shared``'s caches. name -> its ``Proc``s,
    or None once one fails (said on stderr); ``describe(proc)`` is the progress line's figures."""
    runs: dict = {name: [] for name, _, _ in sides}
    width = max(len(name) for name, _, _ in sides) + 2
    for rep in range(repeats):
        k = rep % len(sides)
        for name, argv_of, warm in sides[k:] + sides[:k]:
            work = scratch / f"{name.replace(' ', '_')}-{rep}"
            try:
                p = run_proc(argv_of(work), work, cache_dir=shared if warm else None)
            except SideFailed as exc:
                print(f"  {name}: FAILED {exc}", file=sys.stderr)
                return None
            runs[name].append(p)
            print(f"  {rep + 1}/{repeats} {name:<{width}} {describe(p)}", file=sys.stderr, flush=True)
    return runs


class Bench:
    """The data, the options and a scratch directory shared by every group of lines."""

    def __init__(self, data_dir: Path, *, quick: bool, repeats: int, scratch: Path):
        self.data = Path(data_dir)
        self.meta = json.loads((self.data / "meta.json").read_text())
        self.quick = quick
        self.repeats = repeats
        self.scratch = scratch
        self.tier = "quick" if quick else "full"
        self.text = self.data / "text" / self.tier
        self.tok = str(self.data / "tokenizer")
        self.cores = len(os.sched_getaffinity(0))
        self.notes: list[str] = []
        self._n = 0

    def workdir(self) -> Path:
        self._n += 1
        return self.scratch / f"run{self._n:04d}"

    def side(self, argv: list[str], *, post=None, before=None, cache_dir=None):
        """A side: ``argv`` as a fresh process in a fresh workdir (cold caches unless ``cache_dir``).

        ``before()`` runs first, untimed; ``post(proc)`` reads the outputs (stored as
        ``proc.out["post"]``) before the workdir is removed; ``cache_dir`` may be a callable.
        """
        def go() -> Proc:
            wd = self.workdir()
            if before:
                before()
            try:
                shared = cache_dir() if callable(cache_dir) else cache_dir
                proc = run_proc(argv, wd, cache_dir=shared)
                if post:
                    proc.out["post"] = post(proc)
                return proc
            finally:
                shutil.rmtree(wd, ignore_errors=True)
        return go

    @staticmethod
    def lengthscan(*args: str) -> list[str]:
        return [PY, "-m", "lengthscan", *args]

    def audit_argv(self, src, *extra: str) -> list[str]:
        """A text audit of ``src``: input ``text``, target ``summary``, report in ``./out``."""
        return self.lengthscan("audit", str(src), "--tokenizer", self.tok, "--input", "text",
                               "--target", "summary", "--out", "out", "--quiet", *extra)

    def script(self, name: str, *args: str) -> list[str]:
        return [PY, str(BENCH / name), *args]
