"""The longest input and target a model accepts, read from its config as its transformers code uses it.

A limit bounds one measurement (``input_tokens``, ``target_tokens``, ``input_seconds``,
``input_frames``); a row is over when its measurement is greater than the limit's value. Each rule
follows how the family's modeling code builds positions (see docs/model-limits.md for the table and
the source lines):

* a *table* has one row per position and indexing past it fails (learned or fixed sinusoidal
  embeddings; RoBERTa-style tables lose ``pad_token_id + 1`` rows to the padding offset);
* a *trained* length is what the model saw in training, but positions are computed for any length
  (RoPE, sinusoids that grow): going past it degrades quality instead of crashing;
* relative buckets, ALiBi and convolutional position embeddings give no limit at all, only a note
  (memory still grows with length).
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.measure.limits import (  # noqa: F401 - re-exported: the records these rules fill
    CONCATENATED_NOTE,
    DECODER_ONLY,
    ENCODER_DECODER,
    ENCODER_ONLY,
    SPEECH_ENCODER,
    SPEECH_SEQ2SEQ,
    UNKNOWN,
    ModelLimit,
    ModelLimits,
)
from lengthscan.policy.model_loading import (  # noqa: F401 - re-exported: where limits come from
    ModelContext,
    ModelError,
    load_model_context,
    read_config,
)

#: transformers' placeholder for "no limit" is int(1e30); anything this large is not a real limit.
_NO_LIMIT = 10**9

#: Config fields tried, in order, for a family without a rule of its own.
GENERIC_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


# -- rules --------------------------------------------------------------------------------------------

TABLE, TRAINED, NONE = "table", "trained", "none"


@dataclass(frozen=True)
class _Positions:
    """How one stack (encoder or decoder) of a family gets its positions."""

    kind: str  # TABLE, TRAINED or NONE
    why: str
    fields: tuple[str, ...] = ("max_position_embeddings",)
    offset: str = ""  # "pad": ids start at pad_token_id + 1; "shift2": the table already has 2 extra rows


_LEARNED = _Positions(TABLE, "learned position table of that many rows")
_PADDED = _Positions(TABLE, "position ids start after padding_idx", offset="pad")
_SHIFT2 = _Positions(TABLE, "learned table of that many + 2 rows, ids shifted by 2", offset="shift2")
_FIXED_SIN = _Positions(TABLE, "fixed sinusoidal table of that many rows")
_N_POSITIONS = _Positions(TABLE, "learned position table of that many rows", ("n_positions", "max_position_embeddings"))
_ROTARY_TABLE = _Positions(TABLE, "precomputed rotary sin/cos table of that many rows", ("n_positions",))
_MPT = _Positions(TABLE, "ALiBi bias precomputed for that many key positions", ("max_seq_len",))
_ROPE = _Positions(TRAINED, "RoPE is computed for any position, not a table")
_GROWN = _Positions(TRAINED, "the sinusoidal table grows past it on demand")
_COMPUTED_SIN = _Positions(TRAINED, "sinusoids are computed for any position")
_RELATIVE = _Positions(NONE, "relative position buckets")
_ALIBI = _Positions(NONE, "ALiBi attention biases computed for any length")

_RULES: dict[str, tuple[str, _Positions, _Positions | None]] = {
    **dict.fromkeys(("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "ibert",
                     "roberta-prelayernorm", "xmod", "luke", "lilt", "markuplm", "layoutlmv3", "mpnet"),
                    (ENCODER_ONLY, _PADDED, None)),
    **dict.fromkeys(("bert", "distilbert", "electra", "albert", "big_bird", "deberta", "deberta-v2"),
                    (ENCODER_ONLY, _LEARNED, None)),
    "modernbert": (ENCODER_ONLY, _ROPE, None),
    **dict.fromkeys(("gpt2", "gpt_bigcode"), (DECODER_ONLY, _N_POSITIONS, None)),
    "gpt_neo": (DECODER_ONLY, _LEARNED, None),
    **dict.fromkeys(("gptj", "codegen"), (DECODER_ONLY, _ROTARY_TABLE, None)),
    **dict.fromkeys(("opt", "biogpt"), (DECODER_ONLY, _SHIFT2, None)),
    "xglm": (DECODER_ONLY, _GROWN, None),
    "bloom": (DECODER_ONLY, _ALIBI, None),
    "mpt": (DECODER_ONLY, _MPT, None),
    "falcon": (DECODER_ONLY, _ROPE, None),
    **dict.fromkeys(("t5", "mt5", "longt5", "umt5", "switch_transformers"), (ENCODER_DECODER, _RELATIVE, _RELATIVE)),
    **dict.fromkeys(("bart", "mbart", "plbart", "mvp"), (ENCODER_DECODER, _SHIFT2, _SHIFT2)),
    **dict.fromkeys(("marian", "pegasus"), (ENCODER_DECODER, _FIXED_SIN, _FIXED_SIN)),
    **dict.fromkeys(("blenderbot", "blenderbot-small"), (ENCODER_DECODER, _LEARNED, _LEARNED)),
    **dict.fromkeys(("m2m_100", "nllb-moe"), (ENCODER_DECODER, _GROWN, _GROWN)),
    "pegasus_x": (ENCODER_DECODER, _COMPUTED_SIN, _COMPUTED_SIN),
    "led": (ENCODER_DECODER, _Positions(TABLE, "learned encoder position table", ("max_encoder_position_embeddings",)),
            _Positions(TABLE, "learned decoder position table", ("max_decoder_position_embeddings",))),
}

#: Speech encoders whose positions come from a convolution (plus relative biases in some): no table.
SPEECH_ENCODERS = frozenset(("wav2vec2", "wav2vec2-conformer", "hubert", "wavlm", "data2vec-audio", "sew", "sew-d",
                             "unispeech", "unispeech-sat"))


def model_limits(ctx: ModelContext) -> ModelLimits:
    """Every limit of ``ctx``'s model on input and target measurements, with notes on the rest."""
    config = ctx.config
    model_type = getattr(config, "model_type", None) or None
    limits: list[ModelLimit] = []
    notes: list[str] = []
    if config is None:
        family = UNKNOWN
        notes.append("no config: only the tokenizer's model_max_length can give a limit")
    elif model_type == "whisper":
        family = SPEECH_SEQ2SEQ
        limits, notes = _whisper(config, ctx.feature_extractor, ctx.tokenizer)
    elif model_type in SPEECH_ENCODERS:
        family = SPEECH_ENCODER
        notes.append(f"{model_type} has convolutional position embeddings, no position table: no input length limit;"
                     " memory and time still grow with the audio's length")
    else:
        family, limits, notes = _text_limits(config, model_type)
    if family not in (SPEECH_ENCODER, SPEECH_SEQ2SEQ):
        _add_tokenizer_limit(ctx.tokenizer, limits, notes)
    if family == DECODER_ONLY and any(x.name == "input_tokens" for x in limits):
        notes.append(CONCATENATED_NOTE)
    fe = ctx.feature_extractor
    rate = getattr(fe, "sampling_rate", None)
    return ModelLimits(ctx.name, model_type, family, tuple(limits), tuple(notes),
                       int(rate) if isinstance(rate, (int, float)) else None)


