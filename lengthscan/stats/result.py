"""``AuditResult``: what ``lengthscan.audit`` returns and ``report.json`` stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.records import FieldSpec, TokenizerInfo
from lengthscan.stats.records import SplitAudit

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
    model: object = None               # policy.model_limits.ModelLimits (to_dict() in report.json)
    audio: dict | None = None
    decisions: object = None           # engines.results.DecisionReport (with --limit)
    batches: object = None             # engines.results.BatchReport of the source
    chat: dict | None = None           # how conversations were measured (template, format, rule)
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
