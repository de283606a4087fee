"""Audio inside conversations: each clip's tokens as the model's processor counts them, from the
samples and rate its header gives (``durations.read_info``), never decoding.

The processor loads a clip at its feature extractor's rate (transformers' ``load_audio``: soundfile,
then ``soxr`` resampling to exactly ``ceil(frames x rate / file rate)`` samples), and its feature
extractor turns L samples into mel frames, then the processor into audio tokens:

* **Qwen2-Audio**, **Qwen2.5-Omni**: Whisper features padded to ``max_length`` and truncated to
  ``n_samples`` (``chunk_length`` seconds: 30 for Qwen2-Audio, 300 for Qwen2.5-Omni):
  ``m = ceil(min(L, n_samples) / hop)``, tokens ``((m - 1) // 2 + 1 - 2) // 2 + 1`` (25 a second).
  A longer clip is **cut silently**: the row says how much (``audio_lost_ms``).
* **Qwen3-Omni**: no truncation, padded to the longest clip of the call (a conversation's clips
  go through one call): a clip gets ``min(ceil(L / hop), floor(longest / hop))`` frames (the
  longest ``floor``, the others mostly ``ceil``); tokens per 100-frame window: 13 for each whole one, and the rest's
  ``((((r - 1) // 2 + 1) - 1) // 2 + 1 - 1) // 2 + 1``.
* **Phi-4-multimodal**: ``(L - 400) // 160 + 1`` frames, tokens ``ceil(frames / 8)``; never cut.
* **Gemma 3n**: 188 tokens a clip (``audio_seq_length``), whatever its length; past 30 s cut silently.
* **Voxtral** (mistral-common's audio encoder, which ``VoxtralProcessor.apply_chat_template``
  calls): the clip resampled with ``soxr`` to ``round(frames x rate / file rate)`` samples, padded
  to whole 30-second chunks (``chunk_length_s``), ``[BEGIN_AUDIO]`` and one ``[AUDIO]`` per
  ``sampling_rate / frame_rate`` samples (12.5 a second): 375 a chunk; never cut. The tokenizer's
  ``audio`` config (``tekken.json``) sets the figures (``MistralChat`` passes them).
* **Gemma 4**: the mel frames whose whole window is real audio (``(L + frame // 2 - frame - 1) // hop
  + 1``, 20 ms frames every 10 ms, ``L`` cut at 30 s), halved twice (``ceil``) by its two stride-2
  convolutions, at most ``audio_seq_length`` (750): 25 a second; past 30 s cut silently.

The processor writes its audio token (the tokenizer's ``audio_token``, else the family's) once per
audio token, in place of the one the chat template writes; Gemma 3n writes
``"\n\n" + <boa> + its tokens + <eoa> + "\n\n"``, whose blank lines are tokenized with the text around them,
Gemma 4 ``<boa> + its tokens + <eoa>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from lengthscan.measure.model_files import config_files

#: Per-row measurements of a conversation field with audio (lengths.parquet columns, rule metrics).
AUDIO_PART_METRICS = ("audio_tokens", "audios", "audio_seconds")
#: Per-row side columns: the costliest clip's tokens, what the processor cuts off (milliseconds), and
#: whether it cuts any.
AUDIO_PART_NOTES = {"max_audio_tokens": "int64", "audio_lost_ms": "int64", "audio_truncated": "bool"}
#: processor classes -> family
FAMILIES = {"Qwen2AudioProcessor": "qwen2_audio", "Qwen2_5OmniProcessor": "qwen2_5_omni",
            "Qwen3OmniMoeProcessor": "qwen3_omni", "Phi4MultimodalProcessor": "phi4", "Gemma3nProcessor": "gemma3n",
            "Gemma4Processor": "gemma4", "VoxtralProcessor": "voxtral"}
#: the audio token each family's processor writes where the tokenizer names none
TOKENS = {"qwen2_audio": "<|AUDIO|>", "qwen2_5_omni": "<|AUDIO|>", "qwen3_omni": "<|audio_pad|>",
          "phi4": "<|endoftext11|>", "gemma3n": "<audio_soft_token>", "gemma4": "<audio_soft_token>",
          "voxtral": "[AUDIO]"}
#: Gemma 3n and Gemma 4 keep the first 30 s of a clip (their feature extractors' max_length); Gemma 3n
#: gives every clip ``audio_seq_length`` tokens between its begin- and end-of-audio tokens, with blank
#: lines around
GEMMA_SAMPLES = 480_000
#: the processors' own ``audio_seq_length`` defaults
SEQ_LENGTHS = {"gemma3n": 188, "gemma4": 750}
#: the feature extractor's chunk_length (seconds) where its config gives none (WhisperFeatureExtractor: 30)
CHUNK_SECONDS = 30


class AudioRefused(ValueError):
    """The processor would refuse this clip (the message says why)."""


class AudioConfigError(ValueError):
    """The model's processor counts no audio lengthscan knows (exit 2)."""


