"""``Seq2SeqTrainer``'s ``predict_with_generate``: what ``model.generate`` adds to an evaluation batch.

As ``Seq2SeqTrainer.prediction_step`` runs it on the installed transformers (5.x), per batch:

1. ``model.generate`` (``torch.no_grad``) up to ``generation_max_length`` tokens (the decoder start
   token included) with ``generation_num_beams`` beams, priced for the worst case: no row ends early
   (every row runs to the maximum length), which is what a model that has not learnt to stop does;
2. then the loss forward (teacher forcing, the same pass as without generation) whose outputs are
   dropped once the loss is taken;
3. the generated tokens (padded to the model's ``generation_config.max_length``, 20 by default, when
   shorter) and the labels (padded likewise) are kept as the predictions, int64.

Inside ``generate``, for an encoder-decoder:

* the encoder runs once through the encoder module itself, outside accelerate's autocast wrapper
  of the model's ``forward``: in the weights' dtype, activations freed layer by layer;
* with ``K`` beams the encoder's output and the attention mask are repeated to ``B*K`` rows
  (``repeat_interleave``: a copy while the original lives; then the original is dropped);
* every decoding step runs the model's (autocast) ``forward`` on one token per row: the first step
  projects the encoder output into every decoder layer's cross-attention keys and values
  (``2 x layers x B*K x S x heads*head_dim``, kept to the end), and each step appends one position
  to every layer's self-attention keys and values (``torch.cat``: the old and the new tensor of one
  layer at a time);
* each step's logits: the head's output (in the compute dtype; BART-like models add
  ``final_logits_bias``: a second tensor), accelerate's fp32 copy under mixed precision,
  ``logits[:, -1].to(float32, copy=True)``, and the logits processors' outputs (a forced EOS
  token at the last step fills a new tensor); beam search adds ``log_softmax`` and the beam
  scores' sum, each ``B*K x vocab`` fp32; after each step the cache is reordered by beam
  (``index_select``: one layer's cross-attention key copied at a time).

The peak is the largest of: the encoder pass, the expansion, the last step's logits and (with beams)
the last reorder, each on top of what generation holds then.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lengthscan.memory.families import family_of
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.tape import BYTES
from lengthscan.memory.weights import TORCH_DTYPES

#: ``GenerationConfig().max_length``: the padding length of predictions and labels without one in the model
DEFAULT_MAX_LENGTH = 20


@dataclass(frozen=True)
class Decoder:
    """The decoder sizes generation's cache depends on."""

    layers: int
    attn_width: int  # heads x head_dim of one key (or value) row
    d_model: int
    vocab: int
    logits_bias: bool  # BART-like ``final_logits_bias``
    forced_eos: bool  # a forced EOS token at the last step (``forced_eos_token_id``)


def decoder_of(config) -> Decoder:
    """The generating decoder of an encoder-decoder ``config``; refuses other families."""
    family = family_of(config)
    if family != "encoder-decoder":
        raise ValueError(f"predict_with_generate is priced for encoder-decoder text models (BART, T5, ...), not "
                         f"{config.model_type!r} ({family}): evaluate with the loss and logits instead")
    mt = config.model_type
    if mt in ("t5", "mt5"):
        layers = config.num_decoder_layers if config.num_decoder_layers is not None else config.num_layers
        width, bias = config.num_heads * config.d_kv, False
    else:
        layers, width = config.decoder_layers, config.d_model
        bias = mt in ("bart", "mbart", "plbart", "pegasus", "marian", "blenderbot", "blenderbot-small")
    return Decoder(layers, width, config.d_model, config.vocab_size, bias,
                   getattr(config, "forced_eos_token_id", None) is not None)


def model_max_length(config) -> int:
    """``model.generation_config.max_length``: what ``prediction_step`` pads predictions and labels to."""
    value = getattr(config, "max_length", None)
    return int(value) if value else DEFAULT_MAX_LENGTH


@dataclass(frozen=True)
class Generation:
    """The peak ``generate`` reaches on one batch, above the training state and the batch."""

    peak: int  # bytes above the resident state and the batch
    moment: str
    terms: dict


