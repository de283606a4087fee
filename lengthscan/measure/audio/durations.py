"""Audio durations from file headers, and model frame counts by arithmetic.

Seconds come from the header (``soundfile``/libsndfile): nothing is decoded when the header
suffices. What libsndfile 1.2.2 (soundfile 0.14) reports, measured against decoding every frame:

* WAV/WAVEX/RF64/W64/AIFF/CAF/AU, FLAC, OGG Vorbis and Opus: ``frames`` equals the decoded length
  for every rate, channel count and length tried. A **truncated WAV or AIFF** (data chunk claims
  more than the file holds) reports the frames actually present, and libsndfile's log says
  ``data : 192000 (should be 95978)``: measured, flagged ``"truncated"`` with that line. A WAV whose
  data size is the streaming placeholder 0xFFFFFFFF reads to the end of the file (not flagged); one
  whose data size is 0 reports 0 frames and decodes to 0 (``"empty"``). A truncated FLAC, or one
  with an unknown total (0) in STREAMINFO, does not open at all ("lost sync", "psf_fseek() failed"),
  nor does OGG cut inside its first pages; OGG cut later reports the complete pages present.
* MP3 with a Xing/Info/VBRI tag (LAME writes one; so does libsndfile): ``frames`` is the tag's
  gapless count and equals the decoded length, CBR, ABR and VBR alike. But a **truncated** tagged
  MP3 still reports the tag's count (48000 where 22511 decode), so we check that the last frame can
  be read (a seek to the end: cheap) and otherwise count by decoding (``decoded=True``, flagged
  ``"truncated"``). Concatenated MP3s report, and decode to, the first part's tag only (libsndfile
  stops there; ffmpeg-based decoders read on): a known limit.
* MP3 **without** a tag: libsndfile estimates frames from the file size and the first frame's
  bitrate: CBR off by a few dozen samples (49577 for 49536), VBR badly (20448 for 49536), and
  soundfile's own decoding stops at that estimate too. We walk the MPEG frame headers instead
  (frames x samples per frame, what mpg123 decodes in full) and set ``decoded=True``.

Speed: ``read_info`` first tries ``headers.probe``, pure-Python parsers that replicate the
above for complete WAV/WAVEX, FLAC, Ogg Vorbis/Opus and LAME-tagged MP3 files (a few reads, no
libsndfile, no decoding) and return None for anything else, truncated or damaged files included;
then ``libsndfile_info`` below decides. Same results either way (tests/measure/audio/test_headers.py).

Resampling follows ``librosa.resample`` (see ``resampled_length``); model frames follow
transformers' own formulas (``conv_frames``, ``mel_frames``, ``frame_rule``).
"""

from __future__ import annotations

import io
import os
import re
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from lengthscan.measure.audio.headers import HEAD, aiff_rate, hint, probe
from lengthscan.measure.audio.mpeg import untagged_mp3_samples
from lengthscan.sources.streams import kind_of
from lengthscan.sources.urls import display_url

if TYPE_CHECKING:  # numpy is imported where arrays are made: reading durations does not need it
    import numpy as np

FLAG_EMPTY = "empty"
FLAG_MISSING = "missing"  # the value itself is None (no bytes, no path)
FLAG_MISSING_FILE = "missing_file"
FLAG_TRUNCATED = "truncated"  # measured: the frames actually present
FLAG_UNREADABLE = "unreadable"
#: sample rates a header may state (below: 0, NaN or a denormal read back as 1 Hz; above: inf)
MIN_RATE, MAX_AUDIO_RATE = 100, 12_288_000