@dataclass(frozen=True)
class ClipCount:
    samples: int     # at the feature extractor's rate
    tokens: int
    lost: int        # samples the processor cuts off


class AudioPartsCounter:
    """Counts a conversation's clips for one model's processor; picklable."""

    def __init__(self, source: str, tokenizer=None):
        self.source = str(source)
        configs = config_files(self.source, ("processor_config.json", "preprocessor_config.json"),
                               AudioConfigError)
        named = next((c.get("processor_class") for c in (configs.get("processor_config.json"),
                                                          configs.get("preprocessor_config.json")) if c
                      and c.get("processor_class")), None)
        self.processor_type = named
        self.family = FAMILIES.get(named or "")
        if self.family is None:
            raise AudioConfigError(f"{self.source}: {named or 'no processor_class named'}: lengthscan counts the "
                                   f"audio tokens of {', '.join(sorted(FAMILIES))}")
        nested = (configs.get("processor_config.json") or {}).get("feature_extractor")
        fe = nested if isinstance(nested, dict) else configs.get("preprocessor_config.json") or {}
        self.seq_length = int((configs.get("processor_config.json") or {}).get("audio_seq_length")
                              or SEQ_LENGTHS.get(self.family, 0))
        self.rate = int(fe.get("sampling_rate") or 16000)
        self.hop = int(fe.get("hop_length") or 160)
        if self.family == "gemma4":  # its feature extractor's frames, in milliseconds
            self.frame = int(round(self.rate * float(fe.get("frame_length_ms") or 20.0) / 1000.0))
            self.hop = int(round(self.rate * float(fe.get("hop_length_ms") or 10.0) / 1000.0))
        self.n_samples = int(fe.get("chunk_length") or CHUNK_SECONDS) * self.rate  # as WhisperFeatureExtractor sets it
        self.per_token = 8  # Voxtral: mel frames a token (16 kHz / 12.5 Hz / hop 160), until set_chunks
        self.bind(tokenizer)

    def bind(self, tokenizer) -> None:
        self.audio_token = getattr(tokenizer, "audio_token", None) or TOKENS[self.family]
        self.boa = getattr(tokenizer, "boa_token", None) or "<start_of_audio>"
        self.eoa = getattr(tokenizer, "eoa_token", None) or "<end_of_audio>"

    def replacement(self, count: ClipCount) -> str | None:
        """The text the processor writes for a clip's audio token (None: the token repeated)."""
        if self.family == "gemma4":
            return f"{self.boa}{self.audio_token * count.tokens}{self.eoa}"
        if self.family != "gemma3n":
            return None
        return f"\n\n{self.boa}{self.audio_token * count.tokens}{self.eoa}\n\n"

    def samples(self, frames: int, rate: int) -> int:
        """Samples at the feature extractor's rate: ``load_audio``'s ``ceil(frames x rate / file rate)``
        (Voxtral: mistral-common's ``soxr.resample``, which rounds half up)."""
        if rate == self.rate:
            return frames
        if self.family == "voxtral":
            return (2 * frames * self.rate + rate) // (2 * rate)
        return -(-frames * self.rate // rate)

    def set_chunks(self, rate: int, chunk_seconds: float, hop: int, per_token: int) -> None:
        """Voxtral: the figures of the tokenizer's audio config (mistral-common's ``AudioConfig``)."""
        self.rate, self.hop, self.per_token = rate, hop, per_token
        self.n_samples = int(chunk_seconds * rate)

    def count(self, clips: list[tuple[int, int]]) -> list[ClipCount]:
        """Per clip of one conversation ((frames, file rate)): its count."""
        lengths = [self.samples(f, r) for f, r in clips]
        if self.family in ("qwen2_audio", "qwen2_5_omni"):
            out = []
            for n in lengths:
                m = -(-min(n, self.n_samples) // self.hop)
                out.append(ClipCount(n, ((m - 1) // 2 + 1 - 2) // 2 + 1, max(0, n - self.n_samples)))
            return out
        if self.family == "qwen3_omni":  # padded to the longest: its mask keeps floor(longest / hop) columns
            top = max(lengths) // self.hop
            return [ClipCount(n, _omni3_tokens(min(-(-n // self.hop), top)), 0) for n in lengths]
        if self.family == "gemma3n":
            return [ClipCount(n, self.seq_length, max(0, n - GEMMA_SAMPLES)) for n in lengths]
        if self.family == "voxtral":
            return [ClipCount(n, self.voxtral_tokens(n), 0) for n in lengths]
        if self.family == "gemma4":
            return [ClipCount(n, self._gemma4_tokens(min(n, GEMMA_SAMPLES)), max(0, n - GEMMA_SAMPLES))
                    for n in lengths]
        out = []
        for n in lengths:  # phi4
            feat = (n - 400) // 160 + 1
            if feat <= 0:
                raise AudioRefused(f"{n} samples: shorter than one 400-sample window")
            out.append(ClipCount(n, math.ceil(feat / 8), 0))
        return out

    def voxtral_tokens(self, n: int) -> int:
        """``[AUDIO]`` tokens of ``n`` samples: padded to whole chunks, in mel frames, a token per
        ``per_token`` frames (mistral-common's ``_encode_audio_tokens``)."""
        padded = -(-n // self.n_samples) * self.n_samples
        frames = math.ceil(padded / self.hop - 1) if padded % self.hop else padded // self.hop
        return math.ceil(frames / self.per_token)

    def _gemma4_tokens(self, n: int) -> int:
        """Gemma 4's frames whose window is all real audio, through its two stride-2 convolutions."""
        valid = max(0, (n + self.frame // 2 - self.frame - 1) // self.hop + 1)
        for _ in range(2):
            valid = (valid + 1) // 2
        return min(valid, self.seq_length)

    def to_dict(self) -> dict:
        return {"source": self.source, "processor": self.processor_type, "audio_token": self.audio_token,
                "sampling_rate": self.rate, "hop_length": self.hop,
                "max_seconds": (self.n_samples / self.rate if self.family in ("qwen2_audio", "qwen2_5_omni")
                                else GEMMA_SAMPLES / self.rate if self.family in ("gemma3n", "gemma4") else None),
                **({"chunk_seconds": self.n_samples / self.rate,
                    "tokens_per_chunk": self.voxtral_tokens(self.n_samples)} if self.family == "voxtral" else {})}

    def signature(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _omni3_tokens(m: int, n_window: int = 50) -> int:
    """``_get_feat_extract_output_lengths`` of Qwen3-Omni's processor."""
    chunk = 2 * n_window
    rest = m % chunk
    f = (rest - 1) // 2 + 1
    return ((f - 1) // 2 + 1 - 1) // 2 + 1 + (m // chunk) * 13