def _text_limits(config, model_type: str | None) -> tuple[str, list[ModelLimit], list[str]]:
    """Family, limits and notes of a text model: its rule, else RoPE detection, else the generic lookup."""
    rule = _RULES.get(model_type)
    if rule is None:
        # multimodal configs (Gemma 3, LLaVA ...) keep the language model's fields in a text config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        if text is not config and getattr(text, "model_type", None):
            family, limits, notes = _text_limits(text, text.model_type)
            return family, limits, [f"limits from the text config ({text.model_type})", *notes]
        if _rope(config) is not None and isinstance(getattr(config, "max_position_embeddings", None), int):
            rule = (_guess_family(config), _ROPE, None)
        else:
            return _generic(config, model_type)
    family, enc, dec = rule
    enc, dec = _variant(config, model_type, enc), _variant(config, model_type, dec)
    limits, notes = [], []
    for measurement, positions in (("input_tokens", enc), ("target_tokens", dec)):
        if positions is not None:
            _apply(config, model_type, measurement, positions, limits, notes)
    return family, limits, notes


def _variant(config, model_type: str | None, positions: _Positions | None) -> _Positions | None:
    """The rule a config switch selects where one model type has two position schemes."""
    if positions is None:
        return None
    if model_type == "falcon" and getattr(config, "alibi", False):
        return _ALIBI
    if model_type in ("deberta", "deberta-v2") and not getattr(config, "position_biased_input", True):
        # DebertaV2Embeddings builds no position table then; attention uses relative buckets only
        return _RELATIVE
    return positions


def _apply(config, model_type, measurement: str, positions: _Positions, limits: list, notes: list) -> None:
    role = "input" if measurement == "input_tokens" else "target"
    if positions.kind == NONE:
        notes.append(f"{model_type} uses {positions.why}: no {role} position limit; memory still grows with length")
        return
    field, value = next(((f, getattr(config, f, None)) for f in positions.fields
                         if isinstance(getattr(config, f, None), int)), (positions.fields[0], None))
    if value is None:
        notes.append(f"config has no {positions.fields[0]}: {role} position limit unknown")
        return
    source = f"config.{field} {value}"
    if positions.kind == TRAINED:
        origin = f"{source} (trained length, not a hard limit: {positions.why})"
        rope = _rope(config) if positions is _ROPE else None
        if rope:
            notes.append(f"RoPE scaling {rope}: max_position_embeddings {value} is the context the config declares")
    elif positions.offset == "pad":
        # MPNetEmbeddings hard-codes padding_idx = 1; the others take it from config.pad_token_id
        pad = 1 if model_type == "mpnet" else config.pad_token_id
        value -= pad + 1
        origin = (f"{source} - {pad + 1} (hard: position ids start after padding_idx {pad}, "
                  f"so {pad + 1} rows of the table are never used by tokens)")
    elif positions.offset == "shift2":
        origin = f"{source} (hard: the table has {value} + 2 rows and ids are shifted by 2, so all {value} are usable)"
    else:
        origin = f"{source} (hard: {positions.why})"
    limits.append(ModelLimit(measurement, value, origin))


