"""The results both engines build from their measurements: one place, so the local and the Ray
engine cannot drift apart in what ``report.json`` holds or in how a clean is published."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass
from pathlib import Path

from lengthscan import __version__
from lengthscan.engines.setup import Setup
from lengthscan.sources.sampling import SamplePlan
from lengthscan.stats.result import AuditResult


def audit_result(src, setup, splits, tallies, *, tokenizer, seed: int, command, cache_hits: int,
                 out=None, started: float | None = None, decisions: dict | None = None) -> AuditResult:
    """The ``AuditResult`` of measured ``splits`` (``SplitAudit``) and their ``tallies``."""
    from lengthscan.engines.results import simulate_batches

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
    from lengthscan.policy.decisions import gate

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

    from lengthscan.engines.results import CleanResult

    audit = replace(audit, seconds=time.perf_counter() - started)
    result = CleanResult(audit, decisions, tuple(after), str(final.resolve()), published=False, **extra)
    if result.gate_failed:
        shutil.rmtree(tmp, ignore_errors=True)
        return result
    from lengthscan.report.html import write_html
    from lengthscan.write.staging import publish, write_json

    result = replace(result, published=True)
    data = result.to_dict()
    write_json(tmp / "report.json", data)
    write_html(tmp / "report.html", data, redact=redact)
    publish(tmp, final)
    return result



















#: Rows whose lengths the batch simulation keeps (a uniform sample beyond it: memory stays flat).
SIMULATION_ROWS = 1_000_000


def simulation_positions(plan: SamplePlan, seed: int):
    """Positions (in measuring order) of the rows kept for the batch simulation; None: all."""
    if plan.size <= SIMULATION_ROWS:
        return None
    from lengthscan.sources.sampling import sample_indices

    return sample_indices(plan.size, SIMULATION_ROWS, seed)


def simulate_batches(src, tallies, setup: Setup, seed: int, *, of: str) -> dict | None:
    """Padding and batches of the train split (else the first) as the installed Trainer builds them."""
    from lengthscan.training.batches import simulate

    names = [s.name for s in src.splits]
    i = names.index("train") if "train" in names else 0
    rows, x, y = tallies[i].kept_lengths()
    if x is None or rows.size == 0:
        return None
    audio = any(f.kind == "audio" and f.role == "input" for f in setup.fields)
    out = simulate(x, y, rows=rows, seed=seed, unit="seconds" if audio else "tokens")
    out.update({"split": names[i], "of": of, "split_rows": src.splits[i].num_rows})
    return out




















@dataclass(frozen=True)
class CleanResult:
    """What ``lengthscan.clean`` returns and its ``report.json`` stores."""

    audit: AuditResult                 # the source as measured (every row)
    decisions: dict                    # rules, basis, per-split counts by decision and reason, gate
    after: tuple                       # SplitAudit of the written dataset (lengths after truncation)
    out_dir: str
    published: bool
    batches: dict | None = None        # padding and batches of the written dataset
    worst_rows: tuple = ()             # the longest rows of the source, with their decisions

    @property
    def gate_failed(self) -> str | None:
        return self.decisions.get("gate")

    def to_dict(self) -> dict:
        data = self.audit.to_dict()
        data["decisions"] = self.decisions
        data["clean"] = {"out_dir": self.out_dir, "published": self.published,
                         "after": [s.to_dict() for s in self.after], "worst_rows": list(self.worst_rows),
                         "batches_before": data.get("batches")}
        data["batches"] = self.batches
        return data
