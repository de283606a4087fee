"""Conversations as mistral-common encodes them: Voxtral (whose processor's ``apply_chat_template``
is mistral-common's) and any model whose tokenizer is mistral-common's own file (``tekken.json``,
``tokenizer.model.vN``), measured without a Jinja template.

mistral-common renders no text: its instruct tokenizer encodes each message's pieces between
control tokens (``[INST]``, ``[/INST]``, ``[SYSTEM_PROMPT]``, ``[BEGIN_AUDIO]``...), a conversation
that ends with an assistant turn in ``ValidationMode.finetuning`` (an EOS closes each assistant
turn). So per row:

* ``sequence_tokens``: the length of ``encode_chat_completion`` of the whole conversation;
* ``completion_tokens``: TRL's common-prefix rule per trained assistant message k: the tokens of
  ``messages[:k+1]`` past their common prefix with those of ``messages[:k]`` (encoded as a prompt,
  ``ValidationMode.test``), counted where the former are a prefix of the whole; otherwise the
  encoding rewrites earlier turns (v2/v3 tokenizers put the system prompt in the last user turn:
  ``rewrites_history``) and the row has no completion count;
* audio parts: each clip goes to mistral-common as a one-sample silent clip (one chunk, its
  smallest encoding), and its real chunks are counted from its header (``AudioPartsCounter``'s
  Voxtral family, with the tokenizer's audio config): the difference is added where the clip's
  message is. No clip is decoded;
* ``turns``, ``assistant_turns``; ``longest_message_tokens`` and the per-role content tokens are
  not measured (-1).

String prompt-completion rows are refused with a reason (mistral-common encodes messages), as are
parts other than text and audio.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
from pathlib import Path

import numpy as np

from lengthscan.measure.chat.conversations import RowProblem, conversations
from lengthscan.measure.chat.media import apply_added, trained_messages
from lengthscan.measure.chat.metrics import chat_metrics, empty_measurements
from lengthscan.measure.chat.spans import common_prefix
from lengthscan.measure.chat.template import ChatTemplateError
from lengthscan.measure.records import FLAG_CODES, FLAG_MISSING, Measured

#: mistral-common's tokenizer files, in the order its own loaders look for them
TEKKEN = "tekken.json"
SENTENCEPIECE = ("tokenizer.model.v13", "tokenizer.model.v11", "tokenizer.model.v7m1", "tokenizer.model.v7",
                 "tokenizer.model.v3", "tokenizer.model.v2", "tokenizer.model.v1")


def mistral_tokenizer_file(source) -> str | None:
    """The mistral-common tokenizer file of ``source``, None without one: a folder's own, or a hub
    repository's as the local hub cache holds it (loading the tokenizer downloads it; never a network
    look-up here, which offline would retry for minutes)."""
    folder = Path(str(source))
    for name in (TEKKEN, *SENTENCEPIECE):
        if folder.is_dir():
            if (folder / name).is_file():
                return str(folder / name)
            continue
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(str(source), name)
        except Exception:  # noqa: BLE001 - not a repository name
            return None
        if isinstance(found, str):
            return found
    return None


def _silent_wav(rate: int) -> str:
    """A WAV of one silent 16-bit sample at ``rate``, base64: the smallest clip mistral-common encodes."""
    data = struct.pack("<h", 0)
    header = (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
              rate * 2, 2, 16) + b"data" + struct.pack("<I", len(data)))
    return base64.b64encode(io.BytesIO(header + data).getvalue()).decode()


class MistralChat:
    """Measures conversations with mistral-common's encoding (the ``ChatCounter`` interface); picklable."""

    images = None
    videos = None
    #: measured in one piece: ``--num-proc`` workers measure whole batches (``engines.loop``)
    renders_apart = False
    #: metrics it leaves unmeasured (-1): rules on them are refused at set-up
    unmeasured = ("longest_message_tokens",)

    def __init__(self, counter, options, path: str, audios=None):
        self.counter = counter
        self.options = options
        self.path = str(path)
        self.audios = audios  # measure.audio.parts.AudioPartsCounter (the Voxtral family): audio parts
        self._encoders = None
        self._hash = None

    def __getstate__(self):
        return {**self.__dict__, "_encoders": None}

    # -- set-up -----------------------------------------------------------------------------
    @property
    def encoders(self):
        """(finetuning encoder, prompt encoder, the silent clip): mistral-common loaded once."""
        if self._encoders is None:
            from mistral_common.protocol.instruct.normalize import get_normalizer
            from mistral_common.protocol.instruct.validator import ValidationMode, get_validator
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

            full = MistralTokenizer.from_file(self.path, mode=ValidationMode.finetuning)
            tok = full.instruct_tokenizer.tokenizer
            prompt = MistralTokenizer(full.instruct_tokenizer,
                                      validator=get_validator(tok.version, ValidationMode.test),
                                      request_normalizer=get_normalizer(tok.version, tok.model_settings_builder))
            audio = getattr(tok, "audio", None)
            self._encoders = (full, prompt, _silent_wav(audio.sampling_rate) if audio is not None else None)
        return self._encoders

    @property
    def rule(self) -> str:
        if self.options.train_on == "all":
            return "all tokens (--train-on all)"
        return "TRL's common-prefix rule per assistant message, on mistral-common's encoding"

    def check(self) -> None:
        """Fail early (exit 2): mistral-common missing, the file unreadable, audio the tokenizer lacks."""
        try:
            full, _, silent = self.encoders
        except ImportError:
            raise ChatTemplateError("the tokenizer is mistral-common's own (tekken.json / tokenizer.model.vN): "
                                    "install mistral-common to measure its conversations (pip install "
                                    "'lengthscan[mistral]')") from None
        except Exception as exc:  # noqa: BLE001 - mistral-common's own message
            raise ChatTemplateError(f"{self.path}: mistral-common cannot load it: {exc}") from None
        if self.audios is not None:
            audio = full.instruct_tokenizer.tokenizer.audio
            if audio is None or silent is None:
                raise ChatTemplateError(f"{self.path}: the tokenizer has no audio config: audio parts cannot be "
                                        "encoded")
            hop = audio.encoding_config.hop_length
            self.audios.set_chunks(audio.sampling_rate, audio.chunk_length_s or 0, hop, audio.audio_length_per_tok)
            if not audio.chunk_length_s:
                raise ChatTemplateError(f"{self.path}: an audio config without chunk_length_s (a streaming model): "
                                        "lengthscan counts chunked audio (Voxtral)")

    def to_dict(self) -> dict:
        fmt = self.options.format
        tok = self.encoders[0].instruct_tokenizer.tokenizer
        return {"format": "messages" if fmt.messages else "prompt-completion",
                "columns": {k: v for k, v in (("messages", fmt.messages), ("prompt", fmt.prompt),
                                              ("completion", fmt.completion), ("tools", fmt.tools),
                                              ("audios", fmt.audios)) if v},
                "template": {"origin": f"mistral-common {Path(self.path).name} ({tok.version.value})",
                             "hash": self.file_hash(), "generation_blocks": False},
                "train_on": self.options.train_on, "trained_tokens": self.rule,
                "end_of_turn_token": tok.id_to_piece(tok.eos_id), "token_offsets": "mistral-common",
                **({"audios": self.audios.to_dict()} if self.audios is not None else {})}

    def file_hash(self) -> str:
        if self._hash is None:
            self._hash = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()[:16]
        return self._hash

    def signature(self) -> str:
        from importlib.metadata import version

        fmt = self.options.format
        audios = f"|{fmt.audios}|{self.audios.signature()}" if self.audios is not None else ""
        return (f"mistral-common {version('mistral-common')}|{self.file_hash()}|{self.options.train_on}|"
                f"{fmt.messages}|{fmt.prompt}|{fmt.completion}|{fmt.tools}{audios}")

    # -- measuring --------------------------------------------------------------------------
    def measure(self, columns: dict, spec_of: dict, *, with_ids: bool = False, base_dir: str | None = None) -> Measured:
        convs = conversations(columns, self.options.format)
        n = len(convs)
        metrics, values, notes = empty_measurements(n, audio=self.audios is not None)
        flags = np.zeros(n, np.int8)
        errors: list = [None] * n
        ids_out: list | None = [None] * n if with_ids else None
        labels_out: list | None = [None] * n if with_ids else None
        for i, conv in enumerate(convs):
            try:
                found = self._row(conv, base_dir)
            except RowProblem as exc:
                flags[i], errors[i] = FLAG_CODES[exc.flag], str(exc)
                continue
            if found is None:
                flags[i] = FLAG_MISSING
                continue
            self._fill(i, conv, found, values, notes, errors, ids_out, labels_out)
        return Measured({spec_of[m]: values[m] for m in metrics}, flags,
                        errors if any(e is not None for e in errors) else None, notes=notes, ids=ids_out,
                        labels=labels_out)

    def sequence_lengths(self, columns: dict) -> np.ndarray:
        """Per row, what ``measure`` gives as ``sequence_tokens`` (-1: none): drop-turns' search."""
        specs = {m: m for m in chat_metrics(False, False, self.audios is not None)}
        return np.asarray(self.measure(columns, specs).values["sequence_tokens"], np.int64)

    def _row(self, conv, base_dir):
        """(the whole encoding, its trained spans (None: an encoding rewrites history; a string: why
        there are none), the clips' counts and messages) of one row."""
        if conv is None:
            return None
        if isinstance(conv, RowProblem):
            raise conv
        if conv.text is not None:
            raise RowProblem("unsupported_content", "a string prompt-completion row: mistral-common encodes "
                                                    "messages (give the prompt and completion as message lists)")
        full, prompt, silent = self.encoders
        messages = [_message(m, silent) for m in conv.messages]
        whole = _encode(full, messages, conv.tools)
        try:
            spans = self._spans(conv, messages, whole, full, prompt)
        except RowProblem as exc:  # a prefix mistral-common refuses: the row is kept, without a completion count
            spans = f"no completion count: a prefix of the conversation is refused ({exc})"
        clips = self._clips(conv, base_dir) if self.audios is not None else None
        return whole, spans, clips

    def _spans(self, conv, messages: list, whole: list, full, prompt):
        """Per trained message, its [start, end) in ``whole`` (None: an encoding rewrites history)."""
        if self.options.train_on == "all":
            return [(0, len(whole))]
        spans = []
        for k in sorted(trained_messages(conv, self.options.train_on)):
            if k == 0:
                return None
            upto = _encode(full, messages[:k + 1], conv.tools)
            before = _encode(prompt, messages[:k], conv.tools)
            if upto != whole[:len(upto)]:
                return None
            spans.append((common_prefix(before, upto), len(upto)))
        return spans

    def _clips(self, conv, base_dir):
        from lengthscan.measure.chat.audios import read_clips

        refs = list(conv.audios or ())
        if refs and conv.audio_messages is None:
            raise RowProblem("invalid_conversation", "audio placeholders written in the text: mistral-common takes "
                                                     "audio parts ({\"type\": \"audio\"})")
        clips = read_clips(refs, base_dir)
        if isinstance(clips, tuple):
            raise RowProblem(_flag_name(clips[0]), clips[1])
        return self.audios.count(clips), list(conv.audio_messages or ())

    def _fill(self, i: int, conv, found, values: dict, notes: dict, errors: list, ids_out, labels_out) -> None:
        whole, spans, clips = found
        msgs = conv.messages
        values["sequence_tokens"][i] = len(whole)
        values["turns"][i] = len(msgs)
        values["assistant_turns"][i] = sum(1 for m in msgs if m.get("role") == "assistant")
        notes["from_sharegpt"][i] = conv.sharegpt
        eos = self.encoders[0].instruct_tokenizer.tokenizer.eos_id
        if isinstance(spans, str):
            errors[i] = spans
        elif spans is None:
            notes["rewrites_history"][i] = True
        else:
            trained = sum(b - a for a, b in spans)
            values["completion_tokens"][i], values["prompt_tokens"][i] = trained, len(whole) - trained
            if spans and trained:
                notes["trained_from"][i] = spans[0][0]
                at = spans[-1][1] - 1
                notes["final_eot_at"][i] = at if whole[at] == eos else -1
                notes["ends_with_eot"][i] = whole[at] == eos
            if ids_out is not None and not (clips and clips[0]):  # a clip's ids are its silent stand-in's
                ids_out[i] = list(whole)
                labels = np.full(len(whole), -100, np.int64)
                for a, b in spans:
                    labels[a:b] = whole[a:b]
                labels_out[i] = labels.tolist()
        if clips is not None:
            counts, where = clips
            silent = self.audios.voxtral_tokens(1)
            added = [c.tokens - silent for c in counts]
            values["audios"][i] = len(counts)
            values["audio_tokens"][i] = sum(c.tokens for c in counts)
            values["audio_seconds"][i] = sum(c.samples for c in counts) / self.audios.rate
            notes["max_audio_tokens"][i] = max((c.tokens for c in counts), default=0)
            notes["audio_lost_ms"][i] = 0
            apply_added(i, conv, sum(added), added, where, values, notes, self.options.train_on)


def _encode(encoder, messages: list, tools) -> list[int]:
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    try:
        request = ChatCompletionRequest.from_openai(messages, tools=tools or None)
        return list(encoder.encode_chat_completion(request).tokens)
    except Exception as exc:  # noqa: BLE001 - mistral-common's own message, per row
        text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        raise RowProblem("template_error", f"mistral-common refuses the conversation: {text}") from None


def _message(message: dict, silent: str | None) -> dict:
    """The message as mistral-common's ``from_openai`` takes it: audio parts as the silent clip."""
    content = message.get("content")
    if not isinstance(content, (list, tuple)):
        return message
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "audio" and silent is not None:
            parts.append({"type": "input_audio", "input_audio": {"data": silent, "format": "wav"}})
        else:
            raise RowProblem("unsupported_content", f"a {kind!r} part: lengthscan encodes text and audio parts "
                                                    "with mistral-common")
    return {**message, "content": parts}


def _flag_name(code: int) -> str:
    return next(name for name, c in FLAG_CODES.items() if c == code)

