"""The audit's outputs: ``lengths.parquet`` streamed into a staging directory beside ``--out``,
the measured lengths handed to the decide pass for ``--limit`` (``policy.decisions.decide_file``, run by
the engine), then ``report.json``/``report.html`` and one rename."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lengthscan.write.lengths import LengthsSink, LengthsWriter, lengths_schema
from lengthscan.write.longest import LongestSink, with_previews


@dataclass
class AuditOutput:
    """Where measured lengths go: ``lengths.parquet`` in a staging directory beside ``final``.

    With rules, the measured lengths are written first to ``.measured.parquet``; the policy's decide
    pass (called by the engine with :meth:`measured` and :meth:`lengths_path`) writes ``lengths.parquet``
    with the decision columns. Without ``final`` (a library call
    with no ``out``), a temporary directory holds what the decide pass needs, or nothing is kept.
    """

    final: Path | None
    staging: Path | None
    lengths: LengthsWriter | None
    measured_path: Path | None
    redact: bool = False
    longest: LongestSink | None = None

    @classmethod
    def start(cls, final: Path | None, setup, src, *, measured_only: bool = False, redact: bool = False,
              overwrite: bool = False) -> "AuditOutput":
        import tempfile

        from lengthscan.write.staging import check_writable, staging_dir

        if final is None and not measured_only:
            return cls(None, None, None, None)
        if final is not None:  # under a lock on --out, checked again
            staging = staging_dir(final, recheck=lambda: check_writable(final, overwrite=overwrite))
        else:
            staging = Path(tempfile.mkdtemp(prefix="lengthscan-"))
        multi = any(s.multi_file for s in src.splits)
        schema = lengths_schema(setup.fields, with_split=src.has_splits, multi_file=multi, identity=setup.identity)
        path = staging / (".measured.parquet" if measured_only else "lengths.parquet")
        return cls(final, staging, LengthsWriter(path, schema), path if measured_only else None, redact)

    def sinks(self, src, setup) -> list:
        """The measuring loop's sinks: the lengths file and the longest rows, when a report is written."""
        if self.lengths is None:
            return []
        sinks = [LengthsSink(self.lengths, with_split=src.has_splits)]
        if self.final is not None:
            self.longest = LongestSink(setup.fields, setup.identity)
            sinks.append(self.longest)
        return sinks

    def longest_rows(self, src, setup) -> tuple:
        """The longest rows of each measurement for the report, with previews unless redacted."""
        if self.longest is None:
            return ()
        rows = self.longest.rows()
        if self.redact:  # row numbers and lengths only: no text of the data, the --id value included
            return tuple({k: v for k, v in r.items() if k not in ("id", "_preview")} for r in rows)
        return tuple(with_previews(src, setup.fields, rows))

    def measured(self) -> Path:
        """The measured lengths, complete, for the decide pass (``policy.decisions.decide_file``)."""
        self.lengths.close()
        self.lengths = None
        return self.measured_path

    def lengths_path(self) -> Path | None:
        """Where the decide pass writes ``lengths.parquet`` with its decisions (None: no ``out``)."""
        return self.staging / "lengths.parquet" if self.final is not None else None

    def decided(self) -> None:
        """The decide pass is done: the measured lengths are dropped."""
        self.measured_path.unlink()

    def finish(self, data: dict) -> None:
        """Write the report of ``data`` (the result's ``to_dict()``) and publish, or clean up."""
        if self.lengths is not None:
            self.lengths.close()
        if self.final is None:
            self.abort()
            return
        from lengthscan.write.staging import publish, write_report

        write_report(self.staging, data, redact=self.redact)
        publish(self.staging, self.final)

    def abort(self) -> None:
        from lengthscan.write.staging import discard

        try:
            if self.lengths is not None:
                self.lengths.close()
        except Exception:
            pass
        if self.staging is not None:
            discard(self.staging)
