"""Audio: durations read from file headers (never decoded where a header tells), then samples at the
model's rate and the model's frames, by arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lengthscan.measure.columns import column_audio
from lengthscan.measure.kinds.base import Kind, MeasureContext
from lengthscan.measure.records import FLAG_CODES, MEASURED_FLAGS, Measured

if TYPE_CHECKING:
    from lengthscan.measure.kinds.base import AudioSettings, RoleField
    from lengthscan.sources.scan import Batch


class AudioKind(Kind):
    name = "audio"
    holds_files = True
    crops = True

    def measure(self, batch, f, split_src, ctx: MeasureContext) -> Measured:
        return measure_audio(batch, f, split_src, ctx.audio)

    def named_by(self, f) -> str:
        return "--audio"


def measure_audio(batch: Batch, f: RoleField, split_src, settings: AudioSettings) -> Measured:
    from lengthscan.measure.audio.durations import read_infos, resampled_length

    values = column_audio(batch, f.column, split_src)
    infos = read_infos(values, base_dir=split_src.base_dir(batch.rows))
    n = len(infos)
    flags = np.zeros(n, np.int8)
    seconds = np.full(n, np.nan)
    frames = np.full(n, -1, np.int64)
    rates = np.ones(n, np.int64)
    errors: list = [None] * n
    decoded = np.zeros(n, bool)
    for i, info in enumerate(infos):
        code = FLAG_CODES[info.flag] if info.flag else 0
        flags[i] = code
        errors[i] = info.error
        decoded[i] = info.decoded
        if code in MEASURED_FLAGS and info.frames is not None:
            seconds[i] = info.frames / info.samplerate
            frames[i], rates[i] = info.frames, info.samplerate
    result = {f.specs[0]: seconds}
    ok = frames >= 0
    if settings.sampling_rate:
        samples = np.full(n, -1, np.int64)
        samples[ok] = resampled_length(frames[ok], rates[ok], settings.sampling_rate)
        result[f.specs[1]] = samples
        if settings.frame_rule is not None:
            model_frames = np.full(n, -1, np.int64)
            model_frames[ok] = settings.frame_rule.frames(samples[ok])
            result[f.specs[2]] = model_frames
    return Measured(result, flags, errors if any(e is not None for e in errors) else None,
                    decoded if decoded.any() else None)
