"""What the model accepts, as records: its limits read from its config (``ModelLimits``, derived by
``policy.model_limits``) and the upper bounds an audit counts rows over (``Ceiling``). Records
only: the measuring set-up (``measure.setup.Setup``) carries them, the policy derives them, the
tallies count against them."""

from __future__ import annotations

from dataclasses import dataclass

ENCODER_ONLY = "encoder-only"
DECODER_ONLY = "decoder-only"
ENCODER_DECODER = "encoder-decoder"
SPEECH_ENCODER = "speech-encoder"
SPEECH_SEQ2SEQ = "speech-seq2seq"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class ModelLimit:
    """The largest allowed value (inclusive) of one measurement, and how it was derived."""

    name: str
    value: int | float
    origin: str


@dataclass(frozen=True)
class ModelLimits:
    """Every limit known for one model, with notes on what has none."""

    model: str
    model_type: str | None
    family: str
    limits: tuple[ModelLimit, ...]
    notes: tuple[str, ...]
    sampling_rate: int | None
    conversations: bool = False  # measured on conversations: a decoder's input is the rendered sequence

    def for_conversations(self) -> "ModelLimits":
        """These limits as a conversation audit reports them: a decoder-only model's input limit
        is on ``sequence_tokens`` (``to_dict``), and the note on concatenating an input and a
        target does not apply (a conversation is one sequence already)."""
        from dataclasses import replace

        return replace(self, notes=tuple(n for n in self.notes if n != CONCATENATED_NOTE), conversations=True)

    def get(self, name: str) -> ModelLimit | None:
        """The limit on measurement ``name``, or None when the model has none. A conversation's
        ``sequence_tokens`` is a decoder-only model's input: its ``input_tokens`` limit applies."""
        if name == "sequence_tokens" and self.family == DECODER_ONLY:
            name = "input_tokens"
        return next((limit for limit in self.limits if limit.name == name), None)

    def _shown(self, name: str) -> str:
        """A limit's measurement as the report names it (a conversation's sequence, not an input)."""
        return "sequence_tokens" if self.conversations and self.family == DECODER_ONLY and name == "input_tokens" \
            else name

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "family": self.family,
            "limits": [{"name": self._shown(x.name), "value": x.value, "origin": x.origin} for x in self.limits],
            "notes": list(self.notes),
            "sampling_rate": self.sampling_rate,
        }


#: The note of a decoder-only model's input limit when an input and a target are measured apart.
CONCATENATED_NOTE = ("decoder-only: when input and target are concatenated into one sequence, their sum must fit "
                     "the input_tokens limit")


@dataclass(frozen=True)
class Ceiling:
    """An upper bound the audit counts rows over, with where it comes from: a model's limit
    (``policy.model_limits.ModelLimit``) or the tokenizer's ``model_max_length``. (A user's
    ``--limit`` is a ``policy.rules.Rule``, resolved to a number as a ``ResolvedRule``.)"""

    measure: str
    value: float
    origin: str

    @property
    def name(self) -> str:
        value = int(self.value) if float(self.value).is_integer() else self.value
        return f"{self.measure} > {value}"