_UNKNOWN_FRAMES = 2**62  # libsndfile's "unknown length" is SF_COUNT_MAX: not a real count
_DECODE_BLOCK = 1 << 16  # frames per read when a length has to come from decoding
#: libsndfile's log line for a data chunk that claims more bytes than the file holds ...
_SHORT_CHUNK = re.compile(r"^(data|SSND)\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
#: Uncompressed subtypes: libsndfile derives their frame count from the data chunk and the file
#: size (a short file is caught by ``_truncation``), so reading the last frame proves nothing more.
_PCM_SUBTYPES = {"PCM_S8", "PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE", "ULAW", "ALAW"}
#: Containers of uncompressed audio (FLAC reports PCM subtypes too, but it is compressed).
_PCM_CONTAINERS = {"WAV", "WAVEX", "AIFF", "RF64", "W64", "CAF", "AU", "IRCAM", "NIST", "RAW"}
#: ... except these sizes, which mean "unknown, read to the end" (streamed WAV), not truncation.
_PLACEHOLDER_SIZES = (0xFFFFFFFF, 0xFFFFFFFE)


@dataclass(frozen=True)
class AudioInfo:
    """One audio value's length in native sample frames, or why there is none."""

    frames: int | None
    samplerate: int | None
    channels: int | None
    format: str | None
    subtype: str | None
    decoded: bool = False
    flag: str | None = None
    error: str | None = None

    @property
    def seconds(self) -> float | None:
        """Duration in seconds: frames / samplerate."""
        if self.frames is None or not self.samplerate:
            return None
        return self.frames / self.samplerate


def _failed(flag: str, error: str) -> AudioInfo:
    return AudioInfo(None, None, None, None, None, flag=flag, error=error)


def read_info(source, *, base_dir: str | None = None) -> AudioInfo:
    """Length of one audio value: a path, raw bytes, or a ``{"bytes", "path"}`` dict.

    The dict is what ``datasets.Audio(decode=False)`` stores; its bytes win when present. A
    relative path resolves against ``base_dir`` when given. A bad file never raises: it comes
    back flagged, with the reason (libsndfile's own message where it gave one). A value of the
    wrong type raises TypeError.
    """
    return _info(*resolve_source(source, base_dir))


def _info(data: bytes | None, path: str | None) -> AudioInfo:
    if data is None and path is None:
        return _failed(FLAG_MISSING, "no audio: neither bytes nor a path")
    if data is None and _is_url(path):
        return _failed(FLAG_MISSING_FILE, f"a URL, not a local file: {display_url(path)} (lengthscan reads local "
                                          "audio files and bytes; download the files, or mount the bucket)")
    if data is None:
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):  # what os.path.exists calls missing
            return _failed(FLAG_MISSING_FILE, f"no such file: {path}")
        if not stat.S_ISREG(mode):  # never opened: a FIFO would block, a device never end
            return _failed(FLAG_UNREADABLE, f"not a regular file ({kind_of(mode)}): {path}")
    fast = probe(data, path)  # pure-Python header parse: the same answer, where it is certain
    if fast is not None:
        return _rate_checked(AudioInfo(*fast, flag=FLAG_EMPTY if fast[0] == 0 else None), data, path)
    return libsndfile_info(data, path)


def _rate_checked(info: AudioInfo, data: bytes | None, path: str | None) -> AudioInfo:
    """``info``, or unreadable where the header's sample rate is no audio rate: libsndfile turns an
    AIFF rate of 0, a denormal or NaN into 1 Hz and inf into 67,108,864 Hz, durations of hours or
    microseconds; the AIFF header's own 80-bit value is read back to say which."""
    if info.samplerate is None or MIN_RATE <= info.samplerate <= MAX_AUDIO_RATE:
        return info
    stated = f"{info.samplerate:,} Hz"
    if info.format == "AIFF":
        try:
            with open(path, "rb") if data is None else io.BytesIO(data) as fh:
                stated = aiff_rate(fh.read(HEAD)) or stated
        except OSError:
            pass
    what = path if data is None else f"<{len(data)} bytes>"
    return _failed(FLAG_UNREADABLE, f"{what}: unreadable header: its sample rate ({stated}) is not an audio rate "
                                    f"({MIN_RATE:,} to {MAX_AUDIO_RATE:,} Hz)")


