"""Mixture-of-experts decoders: Mixtral, Qwen2-MoE (with its gated shared expert), Qwen3-MoE (q/k norms).

Llama-like attention and norms; the MLP of a sparse layer is a top-k router (``gate``: logits over the
experts, an fp32 softmax, ``topk``) and the experts, stored as two 3-D parameters (``gate_up_proj``
experts x 2 intermediate x hidden, ``down_proj`` experts x hidden x intermediate). transformers 5
runs them with its default ``grouped_mm`` implementation: the ``tokens x top_k`` (token, expert)
pairs are sorted by expert, gathered, multiplied by each expert's weights in one grouped matmul
(``torch.nn.functional.grouped_mm``, outside autocast: fp32 with fp32 weights, also under bf16),
weighted, put back in token order and summed over the ``top_k`` picks.

Routing. Every buffer of that path has ``tokens x top_k`` rows whatever the router picks (an expert
gets between none and all of the tokens, the rows always total ``tokens x top_k``), so the price is
the same for every routing: the worst routing (every token's picks on the same experts) included.
:func:`notes` says so in the estimate.
"""

from __future__ import annotations

from lengthscan.memory import ops
from lengthscan.memory.blocks import Attn, attention, causal_masks, gated_mlp, lm_loss
from lengthscan.memory.ops import op_kind
from lengthscan.memory.tape import Tape, Tensor

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


def num_experts(c) -> int:
    return getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None) or 0


def notes(c) -> list[str]:
    """What an estimate of an MoE config should say about routing."""
    if getattr(c, "model_type", None) not in MOE_TYPES:
        return []
    k, e = c.num_experts_per_tok, num_experts(c)
    return [f"experts priced for the worst routing: transformers' grouped_mm experts allocate tokens x top_k "
            f"({k}) rows of {e} experts whatever the router picks, so the figure holds for any routing, the "
            f"most unbalanced (all tokens on the same {k} experts) included"]


def _sparse(c, i: int) -> bool:
    """Layer ``i`` has experts (Qwen2/3-MoE: not in ``mlp_only_layers``, every ``decoder_sparse_step``)."""
    if c.model_type == "mixtral":
        return True
    step = getattr(c, "decoder_sparse_step", 1) or 1
    return num_experts(c) > 0 and i not in (getattr(c, "mlp_only_layers", None) or ()) and (i + 1) % step == 0


