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


#: with --reasoning: the trained reasoning tokens (rule metric) and, per row, the longest reasoning
#: span's tokens and the reasoning spans the template does not render (``reasoning.py``)
REASONING_METRICS = ("reasoning_tokens",)
REASONING_NOTES = {"max_reasoning_tokens": "int64", "reasoning_dropped": "int64"}


def chat_metrics(vision: bool = False, video: bool = False, audio: bool = False,
                 reasoning: bool = False) -> tuple[str, ...]:
    """The measurements of a conversation field (with images: ``IMAGE_METRICS`` too; with videos:
    ``VIDEO_METRICS``; with audio: ``AUDIO_PART_METRICS``; with reasoning: ``REASONING_METRICS``)."""
    from lengthscan.measure.audio.parts import AUDIO_PART_METRICS
    from lengthscan.measure.images import IMAGE_METRICS
    from lengthscan.measure.video import VIDEO_METRICS

    return (CHAT_METRICS + (REASONING_METRICS if reasoning else ()) + (IMAGE_METRICS if vision else ())
            + (VIDEO_METRICS if video else ()) + (AUDIO_PART_METRICS if audio else ()))


def chat_notes(vision: bool = False, video: bool = False, audio: bool = False, reasoning: bool = False) -> dict:
    """The side columns of a conversation field (with images: ``IMAGE_NOTES`` too; with videos:
    ``VIDEO_NOTES``; with audio: ``AUDIO_PART_NOTES``)."""
    from lengthscan.measure.audio.parts import AUDIO_PART_NOTES
    from lengthscan.measure.images import IMAGE_NOTES
    from lengthscan.measure.video import VIDEO_NOTES

    return {**NOTES, **(REASONING_NOTES if reasoning else {}), **(IMAGE_NOTES if vision else {}),
            **(VIDEO_NOTES if video else {}), **(AUDIO_PART_NOTES if audio else {})}


def chat_specs(column: str, vision: bool = False, video: bool = False, audio: bool = False,
               reasoning: bool = False) -> tuple[FieldSpec, ...]:
    units = {"turns": "turns", "assistant_turns": "turns", "images": "images", "videos": "videos",
             "video_frames": "frames", "audios": "clips", "video_seconds": "seconds", "audio_seconds": "seconds"}
    return tuple(FieldSpec("chat", column, units.get(m, "tokens"), metric=m)
                 for m in chat_metrics(vision, video, audio, reasoning))


def empty_measurements(n: int, vision: bool = False, video: bool = False, audio: bool = False,
                       reasoning: bool = False) -> tuple:
    """(metrics, values, notes) for ``n`` rows of a conversation field, nothing measured yet: -1
    (NaN-free -1.0 for seconds) and False."""
    import numpy as np

    metrics = chat_metrics(vision, video, audio, reasoning)
    values = {m: np.full(n, -1.0) if m.endswith("_seconds") else np.full(n, -1, np.int64) for m in metrics}
    notes = {name: np.zeros(n, bool) if kind == "bool" else np.full(n, -1, np.int64)
             for name, kind in chat_notes(vision, video, audio, reasoning).items()}
    return metrics, values, notes