def libsndfile_info(data: bytes | None, path: str | None) -> AudioInfo:
    """The reference path for a resolved source: libsndfile opens it (and decodes where needed).

    ``read_info`` returns exactly this for every source; it skips libsndfile where
    ``headers.probe`` can parse the header itself (tests/measure/audio/test_headers.py compares them).
    """
    from lengthscan.measure.audio.native import native_stderr_quiet

    try:
        with native_stderr_quiet():
            info = _measure(data, path)
        return _rate_checked(info, data, path)
    except Exception as exc:  # LibsndfileError, TypeError (RAW needs a rate), RuntimeError ...
        return _failed(FLAG_UNREADABLE, _reason(exc, data, path))


def read_infos(sources: list, *, base_dir: str | None = None, threads: int = 1, prefetch: int = 32) -> list[AudioInfo]:
    """``read_info`` of every source, in order; the same results whatever ``threads`` and ``prefetch``.

    Most files are parsed in pure Python (``headers``): 10-100 us a file in page cache, so a
    cold read costs the disk's latency. ``prefetch`` overlaps it without threads: before each file
    the kernel is asked (posix_fadvise WILLNEED) to start reading what ``read_info`` will read of the
    file that many places ahead. Measured on the speech bench (wav/flac/ogg/mp3 files), 2 CPUs, ext4
    on virtio, in one process: the first 400 files evicted from the page cache, 4,000 files/s with
    ``prefetch=0``, 10,100 with 32; all 1,200 in page cache, 16,700 and 15,300 files/s (the hints'
    cost). ``threads=4`` (the parsers hold the GIL) gave 11,800 files/s in page cache at more CPU;
    ``threads > 1`` still runs a pool, for filesystems where a thread can wait on its own.
    """
    resolved = [resolve_source(s, base_dir) for s in sources]  # TypeError before any work starts
    if threads > 1 and len(sources) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda r: _info(*r), resolved))
    paths = [path if data is None else None for data, path in resolved] if prefetch > 0 else []
    for path in paths[:prefetch]:
        hint(path)
    out = []
    for i, (data, path) in enumerate(resolved):
        if i + prefetch < len(paths):
            hint(paths[i + prefetch])
        out.append(_info(data, path))
    return out


def _is_url(path: str) -> bool:
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.isalnum() and len(scheme) > 1  # s3://, https://, gs:// (not C:\\)


def resolve_source(source, base_dir: str | None) -> tuple[bytes | None, str | None]:
    """(bytes, path) of a source; TypeError for a value that is neither."""
    if isinstance(source, dict) and set(source) <= {"bytes", "path"}:
        data, path = source.get("bytes"), source.get("path")
        if data is not None:
            return resolve_source(data, base_dir)
        return (None, None) if path is None else resolve_source(path, base_dir)
    if source is None:
        return None, None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if base_dir is not None and not os.path.isabs(path) and not _is_url(path):
            path = os.path.join(base_dir, path)
        return None, path
    raise TypeError(
        f"audio source must be a path, bytes or a {{'bytes', 'path'}} dict, "
        f"got {type(source).__name__} {str(source)[:60]!r}"
    )


def _open(data: bytes | None, path: str | None):
    import soundfile

    return soundfile.SoundFile(io.BytesIO(data) if data is not None else path)


def _reason(exc: Exception, data: bytes | None, path: str | None) -> str:
    """A readable reason: libsndfile's message without soundfile's BytesIO repr."""
    what = path if data is None else f"<{len(data)} bytes>"
    message = getattr(exc, "error_string", None) or str(exc)
    if isinstance(exc, TypeError) and "samplerate" in message:
        message = "headerless (RAW) audio: sample rate, channels and sample format unknown"
    elif data is not None and not data:
        message = "0 bytes"
    return f"{what}: {message}"


