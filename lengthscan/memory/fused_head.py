"""The heads TRL's preference and RL trainers put on a decoder instead of the logits and the loss.

``log_probs``: TRL's ``add_fused_lm_head`` (``trl/trainer/utils.py``), which ``DPOTrainer`` and
``GRPOTrainer`` call with ``model(..., labels=labels, fused_lm_head=True)``. It never materialises the
``(rows, length, vocab)`` logits: ``ChunkedLogProbFunction`` (``trl/kernels/chunked_logprob.py``)
projects ``TOKEN_CHUNK`` positions at a time onto ``VOCAB_CHUNK`` words into one reused buffer and
folds each tile into per-position statistics (Triton on CUDA: the fold allocates nothing). What it
allocates, as that file does:

* the hidden states of the scored positions copied out (``last_hidden_state[:, :-1]`` gathered by
  the label mask; without Triton, every position: the bound priced here), kept for backward with the
  int64 targets and ``log_z`` (fp32, one per position);
* seven fp32 vectors of per-position statistics and the ``(min(N, 4096), 32768)`` tile buffer in the
  compute dtype (autocast's, else the hidden states'): **32,768 columns whatever the vocabulary**;
  the hidden chunk and each weight chunk cast to the compute dtype when theirs differs;
* the per-position log-probabilities (fp32), scattered back to ``(rows, length - 1)``;
* backward: the hidden states' and (when the head trains) the head weight's gradients accumulated in
  fp32, the tile buffer again, the casts, then the gradients cast to their tensors' dtypes.

``score``: ``AutoModelForSequenceClassification`` (``RewardTrainer``): a bias-free ``score`` linear
to ``num_labels`` (1) on every position, the last real token's score gathered per row, and
``-logsigmoid(chosen - rejected)``: no vocabulary-wide tensor at all.
"""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.tape import BYTES, Tape, Tensor

#: ``trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE`` and ``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE``
TOKEN_CHUNK, VOCAB_CHUNK = 4096, 32768
#: the fp32 per-position statistics the forward allocates (running max, sums, target logit ...)
STATISTICS = 7


@ops.op_kind("logits_loss")
def log_probs(t: Tape, h: Tensor, d: int, vocab: int, rows: int, batch: int, *, name: str = "lm_head",
              tie: str | None = None, bias: bool = False, trainer: str = "dpo") -> tuple:
    """TRL's fused head on ``h`` (``rows = batch x length`` positions): returns (loss, log_probs).

    ``trainer``: ``dpo`` and ``grpo`` build their labels from the batch (``masked_fill``: a new int64
    tensor); ``grpo`` and ``sft`` also ask for the entropy (one more fp32 vector, kept), ``sft`` for the
    top-1 flags (booleans) its token accuracy reads."""
    w = t.param(f"{name}.weight", vocab * d, tie=tie, shape=(vocab, d))
    b = t.param(f"{name}.bias", vocab) if bias else None
    n = rows - batch  # last_hidden_state[:, :-1]: every position but the last of each row
    entropy = trainer in ("grpo", "sft")
    # the trainer's labels: input_ids.masked_fill(completion_mask == 0, -100); SFTTrainer's come with the batch
    labels = t.new(rows, "i64", False) if trainer != "sft" else None
    mask = t.new(n, "bool", False)  # labels[:, 1:] != -100
    hidden = t.new(n * d, h.dtype, h.requires_grad)  # gathered (Triton) or reshaped (a copy of a slice)
    t.node([h], [hidden], [])
    targets = t.new(n, "i64", False)
    compute = t.low or hidden.dtype  # torch.get_autocast_dtype under autocast, else the hidden states' dtype
    tile = min(n, TOKEN_CHUNK)
    stats = t.new(STATISTICS * n, "f32", False)
    buffer = t.new(tile * VOCAB_CHUNK, compute, False)
    chunk = t.new(tile * d, compute, False) if hidden.dtype != compute else None  # hidden[a:b].to(compute)
    weight_cast = min(vocab, VOCAB_CHUNK) * d * BYTES[compute] if w.dtype != compute else 0  # inside torch.mm
    log_z = t.new(n, "f32", False)
    out = t.new(n, "f32", ops.needs_grad(hidden, w, b))
    extra = t.new(n, "f32", False) if entropy else None  # log_z - x_sum_exp / sum_exp
    top1 = t.new(n, "bool", False) if trainer == "sft" else None  # (target >= max) & (target > max before it)
    for x in (stats, buffer, chunk):  # the function's locals, alive until it returns
        if x is not None:
            t.use(x)
    accumulators = (n * d * 4 if hidden.dtype != "f32" else 0) + (vocab * d * 4 if w.dtype != "f32" and
                                                                   w.requires_grad else 0)
    # backward binds each chunk's cast to a name: the next chunk's is made before the last one is let go
    backward = tile * VOCAB_CHUNK * BYTES[compute] + accumulators + \
        (_two_chunks(n, TOKEN_CHUNK) * d * BYTES[compute] if chunk is not None else 0) + \
        (_two_chunks(vocab, VOCAB_CHUNK) * d * BYTES[compute] if weight_cast else 0)
    t.node([hidden, w, b], [out], [hidden, targets, log_z, extra], forward_workspace=weight_cast + n * 4,
           workspace=backward)
    scattered = t.new(n, "f32", out.requires_grad)  # masked_fill / masked_scatter back to (rows, length - 1)
    t.node([out], [scattered], [mask], forward_workspace=n)
    loss = t.new(1, "f32", scattered.requires_grad)
    t.node([scattered], [loss], [])
    for x in (labels, top1):  # alive until the trainer's loss returns
        if x is not None:
            t.use(x)
    return loss, scattered


def _two_chunks(total: int, chunk: int) -> int:
    """The most rows two consecutive chunks of ``total`` rows hold together."""
    return min(total, chunk) + min(max(total - chunk, 0), chunk)


@ops.op_kind("logits_loss")
def score(t: Tape, h: Tensor, d: int, rows: int, batch: int, *, num_labels: int = 1) -> tuple:
    """A sequence classifier's head on ``h``: the scores of every position, the last real one's per row."""
    scores = ops.linear(t, h, d, num_labels, "score", bias=False)
    pooled = ops.select(t, scores, batch * num_labels)
    loss = t.new(1, "f32", pooled.requires_grad)
    t.node([pooled], [loss], [pooled])
    return loss, pooled


@ops.op_kind("logits_loss")
def last_logits(t: Tape, h: Tensor, d: int, vocab: int, batch: int, *, name: str = "lm_head",
                tie: str | None = None, bias: bool = False) -> tuple:
    """``generate``'s prefill: the head on each row's last position only (``logits_to_keep=1``), and the
    fp32 copy ``generate`` takes of it (``logits[:, -1].to(float32, copy=True)``)."""
    last = ops.select(t, h, batch * d)
    logits = ops.linear(t, last, d, vocab, name, bias, tie=tie)
    scores = t.new(batch * vocab, "f32", False)
    t.node([logits], [scores], [])
    return t.new(1, "f32", False), scores
