"""The records an audit returns and ``report.json`` stores: ``AuditResult``, with the decisions
(``DecisionReport``) and the simulated batches (``BatchReport``) it carries. They live with the
engines that build them, so that each field has its own type (the stages below know none of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lengthscan.measure.limits import ModelLimits
from lengthscan.measure.records import FieldSpec, TokenizerInfo
from lengthscan.policy.decisions import DecisionTally
from lengthscan.policy.rules import ResolvedRule
from lengthscan.stats.records import SplitAudit

__all__ = ["AuditResult", "DecisionReport", "BatchReport", "SCHEMA_VERSION"]

#: Version of the layout of ``report.json``; bump on any incompatible change.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class AuditResult:
    """What ``lengthscan.audit`` returns and ``report.json`` stores."""

    source: str
    source_fingerprint: str
    splits: tuple[SplitAudit, ...]
    tokenizer: TokenizerInfo | None
    fields: tuple[FieldSpec, ...]
    seed: int
    command: str | None
    version: str
    created: str
    out_dir: str | None = None
    cache_hits: int = 0
    seconds: float = 0.0
    model: ModelLimits | None = None   # the model's limits (to_dict() in report.json)
    audio: dict | None = None
    decisions: DecisionReport | None = None  # with --limit
    batches: BatchReport | None = None       # the source's batches as the Trainer builds them
    chat: dict | None = None           # how conversations were measured (template, format, rule)
    preference: dict | None = None     # how preference pairs were measured (trainer, columns, truncation)
    longest_rows: tuple = ()           # an audit's longest rows per measurement, with previews (write.longest)
    packing: dict | None = None        # --packing: the packs' figures (pack.run.simulate_packing)
    source_io: dict | None = None      # where the source lives, bytes read of bytes total, the sampling unit

    def split(self, name: str) -> SplitAudit:
        for s in self.splits:
            if s.split == name:
                return s
        raise KeyError(name)

    @property
    def rows_measured(self) -> int:
        return sum(s.sample.rows_measured for s in self.splits)

    def _chat(self) -> dict:
        converted = sum((s.chat or {}).get("from_sharegpt", 0) for s in self.splits)
        out = {**self.chat, "sharegpt_converted": converted > 0}
        if converted:
            out["sharegpt_note"] = (f"{converted:,} ShareGPT conversations ({{from, value}}) were converted with a "
                                    f"role map (human -> user, gpt -> assistant, observation -> tool); TRL itself only "
                                    f"renames the keys, so its template sees the roles 'human' and 'gpt'")
        return out

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "lengthscan_version": self.version,
            "created": self.created,
            "command": self.command,
            "source": {"spec": self.source, "fingerprint": self.source_fingerprint, **(self.source_io or {})},
            "tokenizer": self.tokenizer.to_dict() if self.tokenizer else None,
            "fields": [{"name": f.name, "role": f.role, "column": f.column, "unit": f.unit, "kind": f.kind}
                       for f in self.fields],
            "model": self.model.to_dict() if self.model is not None else None,
            "audio": self.audio,
            **({"chat": self._chat()} if self.chat is not None else {}),
            **({"preference": self.preference} if self.preference is not None else {}),
            "seed": self.seed,
            "sample_size": self.rows_measured,
            "cache_hits": self.cache_hits,
            "seconds": round(self.seconds, 3),
            "splits": [s.to_dict() for s in self.splits],
            "decisions": self.decisions.to_dict() if self.decisions is not None else None,
            "batches": self.batches.to_dict() if self.batches is not None else None,
            **({"longest_rows": list(self.longest_rows)} if self.longest_rows else {}),
            **({"packing": self.packing} if self.packing is not None else {}),
        }


@dataclass(frozen=True)
class DecisionReport:
    """``report.json["decisions"]``: the resolved rules, rows per decision and reason for every
    split, the gate's verdict, and what a clean adds (its length column, decide-only mode)."""

    rules: tuple[ResolvedRule, ...]
    basis: str                         # the split the distribution rules were resolved on
    action: str
    tallies: tuple[DecisionTally, ...]  # one per split
    fail_over: str | int | float | None  # the gate: '1%' or a row count
    gate: str | None                   # the gate's failure message, None when it passed
    clean: dict = field(default_factory=dict)

    @classmethod
    def of(cls, resolved, basis: str, action: str, tallies, fail_over, gate_spec, **clean) -> "DecisionReport":
        from lengthscan.policy.decisions import gate

        return cls(tuple(resolved), basis, action, tuple(tallies), fail_over, gate(gate_spec, tallies), clean)

    def __getitem__(self, key: str):
        """``report.json["decisions"][key]``: the report's own reading (``result.decisions["splits"]``),
        as code written against the dict this record replaced reads it."""
        return self.to_dict()[key]

    def get(self, key: str, default=None):
        return self.to_dict().get(key, default)

    def to_dict(self) -> dict:
        return {"rules": [r.to_dict() for r in self.rules], "basis": self.basis, "action": self.action,
                "splits": [t.to_dict() for t in self.tallies], "fail_over": self.fail_over, "gate": self.gate,
                **self.clean}


@dataclass(frozen=True)
class BatchReport:
    """Padding and batches of one split as the installed Trainer builds them: ``report.json["batches"]``."""

    split: str
    of: str                            # "source" or "cleaned dataset"
    split_rows: int
    simulation: dict                   # training.batches.simulate's documented result

    def to_dict(self) -> dict:
        return {**self.simulation, "split": self.split, "of": self.of, "split_rows": self.split_rows}