def _whisper(config, feature_extractor, tokenizer) -> tuple[list[ModelLimit], list[str]]:
    limits, notes = [], []
    source = getattr(config, "max_source_positions", None)
    if isinstance(source, int):
        frames = source * 2
        limits.append(ModelLimit("input_frames", frames, (
            f"config.max_source_positions {source} x 2 (encoder positions come after a stride-2 convolution; "
            f"WhisperEncoder.forward raises unless input_features has exactly {frames} mel frames)")))
    fe = feature_extractor
    if fe is not None and getattr(fe, "sampling_rate", None):
        seconds = getattr(fe, "chunk_length", None) or fe.n_samples / fe.sampling_rate
        limits.append(ModelLimit("input_seconds", seconds, (
            f"feature_extractor.chunk_length {seconds} s: WhisperFeatureExtractor pads or truncates every clip "
            "to it, so a longer clip loses its tail")))
        if isinstance(source, int) and getattr(fe, "nb_max_frames", frames) != frames:
            notes.append(f"feature extractor makes {fe.nb_max_frames} mel frames but the encoder requires {frames}")
    else:
        notes.append("no feature extractor (preprocessor_config.json): the input_seconds limit is unknown")
    target = getattr(config, "max_target_positions", None)
    if isinstance(target, int):
        # measured target ids start with <|startoftranscript|>, which the usual fine-tuning collator
        # (DataCollatorSpeechSeq2SeqWithPadding) strips from labels; a tokenizer shown not to add it counts as is
        start = getattr(config, "decoder_start_token_id", None)
        stripped = _first_target_id(tokenizer) in (start, None)
        why = (f" + 1 (target ids start with <|startoftranscript|>, decoder_start_token_id {start}, which the usual "
               "fine-tuning collator strips from labels)" if stripped else
               " (this tokenizer does not start targets with the decoder start token)")
        limits.append(ModelLimit("target_tokens", target + stripped, (
            f"config.max_target_positions {target}{why}; WhisperForConditionalGeneration.forward raises when "
            f"labels are longer than {target}")))
        if stripped:
            notes.append(f"if your collator keeps <|startoftranscript|> in the labels, the target limit is {target}")
    return limits, notes


def _first_target_id(tokenizer) -> int | None:
    """The first id of an encoded target, or None without a tokenizer that encodes targets."""
    try:
        return tokenizer(text_target="a")["input_ids"][0]
    except Exception:  # no tokenizer, or one without targets: nothing known
        return None


def _generic(config, model_type) -> tuple[str, list[ModelLimit], list[str]]:
    family = _guess_family(config)
    for field in GENERIC_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int) and 0 < value < _NO_LIMIT:
            origin = f"config.{field} {value} (generic lookup: no rule for model type {model_type!r})"
            return family, [ModelLimit("input_tokens", value, origin)], [
                f"no rule for model type {model_type!r}: config.{field} is used as the input limit without "
                "checking how the model uses it"]
    return family, [], [f"no rule for model type {model_type!r} and none of {', '.join(GENERIC_FIELDS)} "
                        "in its config: no input limit found"]


def _guess_family(config) -> str:
    if getattr(config, "is_encoder_decoder", False):
        return ENCODER_DECODER
    architectures = getattr(config, "architectures", None) or ()
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures) or _rope(config) is not None:
        return DECODER_ONLY
    return UNKNOWN


def _rope(config) -> str | None:
    """A short description of non-default RoPE scaling, "" for plain RoPE, None when not RoPE."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return "" if getattr(config, "rope_theta", None) else None
    # per-layer-type parameters (Gemma 3 ...) hold one dict per attention type
    nested = not ("rope_type" in params or "type" in params)
    groups = [v for v in params.values() if isinstance(v, dict)] if nested else [params]
    scaled = [g for g in groups if g.get("rope_type", g.get("type", "default")) != "default"]
    return "; ".join(", ".join(f"{k}={v}" for k, v in g.items() if k != "rope_theta") for g in scaled)


def _add_tokenizer_limit(tokenizer, limits: list[ModelLimit], notes: list[str]) -> None:
    length = getattr(tokenizer, "model_max_length", None)
    if not isinstance(length, int) or not 0 < length < _NO_LIMIT:
        return
    current = next((x for x in limits if x.name == "input_tokens"), None)
    if current is None:
        limits.append(ModelLimit("input_tokens", length, (
            f"tokenizer.model_max_length {length} (the config gives no input position limit)")))
    elif current.value != length:
        notes.append(f"tokenizer.model_max_length {length} differs from the model's input limit {current.value}")
