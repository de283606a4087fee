"""The results both engines build from their measurements: one place, so the local and the Ray
engine cannot drift apart in what ``report.json`` holds or in how a clean is published."""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

from . import __version__
from .records import AuditResult


def audit_result(src, setup, splits, tallies, *, tokenizer, seed: int, command, cache_hits: int,
                 out=None, started: float | None = None, decisions: dict | None = None) -> AuditResult:
    """The ``AuditResult`` of measured ``splits`` (``SplitAudit``) and their ``tallies``."""
    from .pipeline import simulate_batches

    return AuditResult(
        source=src.spec, source_fingerprint=src.fingerprint, splits=tuple(splits), tokenizer=tokenizer,
        fields=setup.specs, seed=seed, command=command, version=__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        out_dir=str(Path(out).resolve()) if out is not None else None, cache_hits=cache_hits,
        seconds=time.perf_counter() - started if started is not None else 0.0,
        model=setup.model_limits.to_dict() if setup.model_limits else None,
        audio=setup.audio_dict(), decisions=decisions,
        batches=simulate_batches(src, tallies, setup, seed, of="source"),
    )


def decisions_dict(resolved, basis: str, action: str, dtallies, fail_over, gate_spec, **extra) -> dict:
    """``report.json["decisions"]``: the resolved rules, counts per split and the gate's verdict."""
    from .decisions import gate

    return {"rules": [r.to_dict() for r in resolved], "basis": basis, "action": action,
            "splits": [t.to_dict() for t in dtallies], "fail_over": fail_over,
            "gate": gate(gate_spec, dtallies), **extra}


def clean_extra(length_column, length_from, embed_audio: bool, decide_limits: dict, proofs: dict) -> dict:
    """What a clean adds to the decisions: the length column and the decide-only mode."""
    return {"length_column": length_column if length_from else None, "length_from": length_from,
            "audio_embedded": embed_audio,
            "decide_only": {"on": True, "limits": decide_limits, "proof": proofs} if decide_limits else {"on": False}}


def publish_clean(audit, decisions: dict, after, final: Path, tmp: Path, extra: dict, *, started: float,
                  redact: bool):
    """The ``CleanResult``: unpublished (staging removed) if the gate failed, else the report
    written into the staging directory and the whole of it renamed into place."""
    import shutil
    from dataclasses import replace

    from .cleaner import CleanResult

    audit = replace(audit, seconds=time.perf_counter() - started)
    result = CleanResult(audit, decisions, tuple(after), str(final.resolve()), published=False, **extra)
    if result.gate_failed:
        shutil.rmtree(tmp, ignore_errors=True)
        return result
    from .report.html import write_html
    from .writer import publish, write_json

    result = replace(result, published=True)
    data = result.to_dict()
    write_json(tmp / "report.json", data)
    write_html(tmp / "report.html", data, redact=redact)
    publish(tmp, final)
    return result
