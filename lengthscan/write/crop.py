"""``--crop-audio``: cut clips to a number of seconds and encode them again with soundfile.

Cropping decodes (it must), keeps the sample rate and channels, and writes the same container
when libsndfile can write it (WAV, FLAC, OGG, AIFF; MP3 and others become FLAC, lossless), unless
its codec would pad the last block (IMA and MS ADPCM, GSM 6.10 in WAV: a clip cropped to 1.5 s
would hold up to a block more): then FLAC, so the file holds exactly the frames kept. Audio
stored as bytes (an ``Audio(decode=False)`` struct or a binary column) gets the new bytes; audio
stored as a path gets a new file under ``dataset/audio/`` of the output and the path to it.
Not through ``datasets``' audio encoder, which needs torchcodec.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pyarrow as pa

WRITABLE = {"WAV": "wav", "FLAC": "flac", "OGG": "ogg", "AIFF": "aiff"}


def crop_column(column, seconds: np.ndarray, staging: Path, final: Path, *, base_dir: str | None = None):
    """(new column, new native frames, sample rates) with rows where ``seconds`` is finite cropped."""
    import soundfile

    from lengthscan.measure.audio.native import native_stderr_quiet

    values = column.to_pylist()
    frames = np.full(len(values), -1, np.int64)
    rates = np.zeros(len(values), np.int64)
    for i in np.flatnonzero(np.isfinite(seconds)):
        data, path = _load(values[i], base_dir)
        with native_stderr_quiet(), soundfile.SoundFile(io.BytesIO(data) if data is not None else path) as f:
            rate, fmt, subtype = f.samplerate, f.format, f.subtype
            keep = int(np.floor(seconds[i] * rate))
            audio = f.read(frames=keep, dtype="float32", always_2d=True)
        fmt_out = fmt if fmt in WRITABLE else "FLAC"
        blob = _encode(audio, rate, fmt_out, subtype if fmt_out == fmt else "PCM_16")
        if fmt_out != "FLAC" and _frames(blob) != audio.shape[0]:  # a block codec padded the last block
            fmt_out, blob = "FLAC", _encode(audio, rate, "FLAC", "PCM_16")
        frames[i], rates[i] = audio.shape[0], rate
        values[i] = _store(values[i], blob, WRITABLE[fmt_out], staging, final)
    return pa.array(values, column.type), frames, rates


def _encode(audio: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    import soundfile

    buf = io.BytesIO()
    # a second at a time: libsndfile 1.2.2 crashes writing millions of OGG Vorbis frames in one call
    with soundfile.SoundFile(buf, "w", rate, audio.shape[1], subtype, format=fmt) as out:
        for k in range(0, audio.shape[0], rate):
            out.write(audio[k:k + rate])
    return buf.getvalue()


def _frames(blob: bytes) -> int:
    """The frames an encoded clip holds, as a reader of it gets them."""
    import soundfile

    from lengthscan.measure.audio.native import native_stderr_quiet

    with native_stderr_quiet():
        return soundfile.info(io.BytesIO(blob)).frames


def _load(value, base_dir):
    from lengthscan.measure.audio.durations import resolve_source

    return resolve_source(value, base_dir)


def _store(value, blob: bytes, ext: str, staging: Path, final: Path):
    if isinstance(value, dict):
        name = value.get("path") or f"cropped.{ext}"
        return {"bytes": blob, "path": str(Path(name).with_suffix(f".{ext}").name)}
    if isinstance(value, (bytes, bytearray)):
        return blob
    name = f"{hashlib.sha256(blob).hexdigest()[:16]}.{ext}"
    (staging / "dataset" / "audio").mkdir(parents=True, exist_ok=True)
    (staging / "dataset" / "audio" / name).write_bytes(blob)
    return str(final / "dataset" / "audio" / name)


#: a manifest's own duration column (NeMo's ``duration``), rewritten for the rows cropped
DURATION_COLUMNS = ("duration",)


def _manifest_duration(table, done: np.ndarray, frames: np.ndarray, rates: np.ndarray):
    """``table`` with a numeric ``duration`` column telling the cropped rows' new seconds."""
    for name in DURATION_COLUMNS:
        if name in table.column_names and pa.types.is_floating(table.schema.field(name).type) and done.any():
            values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
            values[done] = frames[done] / rates[done]
            kind = table.schema.field(name).type
            table = table.set_column(table.schema.get_field_index(name), name,
                                     pa.array(values, kind, mask=table.column(name).is_null().to_numpy(False)))
    return table


def crop_rows(table, field, settings, seconds: np.ndarray, final: dict, staging: Path, out: Path, *,
              base_dir: str | None = None):
    """``table`` with the audio of ``field`` cropped to ``seconds`` per row (NaN: untouched); its
    seconds, samples and frames in ``final`` recomputed from the frames written."""
    from lengthscan.measure.audio.durations import resampled_length

    column, frames, rates = crop_column(table.column(field.column), seconds, staging, out, base_dir=base_dir)
    table = table.set_column(table.schema.get_field_index(field.column), field.column, column)
    done = frames >= 0
    table = _manifest_duration(table, done, frames, rates)
    for spec in field.specs:
        if spec.unit == "seconds":
            final[spec.name][done] = frames[done] / rates[done]
        elif spec.unit == "samples":
            final[spec.name][done] = resampled_length(frames[done], rates[done], settings.sampling_rate)
        elif spec.unit == "frames":
            samples = resampled_length(frames[done], rates[done], settings.sampling_rate)
            final[spec.name][done] = settings.frame_rule.frames(samples)
    return table
