"""The Ray engine's cost and scaling: ``--engine ray`` against the local engine on the same cores, and
the measuring work spread over one and two worker nodes of a simulated cluster.

1. **Overhead**: ``lengthscan audit --full`` and ``lengthscan clean`` of the same Parquet corpus as
   whole processes, local engine against ``--engine ray`` (a local Ray on every core of this
   machine, started by the command itself, as a user would run it), in turn, ``--repeats`` times;
   the ratio is the median Ray wall time over the median local wall time (> 1: Ray is slower).
2. **Scaling**: on a ``ray.cluster_utils.Cluster`` in this process (a head node with no CPU, the
   driver only, and 1, then 2 worker nodes of ``--cpus-per-node`` CPUs each): the whole
   ``audit_ray`` (``--blocks`` read tasks asked for: runs of whole row groups), and the per-task work
   alone: the read tasks as the engine cuts them (``sources.formats.read_tasks``), each read and
   measured by the engine's warm worker actors (``engines.ray.worker``). It prints the actors, the
   times, tasks and rows a second, and the speed-up of two nodes over one.
   The nodes share this machine's cores: the speed-up cannot pass what the free cores allow.

    python bench/ray_bench.py --quick      # ~2 minutes: 5,000 rows, one repeat
    python bench/ray_bench.py              # the full tier (93k rows), 3 repeats

Data: ``bench/data.py``'s corpus and tokenizer (built when missing). Needs ``lengthscan[ray]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from data import DEFAULT_DIR, build  # noqa: E402
from harness import PY, SideFailed, interleave, run_proc  # noqa: E402


def corpus(data_dir: Path, quick: bool, rows: int | None, scratch: Path) -> Path:
    """The tier's Parquet corpus, or its first ``rows`` rows (row groups of 1,000, as data.py writes)."""
    source = data_dir / "text" / ("quick" if quick else "full") / "corpus.parquet"
    if not rows:
        return source
    import pyarrow.parquet as pq

    table = pq.read_table(source).slice(0, rows)
    path = scratch / f"corpus-{rows}.parquet"
    pq.write_table(table, path, row_group_size=1000)
    return path


def overhead(source: Path, tok: str, repeats: int, scratch: Path) -> list[dict]:
    """Whole processes, local engine against --engine ray, for an audit and a clean. Two Ray sides:
    ``ray`` starts a Ray of its own and stops it (what one command on a laptop pays), ``joined``
    joins a Ray already running on the machine (``ray start --head`` before the runs, as on a
    cluster): the difference between the two is Ray's own start and stop."""
    commands = {
        "audit --full": ["audit", str(source), "--full"],
        "clean (truncate to 512/64)": ["clean", str(source), "--limit", "input_tokens<=512",
                                       "--limit", "target_tokens<=64", "--action", "truncate"],
    }
    common = ["--tokenizer", tok, "--input", "text", "--target", "summary", "--no-cache", "--quiet"]
    # a Ray of its own per command: ray.init() would join any Ray running on the machine (another
    # user's, or a test cluster about to shut down) and time that cluster instead
    os.environ["RAY_ADDRESS"] = "local"
    head = start_head(scratch)
    lines = []
    count = iter(range(10 ** 6))
    try:
        for label, args in commands.items():

            def side(engine: str, address: str | None = None, args=args):
                work = scratch / f"{engine}-{next(count)}"
                extra = ["--ray-address", address] if address else []
                return run_proc([PY, "-m", "lengthscan", *args, *common, "--engine", engine, *extra,
                                 "--out", str(work / "out")], work)

            sides = {"local": lambda: side("local"), "ray": lambda: side("ray")}
            if head:
                sides["joined"] = lambda: side("ray", head)
            runs = interleave(sides, repeats, label)
            walls = {name: [p.wall for p in r if not isinstance(p, str)] for name, r in runs.items()}
            if not all(walls.values()):
                lines.append({"what": label,
                              "failed": {n: [p for p in r if isinstance(p, str)] for n, r in runs.items()}})
                continue
            medians = {name: statistics.median(w) for name, w in walls.items()}
            line = {"what": label, **medians, "ratio": medians["ray"] / medians["local"],
                    "runs": {n: [round(w, 2) for w in v] for n, v in walls.items()}}
            if "joined" in medians:
                line["ratio_joined"] = medians["joined"] / medians["local"]
            lines.append(line)
    finally:
        if head:
            stop_head()
    return lines


