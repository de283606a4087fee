"""The audit's outputs: ``lengths.parquet`` streamed into a staging directory beside ``--out``,
the decide pass for ``--limit``, then ``report.json``/``report.html`` and one rename."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lengthscan.stats.result import AuditResult

if TYPE_CHECKING:
    from lengthscan.engines.setup import Setup


@dataclass
class _Output:
    """Where measured lengths go: ``lengths.parquet`` in a staging directory beside ``final``.

    With rules, the measured lengths are written first to ``.measured.parquet`` and the decide
    pass writes ``lengths.parquet`` with the decision columns. Without ``final`` (a library call
    with no ``out``), a temporary directory holds what the decide pass needs, or nothing is kept.
    """

    final: Path | None
    tmp: Path | None
    lengths: object
    measured_path: Path | None
    redact: bool = False

    @classmethod
    def start(cls, final: Path | None, fields, src, *, measured_only: bool = False,
              redact: bool = False) -> "_Output":
        import tempfile

        from lengthscan.write.lengths import LengthsWriter, lengths_schema
        from lengthscan.write.staging import staging_dir

        if final is None and not measured_only:
            return cls(None, None, None, None)
        tmp = staging_dir(final) if final is not None else Path(tempfile.mkdtemp(prefix="lengthscan-"))
        multi = any(s.multi_file for s in src.splits)
        schema = lengths_schema(fields, with_split=src.has_splits, multi_file=multi)
        path = tmp / (".measured.parquet" if measured_only else "lengths.parquet")
        return cls(final, tmp, LengthsWriter(path, schema), path if measured_only else None, redact)

    def decide(self, src, plans, setup: Setup, resolved, keep_empty_targets: bool):
        """The decide pass over the measured lengths; writes ``lengths.parquet`` with decisions."""
        import pyarrow.parquet as pq

        from lengthscan.policy.decisions import (
            DecisionTally,
            MeasuredCursor,
            base_and_flags,
            decide,
            decision_columns,
            special_lengths,
        )

        self.lengths.close()
        self.lengths = None
        special = special_lengths(setup.counter, setup.fields)
        cursor = MeasuredCursor(self.measured_path)
        writer, tallies = None, []
        for split_src, plan in zip(src.splits, plans):
            tally = DecisionTally(split_src.name, plan.rows_total)
            for start in range(0, plan.size, 65536):
                table = cursor.take(min(65536, plan.size - start))
                base, flags = base_and_flags(table, setup.fields)
                d = decide(base, flags, resolved, special=special, keep_empty_targets=keep_empty_targets)
                tally.add(d)
                for name, col in decision_columns(d).items():
                    table = table.append_column(name, col)
                if self.final is not None:
                    writer = writer or pq.ParquetWriter(self.tmp / "lengths.parquet", table.schema)
                    writer.write_table(table)
            tallies.append(tally)
        if writer is not None:
            writer.close()
        self.measured_path.unlink()
        return tallies

    def finish(self, result: AuditResult) -> None:
        if self.lengths is not None:
            self.lengths.close()
        if self.final is None:
            self.abort()
            return
        from lengthscan.report.html import write_html
        from lengthscan.write.staging import publish, write_json

        data = result.to_dict()
        write_json(self.tmp / "report.json", data)
        write_html(self.tmp / "report.html", data, redact=self.redact)
        publish(self.tmp, self.final)

    def abort(self) -> None:
        import shutil

        try:
            if self.lengths is not None:
                self.lengths.close()
        except Exception:
            pass
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
