"""Videos in conversations: each video's tokens as the model's processor expands it, from its
container's metadata, added to the row's measurements (as ``images.py`` adds images).

The chat template writes one placeholder per video (Qwen: ``<|vision_start|><|video_pad|><|vision_end|>``);
the processor replaces the i-th video token by the i-th video's expansion (Qwen3-VL: the whole
wrapper, by timestamped temporal patches) and tokenizes the result. So per row:

* ``videos``, ``video_tokens`` (the processor's video tokens), ``video_frames`` (the frames it
  keeps, before padding to its temporal patch);
* ``sequence_tokens``: the rendering's tokens plus what the expansions add: the video token
  repeated (Qwen2-VL, Qwen2.5-VL) adds its count less one; text around the tokens (Qwen3-VL's
  timestamps) is tokenized in place, the placeholders replaced one at a time;
* ``prompt_tokens``/``completion_tokens``: a video counts where its message does;
* ``video_seconds``: the videos' length; side columns: the costliest video's tokens and kept frames,
  and the frames their files hold.

A row whose rendering holds another number of placeholders than it has videos, with a video that
is missing or unreadable, or one the processor refuses, gets no length and a reason.
"""

from __future__ import annotations

from lengthscan.measure.chat.media import apply_added, placed_messages, refuse, refuse_unread, stepped_added
from lengthscan.measure.chat.media import stepped as steps_of
from lengthscan.measure.records import FLAG_CODES, FLAG_INVALID_CONVERSATION
from lengthscan.measure.video.qwen import VideoRefused
from lengthscan.measure.video.refs import VideoProblem, video_infos


def add_videos(videos, counter, work: dict, texts: list, plain: list, values: dict, notes: dict, flags,
               errors: list, *, train_on: str, base_dir: str | None) -> dict:
    """Add the videos of the measured rows of ``work`` (row -> RowPlan) to ``values`` and ``notes``;
    ``videos`` is the ``VideoCounter``, ``counter`` the ``TokenCounter``. Returns row -> its videos'
    metadata ([frames, fps, width, height, rotation] each: the report recounts the longest rows)."""
    media: dict = {}
    rows, refs = [], []
    for i, w in work.items():
        if values["sequence_tokens"][i] < 0:
            continue
        for name in ("videos", "video_tokens", "video_frames", "video_seconds"):
            values[name][i] = 0
        notes["video_file_frames"][i] = 0
        rendering = plain[w.full] if w.conv.text is not None else texts[w.full]
        placeholder = _placeholder(videos, rendering)
        found, wanted = rendering.count(placeholder), len(w.conv.videos or ())
        if found != wanted:
            refuse(i, values, FLAG_INVALID_CONVERSATION, f"the rendering holds {found} video placeholder(s) "
                   f"{placeholder!r} for {wanted} video(s) (the processor refuses such a row)", flags, errors)
            continue
        if wanted:
            rows.append((i, len(refs), wanted, placeholder))
            refs.extend(w.conv.videos)
    if not rows:
        return media
    infos = video_infos(refs, base_dir)
    stepped, steps = [], {True: [], False: []}
    for i, start, n, placeholder in rows:
        row_infos = infos[start:start + n]
        if refuse_unread(i, row_infos, VideoProblem, "video", values, flags, errors):
            continue
        try:
            counts = [videos.count(v) for v in row_infos]
        except VideoRefused as exc:
            refuse(i, values, FLAG_CODES["unreadable"], f"a video of {n}: {videos.processor_type} refuses it: {exc}",
                   flags, errors)
            continue
        w = work[i]
        media[i] = [[v.frames, v.fps, v.width, v.height, v.rotation] for v in row_infos]
        if videos.repeats:  # the video token repeated: each video adds its tokens less one
            added = [c.tokens - 1 for c in counts]
            _apply(i, w, sum(added), added, counts, row_infos, values, notes, train_on, placeholder)
            continue
        is_plain = w.conv.text is not None
        written = [videos.replacement(c) for c in counts]
        stepped.append((i, is_plain, counts, row_infos, placeholder))
        steps[is_plain] += steps_of(plain[w.full] if is_plain else texts[w.full], placeholder, written)
    if stepped:
        _stepped(stepped, steps, counter, work, values, notes, train_on)
    return media


def _placeholder(videos, rendering: str) -> str:
    """What the processor replaces in ``rendering``: Qwen3-VL's wrapper where the template writes
    it, else the video token."""
    wrapper = videos.wrapper
    return wrapper if wrapper is not None and wrapper in rendering else videos.video_token


def _stepped(stepped: list, steps: dict, counter, work: dict, values: dict, notes: dict, train_on: str) -> None:
    found = stepped_added(counter, steps, [(is_plain, len(counts)) for _, is_plain, counts, _, _ in stepped])
    for (i, _, counts, infos, placeholder), (delta, added) in zip(stepped, found):
        _apply(i, work[i], delta, added, counts, infos, values, notes, train_on, placeholder)


def _apply(i: int, w, delta: int, added: list, counts: list, infos: list, values: dict, notes: dict,
           train_on: str, placeholder: str) -> None:
    values["videos"][i] = len(counts)
    values["video_tokens"][i] = sum(c.tokens for c in counts)
    values["video_frames"][i] = sum(c.frames for c in counts)
    top = max(range(len(counts)), key=lambda k: (counts[k].tokens, counts[k].frames))
    notes["max_video_tokens"][i] = counts[top].tokens
    notes["max_video_frames"][i] = counts[top].frames
    values["video_seconds"][i] = sum(v.duration for v in infos)
    notes["video_file_frames"][i] = sum(v.frames or 0 for v in infos)
    where = placed_messages(w.conv, len(counts), placeholder, w.conv.video_messages)
    apply_added(i, w.conv, delta, added, where, values, notes, train_on)