def start_head(scratch: Path) -> str | None:
    """``ray start --head`` on this machine's cores (no dashboard); its address, or None where it
    does not start. Ray 2.5x clusters authenticate drivers with a token: the drivers are told to
    use it (``RAY_AUTH_MODE=token``, read by Ray from the environment the runs inherit)."""
    import shutil
    import subprocess

    ray_cli = shutil.which("ray", path=str(Path(PY).parent)) or shutil.which("ray")
    if ray_cli is None:
        return None
    port = 46379
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--include-dashboard=false",
                           "--disable-usage-stats", f"--num-cpus={len(os.sched_getaffinity(0))}"],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"ray start --head failed, no 'joined' side: {done.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    if "Token authentication is enabled" in done.stdout + done.stderr:
        os.environ["RAY_AUTH_MODE"] = "token"
    return f"127.0.0.1:{port}"


def stop_head() -> None:
    import shutil
    import subprocess

    ray_cli = shutil.which("ray", path=str(Path(PY).parent)) or shutil.which("ray")
    subprocess.run([ray_cli, "stop", "--force"], capture_output=True)


def scaling(source: Path, tok: str, *, cpus_per_node: int, blocks: int, repeats: int) -> list[dict]:
    """On a simulated cluster of 1, then 2 worker nodes: the whole ``audit_ray`` (actors started, the
    tokenizer loaded in each, blocks read and measured), and the per-block work alone: the corpus's
    blocks, already in the object store, through warm measuring actors (the engine's own)."""
    import pyarrow.parquet as pq
    import ray
    from ray.cluster_utils import Cluster

    from lengthscan import audit_ray
    from lengthscan.engines.ray.pool import pool_size

    rows = pq.ParquetFile(source).metadata.num_rows
    lines = []
    for nodes in (1, 2):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        try:
            for _ in range(nodes):
                cluster.add_node(num_cpus=cpus_per_node)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            actors = pool_size(ray)
            walls, works = [], []
            for rep in range(repeats):
                t0 = time.perf_counter()
                audit_ray(str(source), tokenizer=tok, input="text", target="summary", full=True, num_blocks=blocks,
                          cache=False)
                walls.append(time.perf_counter() - t0)
                works.append(_block_work(ray, source, tok, blocks))
                print(f"  [scaling] {nodes} node(s) {rep + 1}/{repeats}: audit {walls[-1]:7.2f} s, "
                      f"{works[-1]['pieces']} pieces through warm actors {works[-1]['span']:7.2f} s "
                      f"(CPU {works[-1]['cpu']:.2f} s)", file=sys.stderr, flush=True)
        finally:
            ray.shutdown()
            cluster.shutdown()
        work = sorted(works, key=lambda w: w["span"])[len(works) // 2]  # the median run
        line = {"nodes": nodes, "cpus": nodes * cpus_per_node, "actors": actors, "wall": statistics.median(walls),
                **work, "rows_s": rows / work["span"]}
        line["cpu_share"] = work["cpu"] / work["span"]  # cores the actors got, on average
        lines.append(line)
    lines[1]["speedup"] = lines[0]["span"] / lines[1]["span"]
    lines[1]["speedup_wall"] = lines[0]["wall"] / lines[1]["wall"]
    return lines


def _block_work(ray, source: Path, tok: str, blocks: int) -> dict:
    """Every read task of ``source``, cut as the engine cuts them, through warm worker actors (tokenizer
    loaded, footers read): the span, and each task's wall and CPU seconds in its actor (reading included)."""
    from lengthscan.engines.options import MeasureOptions
    from lengthscan.engines.ray.engine import RayEngine
    from lengthscan.engines.ray.worker import MeasureJob, Worker
    from lengthscan.engines.setup import prepare
    from lengthscan.sources.scan import BATCH_ROWS

    class TimedWorker(Worker):  # defined here: Ray ships it by value to the workers
        def timed(self, job, split, task, take):
            wall, cpu = time.perf_counter(), time.process_time()
            self.measure(job, split, task, take)
            return time.perf_counter() - wall, time.process_time() - cpu

    setup = prepare(MeasureOptions(tokenizer=tok, input="text", target="summary"))
    columns = ["text", "summary"]
    engine = RayEngine(None, blocks)
    engine.worker_class = TimedWorker  # the engine's pool (started when the source is open), of timed workers
    with engine.session():
        split = engine.open(str(source), None).splits[0]
        pool = engine.pool()
        job = MeasureJob(engine.hold(setup), setup.fields, split.layout(), columns, BATCH_ROWS, (), False, False)
        held = engine.hold(split)
        tasks = engine.tasks(split, BATCH_ROWS)
        pool.each("timed", job, held, tasks[0], None)  # load the tokenizer, read the footers
        t0 = time.perf_counter()
        times = list(pool.ordered(("timed", (job, held, task, None)) for task in tasks))
        span = time.perf_counter() - t0
    return {"span": span, "pieces": len(tasks), "piece_wall": statistics.median(t[0] for t in times),
            "piece_cpu": statistics.median(t[1] for t in times), "cpu": sum(t[1] for t in times)}


def report(args, source: Path, over: list[dict], scale: list[dict]) -> str:
    import pyarrow.parquet as pq

    import lengthscan

    rows = pq.ParquetFile(source).metadata.num_rows
    out = [f"# Ray engine: overhead and scaling ({'--quick' if args.quick else 'full'})", "",
           f"- {time.strftime('%Y-%m-%d %H:%M')}, {len(os.sched_getaffinity(0))} cores, load average "
           f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}; lengthscan {lengthscan.__version__}, "
           f"ray {__import__('ray').__version__}",
           f"- corpus: {source.name}, {rows:,} rows; {args.repeats} repeat(s) a side", ""]
    if over:
        out += ["| whole process | local | --engine ray (starts and stops its Ray) | ray / local | "
                "--engine ray joining a running Ray | joined / local |", "|---|---:|---:|---:|---:|---:|"]
    for line in over:
        if "failed" in line:
            out.append(f"| {line['what']} | failed: {line['failed']} | | | | |")
        else:
            joined = (f"{line['joined']:.2f} s | {line['ratio_joined']:.2f}x" if "joined" in line
                      else "not run | -")
            out.append(f"| {line['what']} | {line['local']:.2f} s | {line['ray']:.2f} s | {line['ratio']:.2f}x | "
                       f"{joined} |")
    if not scale:
        return "\n".join(out) + "\n"
    out += ["", f"Simulated cluster: a head without CPU, worker nodes of {args.cpus_per_node} CPUs, "
            f"`audit_ray(full=True)` asking for {args.blocks} blocks, in one process:", "",
            "| worker nodes | CPUs | actors | whole audit | pieces (warm actors) | a piece: wall / CPU | "
            "cores the actors got | rows/s | speed-up (pieces) | speed-up (whole) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for line in scale:
        speed = f"{line['speedup']:.2f}x" if "speedup" in line else "-"
        whole = f"{line['speedup_wall']:.2f}x" if "speedup_wall" in line else "-"
        out.append(f"| {line['nodes']} | {line['cpus']} | {line['actors']} | {line['wall']:.2f} s | "
                   f"{line['pieces']} in {line['span']:.2f} s | {line['piece_wall']:.2f} s / "
                   f"{line['piece_cpu']:.2f} s | {line['cpu_share']:.2f} | {line['rows_s']:,.0f} | {speed} | {whole} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the quick tier's first 5,000 rows, one repeat")
    ap.add_argument("--rows", type=int, help="use only the first N rows of the corpus")
    ap.add_argument("--repeats", type=int, help="runs a side (default 3, 1 with --quick)")
    ap.add_argument("--cpus-per-node", type=int, default=2, help="CPUs of each simulated worker node (default 2)")
    ap.add_argument("--blocks", type=int, help="read blocks (default 16, 8 with --quick)")
    ap.add_argument("--only", default="overhead,scaling", help="overhead, scaling or both (default)")
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--results", type=Path, help="also write the table to this file")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.blocks = args.blocks or (8 if args.quick else 16)
    rows = args.rows or (5000 if args.quick else None)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    build(args.data_dir, clips=300, min_rows=50_000, force=False)
    tok = str(args.data_dir / "tokenizer")
    with tempfile.TemporaryDirectory(prefix="lengthscan-ray-bench-") as tmp:
        scratch = Path(tmp)
        source = corpus(args.data_dir, args.quick, rows, scratch)
        only = set(args.only.split(","))
        try:
            over = overhead(source, tok, args.repeats, scratch) if "overhead" in only else []
        except SideFailed as exc:
            over = [{"what": "overhead", "failed": str(exc)}]
        scale = scaling(source, tok, cpus_per_node=args.cpus_per_node, blocks=args.blocks,
                        repeats=args.repeats) if "scaling" in only else []
        text = report(args, source, over, scale)
    sys.stdout.write(text)
    if args.results:
        args.results.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
