"""Encoder-only text models: BERT-like (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA), post-LN layers."""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.blocks import Attn, attention, lm_loss, mask
from lengthscan.memory.tape import Tape

ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
BERT_TYPES = ("bert", *ROBERTA_TYPES)
DISTILBERT_TYPES = ("distilbert",)
ELECTRA_TYPES = ("electra",)  # BERT's layers; embeddings of embedding_size, projected to hidden_size


def trace(t: Tape, c, batch: int, seq: int, opts, padding: bool, head: str) -> None:
    """``BertForSequenceClassification`` (``classification``) or ``BertForMaskedLM`` (``masked_lm``)."""
    if c.model_type in DISTILBERT_TYPES:
        return _distilbert(t, c, batch, seq, opts, padding, head)
    roberta, electra = c.model_type in ROBERTA_TYPES, c.model_type in ELECTRA_TYPES
    prefix = "roberta" if roberta else "electra" if electra else "bert"
    d, n = c.hidden_size, batch * seq
    e = getattr(c, "embedding_size", d) if electra else d
    ids, amask = t.input(n), t.input(n)
    emb = f"{prefix}.embeddings"
    for _ in range(2):  # position_ids and token_type_ids buffers
        t.new(c.max_position_embeddings, "i64", False, "buffers", held=True)
    x = ops.embedding(t, ids, n, c.vocab_size, e, f"{emb}.word_embeddings")
    types = t.new(1, "i64", False)
    x = ops.binary(t, x, ops.embedding(t, types, n, c.type_vocab_size, e, f"{emb}.token_type_embeddings"))
    pos_ids = t.new(n if roberta else seq, "i64", False)  # RoBERTa numbers positions from the ids, per row
    pos = ops.embedding(t, pos_ids, n if roberta else seq, c.max_position_embeddings, e,
                        f"{emb}.position_embeddings")
    h = ops.layer_norm(t, ops.binary(t, x, pos), e, f"{emb}.LayerNorm")
    h = ops.dropout(t, h, c.hidden_dropout_prob)
    if e != d:
        h = ops.linear(t, h, e, d, f"{prefix}.embeddings_project")
    embedding_output = h if e == d else None  # BertModel.forward holds it until the encoder returns (ELECTRA
    # rebinds its projection)
    m = mask(t, batch, seq, seq, opts.attention) if padding else None
    a = Attn(d, c.num_attention_heads, d // c.num_attention_heads, dropout=c.attention_probs_dropout_prob,
             names=("self.query", "self.key", "self.value", "output.dense"))
    for i in range(c.num_hidden_layers):
        name = f"{prefix}.encoder.layer.{i}"
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m])[0]
        x = attention(t, h, None, a, f"{name}.attention", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=False)
        h = _add_norm(t, x, h, d, c.hidden_dropout_prob, f"{name}.attention.output.LayerNorm")
        inter = ops.activation(t, ops.linear(t, h, d, c.intermediate_size, f"{name}.intermediate.dense"),
                               c.hidden_act)
        x = ops.linear(t, inter, c.intermediate_size, d, f"{name}.output.dense")
        h = _add_norm(t, x, h, d, c.hidden_dropout_prob, f"{name}.output.LayerNorm")
        t.use(inter)  # feed_forward_chunk holds intermediate_output until self.output(...) returns
        t.end_layer(h)
    if embedding_output is not None:
        t.use(embedding_output)
    if head == "masked_lm" and electra:
        _electra_mlm(t, c, h, d, e, n, amask)
    elif head == "masked_lm":
        _mlm(t, c, h, d, n, roberta, prefix, amask)
    else:
        _classify(t, c, h, d, batch, roberta or electra, prefix, amask, "gelu" if electra else "tanh")


def _add_norm(t: Tape, x, residual, d: int, p: float, name: str):
    """``LayerNorm(dropout(x) + input_tensor)``: both operands stay alive until the norm returns."""
    x = ops.dropout(t, x, p)
    h = ops.layer_norm(t, ops.binary(t, x, residual), d, name)
    t.use(x)
    t.use(residual)
    return h


def _mlm(t: Tape, c, h, d: int, n: int, roberta: bool, prefix: str, amask) -> None:
    name = "lm_head" if roberta else "cls.predictions"
    dense = f"{name}.dense" if roberta else f"{name}.transform.dense"
    norm = f"{name}.layer_norm" if roberta else f"{name}.transform.LayerNorm"
    x = ops.activation(t, ops.linear(t, h, d, d, dense), "gelu" if roberta else c.hidden_act)
    x = ops.layer_norm(t, x, d, norm)
    labels = t.input(n)
    tie = f"{prefix}.embeddings.word_embeddings.weight" if getattr(c, "tie_word_embeddings", True) else None
    t.param(f"{name}.bias", c.vocab_size)  # the decoder's bias (tied with it only when the embeddings are)
    loss, logits = lm_loss(t, x, d, c.vocab_size, n, labels, name=f"{name}.decoder", tie=tie, bias=tie is None,
                           upcast=False, vocab_bias=f"{name}.bias" if tie else None)
    t.finish(loss, keep=[logits, amask])


