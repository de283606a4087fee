"""The measure step: one Arrow record batch in, per-role measurements out.

Each field's kind measures it (``measure.kinds``): text counted by ``TokenCounter``, audio from file
headers (seconds, then samples at the model's rate and the model's frames, by arithmetic),
conversations through the chat template. Values that are not what the column should hold raise
``ColumnError`` naming the row; files that cannot be read are recorded per row with their reason,
and the audit goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lengthscan.measure.columns import ColumnError
from lengthscan.measure.kinds import AUDIO, CHAT, PREFERENCE, RL_PROMPT, TEXT, MeasureContext
from lengthscan.measure.kinds.base import AudioSettings, RoleField
from lengthscan.measure.records import FieldSpec, Measured
from lengthscan.sources.scan import Batch
from lengthscan.sources.source import SplitLayout, SplitSource

if TYPE_CHECKING:
    from lengthscan.measure.chat.counter import ChatCounter
    from lengthscan.measure.text.counter import TokenCounter

__all__ = ["AudioSettings", "RoleField", "role_fields", "measure_batch", "ColumnError"]


def role_fields(*, input: str | None = None, target: str | None = None, audio: str | None = None,
                audio_settings: AudioSettings = AudioSettings(), chat=None, pairs=None,
                prompts=None) -> tuple[RoleField, ...]:
    """The measured fields for ``--input``/``--audio`` and ``--target`` column names, for a
    conversation (``chat``: a ``measure.chat.conversations.ChatFormat``) or for preference pairs
    (``pairs``: a ``measure.preference.pairs.PairFormat``) or RL prompts (``prompts``: a
    ``measure.preference.prompts.PromptFormat``)."""
    if prompts is not None:
        from lengthscan.measure.preference.prompts import rl_specs

        flags = tuple(dict((column, flag) for flag, column in (("--tools", prompts.tools), ("--prompt", prompts.prompt))
                           if column).items())
        extra = (prompts.tools,) if prompts.tools else ()
        return (RoleField("rl", prompts.prompt, RL_PROMPT, rl_specs(prompts.prompt), extra, flags),)
    if pairs is not None:
        from lengthscan.measure.preference import pair_specs

        named = (("--tools", pairs.tools), ("--prompt", pairs.prompt), ("--rejected", pairs.rejected),
                 ("--chosen", pairs.chosen))
        flags = tuple(dict((column, flag) for flag, column in named if column).items())
        extra = tuple(c for c in pairs.columns if c != pairs.chosen)
        return (RoleField("pair", pairs.chosen, PREFERENCE, pair_specs(pairs.chosen), extra, flags),)
    if input and audio:
        raise ColumnError("give the input as text (--input) or as audio (--audio), not both")
    if chat is not None:
        if input or audio or target:
            raise ColumnError("give conversations (--messages, or --prompt with --completion) or text and audio "
                              "columns (--input, --target, --audio), not both")
        from lengthscan.measure.chat.metrics import chat_specs

        extra = tuple(c for c in chat.columns if c != chat.column)
        named = (("--audios", chat.audios), ("--videos", chat.videos), ("--images", chat.images),
                 ("--tools", chat.tools), ("--completion", chat.completion), ("--prompt", chat.prompt),
                 ("--messages", chat.messages))  # the first option naming it last
        flags = tuple(dict((column, flag) for flag, column in named if column).items())
        specs = chat_specs(chat.column, chat.vision, chat.video, chat.audio, chat.reasoning)
        return (RoleField("chat", chat.column, CHAT, specs, extra, flags),)
    fields = []
    if input:
        fields.append(RoleField("input", input, TEXT, (FieldSpec("input", input, "tokens"),)))
    if audio:
        specs = tuple(FieldSpec("input", audio, u) for u in audio_settings.units())
        fields.append(RoleField("input", audio, AUDIO, specs, flags=((audio, "--audio"),)))
    if target:
        fields.append(RoleField("target", target, TEXT, (FieldSpec("target", target, "tokens"),)))
    if not fields:
        raise ColumnError("name at least one column: --input COL (text) or --audio COL, and/or --target COL")
    return tuple(fields)


def measure_batch(batch: Batch, fields: tuple[RoleField, ...], split_src: SplitSource | SplitLayout, *,
                  counter: TokenCounter | None = None, audio: AudioSettings = AudioSettings(),
                  decide_caps: dict[str, int] | None = None, with_ids: bool = False,
                  chat: ChatCounter | None = None, pairs=None, rendered: dict | None = None) -> dict[str, Measured]:
    """Measure every field of ``batch``: role -> ``Measured``.

    ``split_src`` is a ``SplitSource`` or its picklable ``SplitLayout`` (for error messages and
    relative audio paths). ``decide_caps`` (role -> upper token limit) turns on decide-only
    counting for those roles: rows proven within or over the limit keep a bound, not a length.
    ``with_ids`` keeps the token ids of text roles (``Measured.ids``); ``pairs``: the preference
    field's ``PairCounter``; ``rendered``: role -> its conversations as worker processes render them
    (``ChatCounter.render_spec``, ``measure.chat.apart``).
    """
    ctx = MeasureContext(counter, audio, chat, decide_caps or {}, with_ids, pairs, rendered or {})
    return {f.role: f.kind.measure(batch, f, split_src, ctx) for f in fields}