def _measure(data: bytes | None, path: str | None) -> AudioInfo:
    with _open(data, path) as f:
        claimed, fmt = f.frames, f.format
        frames, decoded, note = claimed, False, None
        walked = untagged_mp3_samples(data, path) if fmt == "MP3" else None
        if walked:
            frames, decoded = walked, True
        elif claimed >= _UNKNOWN_FRAMES or (claimed and not _uncompressed(f)
                                            and not _readable_at(f, claimed - 1)):
            # the header promises frames the stream does not hold (truncated FLAC/MP3 ...)
            frames, decoded = _decoded_frames(data, path, claimed), True
            if claimed < _UNKNOWN_FRAMES:
                note = f"truncated: the header says {claimed} frames, the stream decodes to {frames}"
        else:
            note = _truncation(f.extra_info)
        info = dict(frames=frames, samplerate=f.samplerate, channels=f.channels, format=fmt, subtype=f.subtype)
    flag = FLAG_EMPTY if frames == 0 else (FLAG_TRUNCATED if note else None)
    return AudioInfo(**info, decoded=decoded, flag=flag, error=note)


def _uncompressed(f) -> bool:
    return f.format in _PCM_CONTAINERS and f.subtype in _PCM_SUBTYPES


def _truncation(log: str) -> str | None:
    """libsndfile's own words when a data chunk claims more than the file holds, else None."""
    m = _SHORT_CHUNK.search(log)
    if m is None or int(m.group(2)) in _PLACEHOLDER_SIZES:
        return None
    return f"truncated: header claims {m.group(2)} data bytes, the file holds {m.group(3)} (libsndfile: {m.group(0)!r})"


def _decoded_frames(data: bytes | None, path: str | None, claimed: int) -> int:
    """Frames counted by decoding everything (a fresh handle: no state left from seeks).

    A decoder error mid-stream (a truncated FLAC: "lost sync") makes the file unreadable, as it
    would make ``soundfile.read`` fail in training; the message says how far decoding got.
    """
    n = 0
    with _open(data, path) as f:
        try:
            while True:
                block = f.read(_DECODE_BLOCK, dtype="int16")
                if not len(block):
                    return n
                n += len(block)
        except Exception as exc:
            message = getattr(exc, "error_string", None) or str(exc)
            raise RuntimeError(f"decoding failed at or after frame {n} of the {claimed} the header claims: "
                               f"{message}") from exc


def _readable_at(f, position: int) -> bool:
    try:
        f.seek(position)
        return len(f.read(1, dtype="int16")) == 1
    except Exception:  # libsndfile refuses the seek: treat as not there
        return False


# -- samples and model frames: pure arithmetic -----------------------------------------------
def resampled_length(frames: np.ndarray, orig_sr: np.ndarray | int, target_sr: int) -> np.ndarray:
    """Samples ``librosa.resample(y, orig_sr=, target_sr=)`` returns for ``frames`` input samples (int64).

    librosa computes ``int(np.ceil(n * (float(target_sr) / orig_sr)))`` in float64 and fixes the
    output to that length (every res_type, soxr_hq included); equal rates return ``y`` itself.
    The float ratio is not exact, so this is NOT ceil(n * target / orig) in integers: 147 samples
    at 44100 Hz -> 48000 Hz give 161, not 160. We repeat librosa's float64 operations to match it.
    """
    import numpy as np

    n = np.asarray(frames, dtype=np.int64)
    orig = np.asarray(orig_sr, dtype=np.int64)
    ratio = float(target_sr) / orig.astype(np.float64)
    out = np.ceil(n.astype(np.float64) * ratio).astype(np.int64)
    return np.where(orig == target_sr, n, out).astype(np.int64)