def _masks(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> list:
    """The mask of each layer, as each model's forward builds them."""
    n = c.num_hidden_layers
    if c.model_type == "qwen2_moe":  # builds both types; an unused window is 0: its mask is materialised anyway
        window = c.sliding_window if getattr(c, "use_sliding_window", False) else 0
        masks = causal_masks(t, batch, seq, opts.attention, padding,
                             {"full_attention": None, "sliding_attention": window})
        kinds = list(getattr(c, "layer_types", None) or ["full_attention"] * n)
        return [masks[kinds[i]] for i in range(n)]
    window = getattr(c, "sliding_window", None)  # Mixtral and Qwen3-MoE: one mask, windowed when the config says
    if not getattr(c, "use_sliding_window", True):
        window = None
    m = causal_masks(t, batch, seq, opts.attention, padding, {"one": window})["one"]
    return [m] * n


def trace(t: Tape, c, batch: int, seq: int, opts, padding: bool) -> None:
    """``MixtralForCausalLM`` / ``Qwen2MoeForCausalLM`` / ``Qwen3MoeForCausalLM`` with labels = inputs."""
    mt, d = c.model_type, c.hidden_size
    heads = c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or d // heads
    experts, top_k = num_experts(c), c.num_experts_per_tok
    implementation = getattr(c, "_experts_implementation", None)
    if implementation not in (None, "grouped_mm"):
        raise ValueError(f"experts_implementation {implementation!r} is not modelled: only transformers' default, "
                         "grouped_mm (the per-expert 'eager' loop and 'batched_mm' allocate differently)")
    if any(_sparse(c, i) for i in range(c.num_hidden_layers)) and not 1 <= top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} must be between 1 and the number of experts ({experts})")
    _check_expert_adapters(t, c)
    tokens = batch * seq
    ids, amask = t.input(tokens), t.input(tokens)
    h = ops.embedding(t, ids, tokens, c.vocab_size, d, "model.embed_tokens")
    t.new(head_dim // 2, "f32", False, "buffers", held=True)  # rotary inv_freq
    t.new(head_dim // 2, "f32", False, "buffers", held=True)  # and its original copy
    masks = _masks(t, c, batch, seq, opts, padding)
    cos, sin = t.new(seq * head_dim, h.dtype, False), t.new(seq * head_dim, h.dtype, False)  # .to(hidden dtype)
    if mt == "qwen2_moe":
        bias, out_bias = getattr(c, "qkv_bias", True), False
    else:
        bias = out_bias = bool(getattr(c, "attention_bias", False))
    a = Attn(d, heads, head_dim, kv_heads, bias, out_bias, getattr(c, "attention_dropout", 0.0),
             names=("q_proj", "k_proj", "v_proj", "o_proj"))
    aux = bool(getattr(c, "output_router_logits", False))
    router_logits = []
    for i in range(c.num_hidden_layers):
        name = f"model.layers.{i}"
        m = masks[i]
        h = t.begin_layer(i, opts.gradient_checkpointing, [h, m, cos, sin])[0]
        x = ops.rms_norm(t, h, d, f"{name}.input_layernorm")
        x = attention(t, x, None, a, f"{name}.self_attn", batch, seq, seq, attention=opts.attention, mask4d=m,
                      causal=True, rotary=(cos, sin), eager_softmax_fp32=True,
                      qk_norm=(head_dim, c.rms_norm_eps) if mt == "qwen3_moe" else None)
        h = ops.binary(t, h, x)
        x = ops.rms_norm(t, h, d, f"{name}.post_attention_layernorm")
        if _sparse(c, i):
            x, logits = moe_block(t, c, x, tokens, f"{name}.mlp")
            router_logits.append(logits)
        else:
            x = gated_mlp(t, x, d, c.intermediate_size, f"{name}.mlp", c.hidden_act)
        h = ops.binary(t, h, x)
        t.end_layer(h)
    h = ops.rms_norm(t, h, d, "model.norm")
    labels = t.input(tokens)
    shifted = t.new(batch * (seq + 1), "i64", False)  # pad(labels, (0, 1)), then [..., 1:].contiguous()
    tie = "model.embed_tokens.weight" if getattr(c, "tie_word_embeddings", False) else None
    loss, logits = lm_loss(t, h, d, c.vocab_size, tokens, shifted, tie=tie)
    if aux and router_logits:
        loss = _aux_loss(t, loss, router_logits, tokens, experts, top_k)
    t.use(labels)
    t.finish(loss, keep=[logits, amask, *router_logits])


@op_kind("activations_mlp")
def moe_block(t: Tape, c, x: Tensor, tokens: int, name: str) -> tuple:
    """The sparse MLP of one layer on ``x`` (tokens x hidden); returns its output and the router logits."""
    d = c.hidden_size
    qwen2 = c.model_type == "qwen2_moe"
    if c.model_type == "mixtral" and getattr(c, "router_jitter_noise", 0):  # x *= uniform noise, in place
        noise = t.new(x.numel, x.dtype, False)
        jittered = Tensor(x.numel, x.dtype, x.requires_grad, x.storage)
        t.node([x, noise], [jittered], [noise])
        x = jittered
    shared = None
    if qwen2:  # computed first, from the same input
        shared = gated_mlp(t, x, d, c.shared_expert_intermediate_size, f"{name}.shared_expert", c.hidden_act)
    logits, weights, index = _router(t, c, x, tokens, f"{name}.gate")
    out = _experts(t, c, x, weights, index, tokens, f"{name}.experts")
    if qwen2:  # sigmoid(shared_expert_gate(x)) * shared, added to the experts' output
        gate = ops.activation(t, ops.linear(t, x, d, 1, f"{name}.shared_expert_gate", False), "sigmoid")
        out = ops.binary(t, out, _scaled(t, shared, gate))
    for local in (logits, weights, index):  # ``_, weights, index = self.gate(x)``: alive until the block returns
        t.use(local)
    return out, logits


def _scaled(t: Tape, x: Tensor, w: Tensor) -> Tensor:
    """``x * w`` with ``w`` broadcast along the hidden size: its gradient is computed at ``x``'s size, then summed."""
    out = ops.binary(t, x, w, saves=True)
    t.nodes[-1].workspace = out.nbytes if w.requires_grad else 0
    return out


def _router(t: Tape, c, x: Tensor, tokens: int, name: str) -> tuple:
    """Logits over the experts, an fp32 softmax (kept), ``topk`` (its values renormalised in place)."""
    experts, k = num_experts(c), c.num_experts_per_tok
    logits = ops.linear(t, x, c.hidden_size, experts, name, bias=False)
    probs = ops.softmax(t, t.cast(logits, "f32"))  # Mixtral: softmax(logits.float()); Qwen: dtype=float
    values = t.new(tokens * k, "f32", probs.requires_grad)
    index = t.new(tokens * k, "i64", False)
    t.node([probs], [values], [index])  # topk keeps its indices
    if c.model_type == "mixtral" or getattr(c, "norm_topk_prob", False):  # values /= values.sum(-1, keepdim)
        total = t.new(tokens, "f32", values.requires_grad)
        t.node([values], [total], [])
        original = t.new(values.numel, "f32", False)  # in place: autograd keeps the original values
        normed = Tensor(values.numel, "f32", values.requires_grad, values.storage)
        t.node([values, total], [normed], [original, total])
        values = normed
    if c.model_type != "mixtral":  # router_top_value.to(router_logits.dtype)
        values = t.cast(values, logits.dtype)
    return logits, values, index


def _check_expert_adapters(t: Tape, c) -> None:
    """peft (0.21) puts ``ParamWrapper`` adapters on a MoE layer's 3-D expert parameters and its router when the
    targets reach them (``all-linear`` does): not modelled, refused rather than priced without them."""
    lora = t.plan.lora if t.plan is not None else None
    if lora is None:
        return
    for i in range(c.num_hidden_layers):
        if not _sparse(c, i):
            continue
        mlp = f"model.layers.{i}.mlp"
        reached = [m for m in (f"{mlp}.experts", f"{mlp}.gate", f"{mlp}.experts.gate_up_proj",
                               f"{mlp}.experts.down_proj") if lora.targets_module(m)]
        if reached:
            raise ValueError(f"the adapter's target_modules reach the MoE experts or router ({reached[0]}): peft wraps "
                             "their 3-D parameters (ParamWrapper), which is not modelled; target the attention and "
                             "dense layers instead (e.g. --lora-targets q_proj,k_proj,v_proj,o_proj)")


def _grouped_mm(t: Tape, x: Tensor, rows: int, n_in: int, n_out: int, experts: int, name: str) -> Tensor:
    """``grouped_mm(x.to(w.dtype), w.transpose(-2, -1), offs)``: no autocast, the weights' dtype."""
    w = t.param(name, experts * n_in * n_out)
    x = t.cast(x, w.dtype)
    out = t.new(rows * n_out, w.dtype, x.requires_grad or w.requires_grad)
    t.node([x, w], [out], [x, w])
    return out


def _experts(t: Tape, c, x: Tensor, weights: Tensor, index: Tensor, tokens: int, name: str) -> Tensor:
    """transformers' ``grouped_mm_experts_forward``: every buffer is ``tokens x top_k`` rows, any routing."""
    d, experts, k = c.hidden_size, num_experts(c), c.num_experts_per_tok
    inter = c.moe_intermediate_size if c.model_type != "mixtral" else c.intermediate_size
    rows = tokens * k
    t.use(index)
    sorted_ids, perm = t.new(rows, "i64", False), t.new(rows, "i64", False)  # torch.sort(expert_ids)
    token_of = t.new(rows, "i64", False)  # perm // top_k
    picked = t.new(rows * d, x.dtype, x.requires_grad)  # hidden_states[perm // top_k]
    t.node([x], [picked], [token_of])
    sample = t.new(rows, weights.dtype, weights.requires_grad)  # sample_weights[perm]
    t.node([weights], [sample], [perm])
    scratch = [t.new(rows, "f32", False),  # histc's float copy of the sorted ids (CUDA: an int32 one)
               t.new(experts, "f32", False), t.new(experts, "f32", False)]  # tokens_per_expert, offsets
    up = _grouped_mm(t, picked, rows, d, 2 * inter, experts, f"{name}.gate_up_proj")
    gate, lin = ops.split(t, up, (inter, inter))  # chunk(2): views
    act = ops.binary(t, ops.activation(t, gate, c.hidden_act), lin, saves=True)
    down = _grouped_mm(t, act, rows, inter, d, experts, f"{name}.down_proj")
    weighted = _scaled(t, down, ops.view(t, sample))  # * sample_weights_g.unsqueeze(-1)
    inverse = t.new(rows, "i64", False)  # inv_perm[perm] = arange(...)
    t.new(rows, "i64", False)  # the arange, freed at once
    t.use(perm)
    # weighted_out[inv_perm]; its backward's index_put_ copies
    ordered = t.new(rows * d, weighted.dtype, weighted.requires_grad)
    t.node([weighted], [ordered], [inverse], workspace=ordered.nbytes)  # the (expanded) gradient contiguous
    out = t.new(tokens * d, ordered.dtype, ordered.requires_grad)  # .view(tokens, top_k, hidden).sum(dim=1)
    t.node([ordered], [out], [])
    out = t.cast(out, x.dtype)
    for local in (picked, sample, sorted_ids, perm, inverse, *scratch):  # locals, alive until the function returns
        t.use(local)
    return out


def _aux_loss(t: Tape, loss: Tensor, router_logits: list, tokens: int, experts: int, top_k: int) -> Tensor:
    """``load_balancing_loss_func`` over every layer's router logits, added to the loss (masked rows)."""
    with t.scope("logits_loss"):
        flat = t.new(tokens, "f32", False)  # attention_mask.reshape(-1).to(float32)
        total = None
        for logits in router_logits:
            probs = ops.softmax(t, logits)  # kept for backward
            t.new(tokens * top_k, "i64", False)  # topk indices
            t.new(tokens * top_k, "f32", False)  # flat_mask.repeat_interleave(top_k)
            weighted = ops.binary(t, probs, flat, saves=True)  # routing_weights.float() * flat_mask
            part = t.new(experts, "f32", weighted.requires_grad)  # .sum(dim=0)
            t.node([weighted], [part], [])
            total = part if total is None else ops.binary(t, total, part)
        aux = t.new(1, "f32", total.requires_grad)
        t.node([total], [aux], [total])
        return ops.binary(t, loss, ops.scale(t, aux))
