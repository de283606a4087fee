"""What a conversation field measures: its metrics (``lengths.parquet`` columns, rule metrics), its
per-row side columns, and the ``--train-on`` choices (``counter.ChatCounter`` measures them)."""

from __future__ import annotations

from lengthscan.measure.records import FieldSpec

#: The chat measurements (lengths.parquet columns, rule metrics), primary first.
CHAT_METRICS = ("sequence_tokens", "prompt_tokens", "completion_tokens", "turns", "assistant_turns",
                "longest_message_tokens")
#: Per-row side columns of a chat field: name -> Arrow type name.
NOTES = {"trained_from": "int64", "final_eot_at": "int64", "ends_with_eot": "bool", "rewrites_history": "bool",
         "parts_not_rendered": "bool", "from_sharegpt": "bool", "system_tokens": "int64", "user_tokens": "int64",
         "assistant_tokens": "int64", "tool_tokens": "int64"}
#: Message roles whose content tokens get a side column (``{role}_tokens``).
CONTENT_ROLES = ("system", "user", "assistant", "tool")
TRAIN_ON = ("assistant", "last", "all")


def chat_metrics(vision: bool = False) -> tuple[str, ...]:
    """The measurements of a conversation field (with images: ``IMAGE_METRICS`` too)."""
    from lengthscan.measure.images import IMAGE_METRICS

    return CHAT_METRICS + IMAGE_METRICS if vision else CHAT_METRICS


def chat_notes(vision: bool = False) -> dict:
    """The side columns of a conversation field (with images: ``IMAGE_NOTES`` too)."""
    from lengthscan.measure.images import IMAGE_NOTES

    return {**NOTES, **IMAGE_NOTES} if vision else NOTES


def chat_specs(column: str, vision: bool = False) -> tuple[FieldSpec, ...]:
    units = {"turns": "turns", "assistant_turns": "turns", "images": "images"}
    return tuple(FieldSpec("chat", column, units.get(m, "tokens"), metric=m) for m in chat_metrics(vision))
