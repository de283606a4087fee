"""``Kind``: what a field of one kind measures and how (text, audio, a conversation).

A field's kind owns measuring a batch of its column(s), the per-row side columns it writes to
``lengths.parquet``, whether its lengths go to the per-row cache, and which source columns it reads
as the file holds them. The measuring loop and the writers call these and never compare a kind's
name; a new kind is one module beside these and one entry in ``kinds.KINDS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lengthscan.measure.columns import column_values
from lengthscan.measure.records import FieldSpec

if TYPE_CHECKING:
    from lengthscan.measure.audio.durations import FrameRule
    from lengthscan.measure.chat.counter import ChatCounter
    from lengthscan.measure.preference.counter import PairCounter
    from lengthscan.measure.records import Measured
    from lengthscan.measure.text.counter import TokenCounter
    from lengthscan.sources.scan import Batch


@dataclass(frozen=True)
class AudioSettings:
    """How audio becomes samples and frames: the model's sampling rate and frame rule, if known."""

    sampling_rate: int | None = None
    frame_rule: FrameRule | None = None

    def units(self) -> tuple[str, ...]:
        units = ["seconds"]
        if self.sampling_rate:
            units.append("samples")
            if self.frame_rule is not None:
                units.append("frames")
        return tuple(units)


@dataclass(frozen=True)
class MeasureContext:
    """What measuring a batch needs beside the batch: the token counter, the audio settings, the
    conversation counter, decide-only's caps (role -> upper token count), whether token ids are kept,
    the preference pairs' counter, and the renderings worker processes make of a batch's conversations."""

    counter: TokenCounter | None = None
    audio: AudioSettings | None = None
    chat: ChatCounter | None = None
    decide_caps: dict = field(default_factory=dict)
    with_ids: bool = False
    pairs: PairCounter | None = None
    rendered: dict = field(default_factory=dict)  # role -> its conversations rendered by workers (ChatCounter.measure)


class Kind:
    """A field kind. ``name`` is what report.json's ``fields[].kind`` says; ``tokenized``: its
    lengths are the tokenizer's (a tokenizer is needed)."""

    name: str = ""
    tokenized: bool = False
    truncates: bool = False            # rows over a token limit can be cut to a verified prefix (and --tokenize'd)
    errors_in_reasons: bool = False    # its per-row messages (the template's words) go into the rows' reasons
    holds_files: bool = False          # media files (paths or bytes): made absolute, embeddable, previewed by path
    crops: bool = False                # rows over a seconds limit can be cropped (--crop-audio)
    #: measuring is mostly Python in the calling thread (a chat template's rendering), not the
    #: tokenizer's threads: with ``--num-proc N`` the parent measures beside N-1 worker processes
    python_bound: bool = False
    #: its Python part (a chat template's rendering) is done by worker processes, the rest here:
    #: ``job`` gives a batch's job, ``measure`` takes a worker's renderings from ``ctx.rendered``
    renders_apart: bool = False

    def measure(self, batch: Batch, f: RoleField, split_src, ctx: MeasureContext) -> Measured:
        raise NotImplementedError

    def notes(self, f: RoleField) -> dict[str, str]:
        """Per-row side columns (name -> Arrow type name) this field writes to lengths.parquet."""
        return {}

    def pair(self, f: RoleField) -> tuple[FieldSpec, FieldSpec] | None:
        """The (x, y) measurements of the field's own pair statistics (None: none)."""
        return None

    def packed(self, f: RoleField) -> FieldSpec | None:
        """The measurement packing packs (one sequence per row; None: the field is not packed)."""
        return None

    def trained(self, f: RoleField) -> FieldSpec | None:
        """The measurement of the tokens the loss is computed on, where it differs from the sequence."""
        return None

    def after(self, f: RoleField) -> tuple[str, ...]:
        """The measurements ``lengths.parquet`` gives again after truncation (``{name}_after``)."""
        return ()

    def empty_length(self, f: RoleField, counter) -> int | None:
        """The length of an empty value: the special tokens every row carries (None: not counted)."""
        return None

    def cached(self, f: RoleField) -> bool:
        """Whether the per-row length cache holds this field's measurements (then the four methods
        below say how)."""
        return False

    def cache_key(self, fingerprint: str, f: RoleField, ctx: MeasureContext) -> str:
        """The cache key of the field in the split of source ``fingerprint``."""
        raise NotImplementedError

    def cache_reader(self, f: RoleField, path, rows: int):
        """The cache's reader of the field, checked against the split's ``rows``."""
        raise NotImplementedError

    def cache_writer(self, f: RoleField, key: str):
        raise NotImplementedError

    def from_cache(self, f: RoleField, reader, rows, ctx: MeasureContext) -> Measured:
        """The measurements of ``rows`` as the cache holds them."""
        raise NotImplementedError

    def to_cache(self, f: RoleField, writer, measured: Measured) -> None:
        raise NotImplementedError

    def raw_columns(self, f: RoleField) -> tuple[str, ...]:
        """Columns read as the file holds them (not through the dataset's typed reader)."""
        return ()

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    def named_by(self, f: RoleField) -> str:
        """What named the field on the command line (in messages about its rows)."""
        return f"--{f.role}"

    _instances: dict = {}

    def __new__(cls):  # one instance per kind, also when a worker unpickles a field: ``f.kind is TEXT`` holds
        if cls not in Kind._instances:
            Kind._instances[cls] = super().__new__(cls)
        return Kind._instances[cls]

    def __reduce__(self):
        return type(self), ()


def raw_columns_of(batch, f) -> dict:
    """The field's columns of ``batch``: as the file holds them where the batch kept them raw
    (conversations of a JSON Lines file), else as the dataset's reader gives them."""
    return {c: batch.raw[c] if batch.raw and c in batch.raw else column_values(batch, c) for c in f.columns}


@dataclass(frozen=True)
class RoleField:
    """One role's column, its kind, and the measurements taken of it."""

    role: str
    column: str
    kind: Kind  # measures it: text, audio or a conversation (``measure.kinds``)
    specs: tuple[FieldSpec, ...]
    extra: tuple[str, ...] = ()  # other columns read with it (chat: completion, tools)
    flags: tuple[tuple[str, str], ...] = ()  # (column, the option that named it) where not --{role}

    @property
    def primary(self) -> FieldSpec:
        return self.specs[0]

    @property
    def vision(self) -> bool:
        """A conversation field whose images are counted."""
        return any(s.metric == "image_tokens" for s in self.specs)

    @property
    def video(self) -> bool:
        """A conversation field whose videos are counted."""
        return any(s.metric == "video_tokens" for s in self.specs)

    @property
    def reasoning(self) -> bool:
        """A conversation field whose reasoning spans are counted (--reasoning)."""
        return any(s.metric == "reasoning_tokens" for s in self.specs)

    @property
    def audio_parts(self) -> bool:
        """A conversation field whose audio clips are counted."""
        return any(s.metric == "audio_tokens" for s in self.specs)

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column, *self.extra)

    @property
    def notes(self) -> dict:
        """Per-row side columns (name -> Arrow type name) this field writes to lengths.parquet."""
        return self.kind.notes(self)