def _electra_mlm(t: Tape, c, h, d: int, e: int, n: int, amask) -> None:
    """``ElectraForMaskedLM``: dense to embedding_size, GELU, LayerNorm, the (tied) generator head."""
    x = ops.activation(t, ops.linear(t, h, d, e, "generator_predictions.dense"), "gelu")
    x = ops.layer_norm(t, x, e, "generator_predictions.LayerNorm")
    tie = "electra.embeddings.word_embeddings.weight" if getattr(c, "tie_word_embeddings", True) else None
    loss, logits = lm_loss(t, x, e, c.vocab_size, n, t.input(n), name="generator_lm_head", tie=tie, bias=True,
                           upcast=False)
    t.finish(loss, keep=[logits, amask])


def _classify(t: Tape, c, h, d: int, batch: int, roberta: bool, prefix: str, amask, act: str = "tanh") -> None:
    first = ops.select(t, h, batch * d)  # hidden_states[:, 0]
    p = c.classifier_dropout if getattr(c, "classifier_dropout", None) is not None else c.hidden_dropout_prob
    if roberta:  # RobertaClassificationHead: dropout, dense, tanh, dropout, out_proj
        x = ops.dropout(t, first, p)
        x = ops.activation(t, ops.linear(t, x, d, d, "classifier.dense"), act)  # ELECTRA: GELU
        logits = ops.linear(t, ops.dropout(t, x, p), d, c.num_labels, "classifier.out_proj")
    else:  # the pooler, then dropout and the classifier
        x = ops.activation(t, ops.linear(t, first, d, d, f"{prefix}.pooler.dense"), "tanh")
        logits = ops.linear(t, ops.dropout(t, x, p), d, c.num_labels, "classifier")
    labels = t.input(batch)
    loss = ops.cross_entropy(t, logits, labels)
    t.finish(loss, keep=[logits, amask])


def _distilbert(t: Tape, c, batch: int, seq: int, opts, padding: bool, head: str) -> None:
    """DistilBERT: BERT's post-LN layers without token types or attention-output dropout."""
    d, n = c.dim, batch * seq
    ids, amask = t.input(n), t.input(n)
    emb = "distilbert.embeddings"
    t.new(c.max_position_embeddings, "i64", False, "buffers", held=True)  # position_ids
    x = ops.embedding(t, ids, n, c.vocab_size, d, f"{emb}.word_embeddings")
    pos = ops.embedding(t, t.new(seq, "i64", False), seq, c.max_position_embeddings, d, f"{emb}.position_embeddings")
    h = ops.dropout(t, ops.layer_norm(t, ops.binary(t, x, pos), d, f"{emb}.LayerNorm"), c.dropout)
    m = mask(t, batch, seq, seq, opts.attention) if padding else None
    a = Attn(d, c.n_heads, d // c.n_heads, dropout=c.attention_dropout, names=("q_lin", "k_lin", "v_lin", "out_lin"))
    for i in range(c.n_layers):
        name = f"distilbert.transformer.layer.{i}"
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m])[0]
        x = attention(t, h, None, a, f"{name}.attention", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=False)
        a_out = ops.layer_norm(t, ops.binary(t, x, h), d, f"{name}.sa_layer_norm")
        t.use(x)
        x = ops.activation(t, ops.linear(t, a_out, d, c.hidden_dim, f"{name}.ffn.lin1"), c.activation)
        x = ops.dropout(t, ops.linear(t, x, c.hidden_dim, d, f"{name}.ffn.lin2"), c.dropout)
        out = ops.layer_norm(t, ops.binary(t, x, a_out), d, f"{name}.output_layer_norm")
        t.use(x)
        t.use(h)  # the layer's argument lives until it returns
        h = out
        t.end_layer(h)
    if head == "masked_lm":
        x = ops.activation(t, ops.linear(t, h, d, d, "vocab_transform"), c.activation)
        x = ops.layer_norm(t, x, d, "vocab_layer_norm")
        labels = t.input(n)
        tie = f"{emb}.word_embeddings.weight" if getattr(c, "tie_word_embeddings", True) else None
        loss, logits = lm_loss(t, x, d, c.vocab_size, n, labels, name="vocab_projector", tie=tie, bias=True,
                               upcast=False)
    else:  # pre_classifier, ReLU, dropout, classifier on the first token
        x = ops.activation(t, ops.linear(t, ops.select(t, h, batch * d), d, d, "pre_classifier"), "relu")
        logits = ops.linear(t, ops.dropout(t, x, c.seq_classif_dropout), d, c.num_labels, "classifier")
        loss = ops.cross_entropy(t, logits, t.input(batch))
    t.finish(loss, keep=[logits, amask])
