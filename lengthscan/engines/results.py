"""The results every engine builds from its measurements: one place, so the engines cannot drift
apart in what ``report.json`` holds or in how a clean is published."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, replace
from pathlib import Path

from lengthscan import __version__
from lengthscan.engines.loop import Measurement
from lengthscan.engines.records import AuditResult, BatchReport, DecisionReport
from lengthscan.measure.setup import Setup
from lengthscan.sources.urls import redact_urls
from lengthscan.stats.records import SplitAudit


def audit_result(src, setup: Setup, measurement: Measurement, *, tokenizer, seed: int, command,
                 out=None, started: float | None = None, decisions: DecisionReport | None = None,
                 longest: tuple = (), packing: dict | None = None) -> AuditResult:
    """The ``AuditResult`` of a source's ``measurement``."""
    return AuditResult(
        source=src.spec, source_fingerprint=src.fingerprint, splits=measurement.splits, tokenizer=tokenizer,
        fields=setup.specs, seed=seed, command=redact_urls(command) if command else command, version=__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        out_dir=str(Path(out).resolve()) if out is not None else None, cache_hits=len(measurement.cached),
        seconds=time.perf_counter() - started if started is not None else 0.0,
        model=setup.model_limits, audio=setup.audio_dict(), decisions=decisions,
        chat=setup.chat.to_dict() if setup.chat is not None else None,
        preference=setup.pairs.to_dict() if setup.pairs is not None else None,
        batches=simulate_batches(src, measurement.tallies, setup, seed, of="source"), longest_rows=longest,
        packing=packing, source_io=source_account(src, measurement, seed),
    )


def source_account(src, measurement: Measurement, seed: int) -> dict:
    """``report.json["source"]``'s account: where the files live, the bytes read of their total (a
    remote source's reads are counted; local reads are not), how the rows were drawn."""
    import os

    if src.remote is not None:
        where = src.remote.to_dict()
    else:
        paths = [p.path for s in src.splits for p in s.parts if p.path]
        try:
            total = sum(os.path.getsize(p) for p in paths) if paths else None
        except OSError:
            total = None
        where = {"location": "local", "files": len(paths) or None, "bytes_total": total, "bytes_read": None}
    plans = measurement.plans
    units = sorted({p.unit for p in plans if not p.full})
    blocks = [p.design for p in plans if p.design is not None]
    return {**where, "sampling": {
        "unit": units[0] if len(units) == 1 else (units or None),
        "seed": seed,
        "blocks_drawn": sum(d.count for d in blocks) if blocks else None,
        "blocks_total": sum(d.blocks_total for d in blocks) if blocks else None,
    }}


def clean_extra(length_column, length_from, embed_audio: bool, decide_caps: dict, proofs: dict) -> dict:
    """What a clean adds to the decisions: the length column and the decide-only mode."""
    return {"length_column": length_column if length_from else None, "length_from": length_from,
            "audio_embedded": embed_audio,
            "decide_only": {"on": True, "limits": decide_caps, "proof": proofs} if decide_caps else {"on": False}}


@dataclass(frozen=True)
class CleanResult:
    """What ``lengthscan.clean`` returns and its ``report.json`` stores."""

    audit: AuditResult                 # the source as measured (every row)
    decisions: DecisionReport          # rules, basis, per-split counts by decision and reason, gate
    after: tuple[SplitAudit, ...]      # the written dataset (lengths after truncation)
    out_dir: str
    published: bool
    batches: BatchReport | None = None  # padding and batches of the written dataset
    worst_rows: tuple = ()             # the longest rows of the source, with their decisions

    @property
    def gate_failed(self) -> str | None:
        return self.decisions.gate

    def to_dict(self) -> dict:
        data = self.audit.to_dict()
        data["decisions"] = self.decisions.to_dict()
        data["clean"] = {"out_dir": self.out_dir, "published": self.published,
                         "after": [s.to_dict() for s in self.after], "worst_rows": list(self.worst_rows),
                         "batches_before": data.get("batches")}
        data["batches"] = self.batches.to_dict() if self.batches is not None else None
        return data


def publish_clean(result: CleanResult, staging: Path, final: Path, *, started: float, redact: bool) -> CleanResult:
    """``result`` unpublished (staging removed) if the gate failed, else the report written into the
    staging directory and the whole of it renamed into place."""
    result = replace(result, audit=replace(result.audit, seconds=time.perf_counter() - started))
    from lengthscan.write.staging import discard, publish, write_report

    if result.gate_failed:
        discard(staging)
        return result

    result = replace(result, published=True)
    write_report(staging, result.to_dict(), redact=redact)
    publish(staging, final)
    return result


def simulate_batches(src, tallies, setup: Setup, seed: int, *, of: str) -> BatchReport | None:
    """Padding and batches of the train split (else the first) as the installed Trainer builds them."""
    from lengthscan.training.batches import simulate

    names = [s.name for s in src.splits]
    i = names.index("train") if "train" in names else 0
    rows, x, y = tallies[i].kept_lengths()
    if x is None or rows.size == 0:
        return None
    unit = next((f.primary.unit for f in setup.fields if f.role == "input"), "tokens")  # seconds of audio
    simulation = simulate(x, y, rows=rows, seed=seed, unit=unit)
    return BatchReport(names[i], of, src.splits[i].num_rows, simulation)
