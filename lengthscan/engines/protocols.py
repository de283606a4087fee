"""The two interfaces of the measuring loop: the engine that measures, and the sinks that receive.

``LocalEngine`` (``engines.loop``) and ``RayEngine`` (``engines.ray.engine``) are engines; the
lengths file, the longest rows, the packing simulation and clean's single-pass writer are sinks.
Both are structural (``typing.Protocol``): an implementation names no base class, and
``tests/engines/test_protocols.py`` checks each one against these.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pathlib import Path

    from lengthscan.measure.batch import RoleField
    from lengthscan.measure.records import Measured
    from lengthscan.measure.setup import Setup
    from lengthscan.sources.sampling import SamplePlan
    from lengthscan.sources.scan import Batch
    from lengthscan.sources.source import Source, SplitSource


@runtime_checkable
class Sink(Protocol):
    """Receives every measured batch of every split, in row order."""

    def open_split(self, split_src: SplitSource, plan: SamplePlan) -> None: ...

    def write(self, split_src: SplitSource, batch: Batch, measured: dict[str, Measured]) -> None: ...

    def close_split(self, split_src: SplitSource) -> None: ...


@runtime_checkable
class Engine(Protocol):
    """Turns a split and its sample plan into ``(batch, role -> Measured)`` in row order.

    ``uses_cache``: the per-row length cache is read and written around it; ``single_pass``: its
    batches carry the source's columns, so clean can write while measuring."""

    name: str
    uses_cache: bool
    single_pass: bool

    def check(self, source) -> None:
        """Refuse, before anything is read, a source this engine cannot take."""

    def early(self, source, spec) -> AbstractContextManager:
        """The context a whole run is in, set-up included: work started before the tokenizer
        loads, stopped as the run ends where unused (the local engine's chat workers)."""

    def session(self) -> AbstractContextManager:
        """The context every split is measured in (a cluster connection, worker processes)."""

    def open(self, source, split: str | None, *, config: str | None = None, revision: str | None = None) -> Source:
        ...

    def measure(self, split_src: SplitSource, plan: SamplePlan, setup: Setup, fields: tuple[RoleField, ...],
                columns: list[str], *, batch_rows: int, with_ids: bool = False,
                keep_columns: bool = False) -> Iterator[tuple[Batch, dict[str, Measured]]]:
        """``keep_columns``: the batches carry the source's ``columns`` (clean's single pass)."""

    def write_pass(self, src: Source, plans, spec, measured_path: Path, *, progress=None):
        """Clean's second pass: the source read again beside its measurements, every row written."""

    def tokenizer_info(self, counter, cached):
        """The tokenizer's entry of report.json, as the measuring side loaded it."""

    def proofs(self, setup: Setup) -> dict:
        """The count-only engine's proofs, as the measuring side made them."""
