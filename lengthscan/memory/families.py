"""Which family a config belongs to, and which model class (head) is trained."""

from __future__ import annotations

HEAD_CLASSES = {
    "seq2seq": "AutoModelForSeq2SeqLM",
    "causal_lm": "AutoModelForCausalLM",
    "masked_lm": "AutoModelForMaskedLM",
    "classification": "AutoModelForSequenceClassification",
    "ctc": "AutoModelForCTC",
    "whisper": "AutoModelForSpeechSeq2Seq",
}

ENCODER_DECODER = ("bart", "mbart", "pegasus", "marian", "blenderbot", "blenderbot-small", "plbart",
                   "t5", "mt5")
DECODER_ONLY = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt2", "opt", "gpt_neox", "gemma2",
                "gemma3_text", "mixtral", "qwen2_moe", "qwen3_moe")
ENCODER_ONLY = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra")
SPEECH_ENCODERS = ("wav2vec2", "hubert", "wavlm", "data2vec-audio")
SPEECH_SEQ2SEQ = ("whisper",)

#: Heads modelled per family, the usual one first.
HEADS_BY_FAMILY = {"encoder-decoder": ("seq2seq",), "decoder-only": ("causal_lm",),
                   "encoder-only": ("classification", "masked_lm"), "speech-encoder": ("ctc",),
                   "speech-seq2seq": ("whisper",)}

_SUFFIXES = (("ForConditionalGeneration", "seq2seq"), ("ForCausalLM", "causal_lm"), ("LMHeadModel", "causal_lm"),
             ("ForMaskedLM", "masked_lm"), ("ForPreTraining", "masked_lm"),
             ("ForSequenceClassification", "classification"), ("ForCTC", "ctc"))


def family_of(config) -> str:
    """``encoder-decoder``, ``decoder-only``, ``encoder-only``, ``speech-encoder`` or ``speech-seq2seq``."""
    model_type = getattr(config, "model_type", None)
    if model_type in SPEECH_SEQ2SEQ:
        return "speech-seq2seq"
    if model_type in SPEECH_ENCODERS:
        return "speech-encoder"
    if model_type in ENCODER_ONLY:
        return "encoder-only"
    if model_type in DECODER_ONLY:
        return "decoder-only"
    if model_type in ENCODER_DECODER or getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if model_type == "gemma3":
        raise ValueError("model type 'gemma3' is the multimodal Gemma3ForConditionalGeneration (a vision tower beside "
                         "the language model), which is not modelled; its language model is: estimate its text_config "
                         "(model_type 'gemma3_text', what Gemma3ForCausalLM trains): estimate(config.text_config, ...)")
    raise ValueError(f"model type {model_type!r} is not modelled; supported: {', '.join(supported_model_types())}")


def supported_model_types() -> list[str]:
    return sorted((*ENCODER_DECODER, *DECODER_ONLY, *ENCODER_ONLY, *SPEECH_ENCODERS, *SPEECH_SEQ2SEQ))


def resolve_head(config, head: str = "auto") -> str:
    """The head trained: ``head`` itself, else from ``config.architectures``, else the family's usual.

    Usual heads: encoder-decoders ``seq2seq`` (labels are the targets), decoder-only ``causal_lm``
    (labels are the inputs), encoder-only ``classification`` (one label a row), speech encoders
    ``ctc`` (labels are the transcripts), Whisper ``whisper``.
    """
    family = family_of(config)
    allowed = HEADS_BY_FAMILY[family]
    if head != "auto":
        if head not in allowed:
            raise ValueError(f"head {head!r} is not modelled for {family} models; modelled: {', '.join(allowed)}")
        return head
    for architecture in reversed(getattr(config, "architectures", None) or ()):
        if architecture == "ElectraForPreTraining":  # the discriminator (not modelled): the usual head
            continue
        for suffix, name in _SUFFIXES:
            if architecture.endswith(suffix) and name in allowed:
                return name
    return allowed[0]  # an architecture without a modelled head (BartForSequenceClassification ...): the usual one


def model_input_samples(shape) -> int:
    """Audio samples of a speech encoder's batch (``Shape.input_len``)."""
    if not shape.input_len:
        raise ValueError("a speech encoder's shape needs input_len (audio samples)")
    return shape.input_len