def decoder_weight_copies(tape, low: str | None) -> int:
    """Autocast's cached low-precision copies of the decoder's and the head's weights: what one decoding
    step's forward holds until it returns (``tape``: the evaluation forward traced under the same options)."""
    if low is None:
        return 0
    copies = {}
    for name, p in tape.params.items():
        decoder = ".decoder." in f".{name}" or name.startswith(("lm_head", "shared", "model.shared"))
        copy = p.cast.get(low)
        if decoder and copy is not None and not name.endswith(".bias"):
            copies[id(p)] = copy.nbytes
    return sum(copies.values())


def generation_peak(config, shape: Shape, options: MemoryOptions, max_length: int, num_beams: int,
                    encoder_pass: int, weight_copies: int = 0) -> Generation:
    """``generate``'s peak on ``shape`` (``encoder_pass``: the encoder's no-grad peak above the state;
    ``weight_copies``: :func:`decoder_weight_copies`)."""
    dec = decoder_of(config)
    b, s, k = shape.batch_size, shape.input_len, num_beams
    bk = b * k
    weights = BYTES[TORCH_DTYPES[options.torch_dtype]]
    if options.quantization is not None and options.prepare_kbit:
        weights = 4  # prepare_model_for_kbit_training casts every unquantized parameter (embeddings too) to fp32
    low = options.precision != "fp32"
    cache = 2 if low else weights  # k_proj/v_proj outputs under autocast, else the hidden states' dtype
    enc = b * s * dec.d_model * weights
    moments = [("encoder", {"generation_encoder": encoder_pass})]
    held = {"encoder_output": enc}
    if k > 1:
        expanded = bk * s * dec.d_model * weights
        moments.append(("expand", {"encoder_output": enc + expanded, "attention_mask": bk * s * 8}))
        held = {"encoder_output": expanded, "attention_mask": bk * s * 8}
    steps = max(max_length - 1, 1)  # the decoder start token is the first of max_length
    cross_layer = bk * s * dec.attn_width * cache
    self_layer = bk * steps * dec.attn_width * cache
    held["cross_attention_cache"] = 2 * dec.layers * cross_layer
    held["self_attention_cache"] = 2 * dec.layers * self_layer
    # beams: running and finished sequences (B, K, max_length) int64, their top-2K candidates, beam indices (int32)
    held["sequences"] = bk * max_length * (56 if k > 1 else 16)
    logits = bk * dec.vocab
    fp32 = logits * 4
    prev = (2 if k > 1 else 1) * fp32  # the previous step's logits and scores, bound until reassigned
    head_c = 2 if low else weights  # lm_head's output: autocast's dtype, else the weights'
    head = logits * head_c
    summed = head_c
    if dec.logits_bias:  # + final_logits_bias (a buffer in the weights' dtype): type promotion
        summed = max(head_c, weights)
        head += logits * summed + (logits * 4 if summed != head_c else 0)  # the sum, and the upcast operand
    moments.append(("last step: head", {**held, "weight_copies": weight_copies, "generation_logits": prev + head}))
    out = fp32 if low else logits * summed  # the step's output logits (accelerate's fp32 under mixed precision)
    # convert_outputs_to_fp32 also copies the output's encoder_last_hidden_state (the expanded encoder output)
    enc_fp32 = bk * s * dec.d_model * 4 if low and weights != 4 else 0
    if low and summed != 4:  # convert_outputs_to_fp32, once autocast's weight copies are gone
        moments.append(("last step: fp32 outputs", {**held, "generation_logits": prev + logits * summed + fp32,
                                                   "encoder_output_fp32": enc_fp32}))
    # greedy: the previous step's scores, the new fp32 copy, a forced EOS' new tensor; beams: the previous
    # logits and log-probabilities, the new copy, log_softmax and the processors' output (three at most)
    copies = 3 if k > 1 else 2 + dec.forced_eos
    moments.append(("last step: logits", {**held, "generation_logits": out + copies * fp32,
                                          "encoder_output_fp32": enc_fp32}))
    if k > 1:  # the cache reordered by beam: one layer's key or value copied at a time
        moments.append(("reorder", {**held, "generation_logits": 2 * fp32,
                                    "cache_reorder": max(cross_layer, self_layer)}))
    name, terms = max(moments, key=lambda m: sum(m[1].values()))
    return Generation(sum(terms.values()), name, {t: v for t, v in terms.items() if v})


def encoder_options(options: MemoryOptions) -> MemoryOptions:
    """The options of ``generate``'s encoder pass: no autocast, no checkpointing."""
    return replace(options, precision="fp32", gradient_checkpointing=False, gradient_accumulation_steps=1)