def conv_frames(samples: np.ndarray, kernels: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Output length of a stack of unpadded 1-d convolutions (Wav2Vec2/HuBERT feature encoder).

    Each layer maps L to floor((L - k) / s) + 1, as ``_get_feat_extract_output_lengths`` does.
    transformers lets lengths go negative for tiny inputs; we clip to 0 (once <= 0 a length stays
    <= 0 through any further layer, so this is exactly max(transformers', 0)).
    """
    if len(kernels) != len(strides):
        raise ValueError(f"{len(kernels)} kernels but {len(strides)} strides")
    import numpy as np

    n = np.asarray(samples, dtype=np.int64)
    for k, s in zip(kernels, strides):
        n = np.maximum(np.floor_divide(n - int(k), int(s)) + 1, 0)
    return n


def mel_frames(samples: np.ndarray, hop_length: int) -> np.ndarray:
    """Log-mel frames WhisperFeatureExtractor computes for an unpadded, untruncated clip.

    A centred STFT gives 1 + L // hop frames and Whisper drops the last: L // hop. Very short clips
    make the extractor itself fail (numpy path under one hop, torch path up to n_fft // 2 = 200
    samples: reflect padding). By default it pads or cuts every clip to ``chunk_length`` seconds
    first, so the model sees ``FrameRule.max_frames`` frames whatever the clip: unpadded is the
    clip's own need, which is what a length audit wants.
    """
    import numpy as np

    return np.asarray(samples, dtype=np.int64) // int(hop_length)


@dataclass(frozen=True)
class FrameRule:
    """How a model turns samples at ``sampling_rate`` into encoder frames."""

    kind: str
    sampling_rate: int
    kernels: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    hop_length: int | None = None
    max_seconds: float | None = None
    origin: str = ""

    def frames(self, samples: np.ndarray) -> np.ndarray:
        """Frames for clips of ``samples`` samples at ``sampling_rate`` (not capped by max_seconds)."""
        if self.kind == "conv":
            return conv_frames(samples, self.kernels, self.strides)
        if self.kind == "mel":
            return mel_frames(samples, self.hop_length)
        raise ValueError(f"unknown frame rule kind {self.kind!r}")

    @property
    def max_frames(self) -> int | None:
        """Frames the extractor keeps at most (Whisper: 30 s -> 3000); longer clips lose the rest."""
        if self.max_seconds is None or self.kind != "mel":
            return None
        return int(round(self.max_seconds * self.sampling_rate)) // self.hop_length


def frame_rule(*, feature_extractor=None, config=None) -> FrameRule | None:
    """The frame rule of a transformers feature extractor and/or model config; None if none applies."""
    from transformers import WhisperFeatureExtractor

    fe = feature_extractor
    if isinstance(fe, WhisperFeatureExtractor):
        origin = f"{type(fe).__name__} hop_length/sampling_rate/chunk_length"
        return FrameRule("mel", int(fe.sampling_rate), hop_length=int(fe.hop_length),
                         max_seconds=float(fe.chunk_length), origin=origin)
    kernels, strides = getattr(config, "conv_kernel", None), getattr(config, "conv_stride", None)
    if _int_seq(kernels) and _int_seq(strides) and len(kernels) == len(strides):
        rate = int(getattr(fe, "sampling_rate", None) or 16000)
        kernels, strides = tuple(int(k) for k in kernels), tuple(int(s) for s in strides)
        origin = f"{type(config).__name__} conv_kernel/conv_stride"
        if getattr(config, "add_adapter", False):
            # transformers counts each adapter layer as kernel 1, stride adapter_stride (its
            # kernel-3, padding-1 convolution has exactly that output length).
            layers, stride = int(config.num_adapter_layers), int(config.adapter_stride)
            kernels, strides = kernels + (1,) * layers, strides + (stride,) * layers
            origin += f" + {layers} adapter layers (stride {stride})"
        return FrameRule("conv", rate, kernels, strides, origin=origin)
    if getattr(config, "model_type", None) == "whisper":
        origin = f"{type(config).__name__}: WhisperFeatureExtractor defaults (hop 160, 16 kHz, 30 s)"
        return FrameRule("mel", 16000, hop_length=160, max_seconds=30.0, origin=origin)
    return None


def _int_seq(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, int) for v in value)
