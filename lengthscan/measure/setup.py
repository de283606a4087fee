"""What measuring needs, resolved once from the user's options (``engines.setup.prepare`` builds it):
the fields and their measurements, the token counter, the audio settings, the model's limits and
the ceilings the audit counts rows over, the chat renderer, the identity column."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lengthscan.measure.kinds.base import AudioSettings, RoleField
from lengthscan.measure.limits import Ceiling, ModelLimits

if TYPE_CHECKING:
    import pyarrow as pa

    from lengthscan.measure.chat.counter import ChatCounter
    from lengthscan.measure.preference.counter import PairCounter
    from lengthscan.measure.text.counter import TokenCounter


@dataclass(frozen=True)
class Setup:
    """What measuring needs, resolved once from the user's options."""

    fields: tuple[RoleField, ...]
    counter: TokenCounter | None
    settings: AudioSettings
    model_limits: ModelLimits | None
    ceilings: list[Ceiling]      # the upper bounds the audit counts rows over (the model's limits)
    decide_caps: dict[str, int] = field(default_factory=dict)  # role -> upper token limit (decide-only mode)
    chat: ChatCounter | None = None  # for a conversation field
    pairs: PairCounter | None = None  # for a preference field
    identity: pa.Field | None = None  # --id COL's field, carried into lengths.parquet (see ``with_identity``)

    @property
    def specs(self) -> tuple:
        return tuple(s for f in self.fields for s in f.specs)

    @property
    def rendered_by(self):
        """The counter whose chat template renders the fields' rows (a conversation's
        ``ChatCounter``, or the preference or RL prompt counter); None: no template renders them."""
        return self.chat if self.chat is not None else self.pairs

    def audio_dict(self) -> dict | None:
        if not any(f.kind.holds_files for f in self.fields):
            return None
        return {"sampling_rate": self.settings.sampling_rate, "frame_rule": rule_dict(self.settings.frame_rule)}


def rule_dict(rule) -> dict | None:
    """A frame rule (``measure.audio``'s record) as report.json writes it."""
    if rule is None:
        return None
    from dataclasses import asdict

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(rule).items()}
