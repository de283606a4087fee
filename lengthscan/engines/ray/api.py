"""``audit_ray`` and ``clean_ray``: ``lengthscan.audit`` and ``lengthscan.clean`` with the Ray Data
engine (``engines.ray.engine.RayEngine``) as the measuring loop's engine; same arguments (plus
the cluster's), same results and outputs, row for row."""

from __future__ import annotations

from pathlib import Path

from lengthscan.engines.audit import AuditOptions, run_audit
from lengthscan.engines.clean import CleanOptions, run_clean
from lengthscan.engines.ray.session import EngineError
from lengthscan.measure.text.counter import DEFAULT_MAX_CHARS
from lengthscan.sources.sampling import DEFAULT_SEED
from lengthscan.sources.scan import BATCH_ROWS

__all__ = ["EngineError", "audit_ray", "clean_ray"]


def audit_ray(source, *, ray_address: str | None = None, num_blocks: int | None = None, tokenizer=None,
              input: str | None = None, target: str | None = None, audio: str | None = None,
              model: str | None = None, sampling_rate: int | None = None, split: str | None = None,
              sample=None, full: bool = False, seed: int = DEFAULT_SEED, limits=(), action: str = "drop",
              keep_empty_targets: bool = False, crop_audio: bool = False, target_is_label: bool = False,
              fail_over=None,
              out: str | Path | None = None, overwrite: bool = False, cache: bool = True,
              max_chars: int = DEFAULT_MAX_CHARS, count_engine: str = "auto", verify_counts: int = 0,
              batch_rows: int = BATCH_ROWS, redact: bool = False, num_proc: int = 1, progress=None,
              command: str | None = None, messages: str | None = None,
              prompt: str | None = None, completion: str | None = None, tools: str | None = None,
              chat_template: str | None = None, train_on: str = "assistant", id_column: str | None = None,
              images: str | None = None, processor: str | None = None, max_pixels: int | None = None):
    """``lengthscan.audit`` on a Ray cluster: same arguments, same ``AuditResult`` and outputs.

    ``ray_address`` is passed to ``ray.init`` (None: the running Ray session, else a new local
    one; ``"auto"`` joins a running cluster). ``num_blocks`` overrides the number of read blocks.
    The length cache is not used (``cache`` is accepted and ignored); ``num_proc`` is ignored (the
    actor pool uses the cluster's CPUs). ``--limit`` decisions run on the driver over the merged
    ``lengths`` file, as in the local engine.
    """
    from lengthscan.engines.ray.engine import RayEngine

    kwargs = {k: v for k, v in locals().items() if k not in ("source", "ray_address", "num_blocks", "RayEngine")}
    return run_audit(source, AuditOptions.of(**kwargs), RayEngine(ray_address, num_blocks))


def clean_ray(source, *, out, ray_address: str | None = None, num_blocks: int | None = None,
              format: str = "arrow", tokenizer=None, input: str | None = None, target: str | None = None,
              audio: str | None = None, model: str | None = None, sampling_rate: int | None = None,
              split: str | None = None, limits=(), action: str = "drop", keep_empty_targets: bool = False,
              crop_audio: bool = False, target_is_label: bool = False, fail_over=None,
              length_column: str | None = "length",
              length_from: str | None = None, embed_audio: bool = False, tokenize: bool = False,
              overwrite: bool = False, cache: bool = True, max_chars: int = DEFAULT_MAX_CHARS,
              count_engine: str = "auto", verify_counts: int = 0, batch_rows: int = BATCH_ROWS, redact: bool = False,
              num_proc: int = 1, decide_only: bool = True,
              progress=None, command: str | None = None, messages: str | None = None, prompt: str | None = None,
              completion: str | None = None, tools: str | None = None, chat_template: str | None = None,
              train_on: str = "assistant", id_column: str | None = None,
              images: str | None = None, processor: str | None = None, max_pixels: int | None = None):
    """``lengthscan.clean`` on a Ray cluster: same arguments, same ``CleanResult`` and outputs.

    ``ray_address`` and ``num_blocks`` as in ``audit_ray``; ``format`` "parquet" writes Parquet
    shards. The length cache is not used (``cache`` is accepted and ignored) and ``num_proc`` is
    ignored (the actor pools use the cluster's CPUs). Two passes always: the rows are written by
    actors (see ``engines.ray.write``).
    """
    from lengthscan.engines.ray.engine import RayEngine

    kwargs = {k: v for k, v in locals().items() if k not in ("source", "ray_address", "num_blocks", "RayEngine")}
    return run_clean(source, CleanOptions.of(**kwargs), RayEngine(ray_address, num_blocks))
