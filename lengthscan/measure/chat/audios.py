"""Audio in conversations: each clip's tokens as the model's processor counts them, from its
header's samples and rate (``measure/audio/parts.py``), added to the row's measurements.

The chat template writes one audio token per clip (Qwen2-Audio: ``<|audio_bos|><|AUDIO|><|audio_eos|>``);
the processor repeats it once per audio token. So per row: ``audios``, ``audio_tokens``;
``sequence_tokens`` gains each clip's tokens less the one written; prompt and trained tokens move
where the clip's message is; ``audio_seconds`` (at the model's rate); side columns: the costliest
clip's tokens and the milliseconds the processor cuts off silently (``audio_truncated``: it cut some).

A row whose rendering holds another number of audio tokens than it has clips, or with a clip that
is missing or unreadable, gets no length and a reason.
"""

from __future__ import annotations

from lengthscan.measure.audio.durations import read_info
from lengthscan.measure.audio.parts import AudioRefused
from lengthscan.measure.chat.media import apply_added, placed_messages, refuse, stepped_added
from lengthscan.measure.chat.media import stepped as steps_of
from lengthscan.measure.records import FLAG_CODES, FLAG_INVALID_CONVERSATION


def add_audios(audios, counter, work: dict, texts: list, plain: list, values: dict, notes: dict, flags,
               errors: list, *, train_on: str, base_dir: str | None) -> None:
    """Add the clips of the measured rows of ``work`` (row -> RowPlan) to ``values`` and ``notes``;
    ``audios`` is the ``AudioPartsCounter``, ``counter`` the ``TokenCounter``."""
    token = audios.audio_token
    stepped, steps = [], {True: [], False: []}  # rows whose expansions are tokenized in place (Gemma 3n)
    for i, w in work.items():
        if values["sequence_tokens"][i] < 0:
            continue
        values["audios"][i] = values["audio_tokens"][i] = values["audio_seconds"][i] = 0
        notes["audio_lost_ms"][i] = 0
        rendering = plain[w.full] if w.conv.text is not None else texts[w.full]
        refs = list(w.conv.audios or ())
        found = rendering.count(token)
        if found != len(refs):
            refuse(i, values, FLAG_INVALID_CONVERSATION, f"the rendering holds {found} audio token(s) {token!r} for "
                   f"{len(refs)} clip(s) (the processor refuses such a row)", flags, errors)
            continue
        if not refs:
            continue
        clips = read_clips(refs, base_dir)
        if isinstance(clips, tuple):
            refuse(i, values, *clips, flags, errors)
            continue
        try:
            counts = audios.count(clips)
        except AudioRefused as exc:
            refuse(i, values, FLAG_CODES["unreadable"], f"a clip of {len(refs)}: {audios.processor_type} refuses "
                                                        f"it: {exc}", flags, errors)
            continue
        written = [audios.replacement(c) for c in counts]
        if written[0] is not None:
            is_plain = w.conv.text is not None
            stepped.append((i, is_plain, counts))
            steps[is_plain] += steps_of(rendering, token, written)
            continue
        added = [c.tokens - 1 for c in counts]
        _apply(i, w, sum(added), added, counts, audios, values, notes, train_on)
    found = stepped_added(counter, steps, [(is_plain, len(counts)) for _, is_plain, counts in stepped])
    for (i, _, counts), (delta, added) in zip(stepped, found):
        _apply(i, work[i], delta, added, counts, audios, values, notes, train_on)


def read_clips(refs: list, base_dir: str | None) -> list | tuple[int, str]:
    """(frames, file rate) per clip from its header, or the first unreadable one's (flag code, reason)."""
    clips = []
    for k, ref in enumerate(refs):
        try:
            info = read_info(ref, base_dir=base_dir)
        except TypeError as exc:
            return FLAG_CODES["unreadable"], f"clip {k + 1} of {len(refs)}: {exc}"
        if info.flag in ("missing", "missing_file", "unreadable") or not info.frames or not info.samplerate:
            flag = "missing_file" if info.flag in ("missing", "missing_file") else "unreadable"
            return FLAG_CODES[flag], f"clip {k + 1} of {len(refs)}: {info.error or 'no samples'}"
        clips.append((info.frames, info.samplerate))
    return clips


def _apply(i: int, w, delta: int, added: list, counts: list, audios, values: dict, notes: dict,
           train_on: str) -> None:
    values["audios"][i] = len(counts)
    values["audio_tokens"][i] = sum(c.tokens for c in counts)
    notes["max_audio_tokens"][i] = max(c.tokens for c in counts)
    values["audio_seconds"][i] = sum(c.samples for c in counts) / audios.rate
    lost = sum(c.lost for c in counts)
    notes["audio_lost_ms"][i] = round(lost * 1000 / audios.rate)
    notes["audio_truncated"][i] = lost > 0
    where = placed_messages(w.conv, len(counts), audios.audio_token, w.conv.audio_messages)
    apply_added(i, w.conv, delta, added, where, values, notes, train_on)
