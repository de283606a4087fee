"""FSDP on N ranks: the shards each rank keeps, and the units it gathers and scatters during the step.

Units, as the Trainer (accelerate 1.16) wraps the model:

- **FSDP2** (``fully_shard``, ``fsdp2_prepare_model`` in ``accelerate/utils/fsdp_utils.py``): one unit per
  layer of ``_no_split_modules``; the input embedding in a unit of its own; the final norm and the output
  embedding together in a *tail* unit that is never resharded after forward (with tied embeddings the
  embedding joins the tail); the root unit keeps what is left (position embeddings, a classifier) and,
  as the root, is not resharded after forward. Trainable parameters are upcast to fp32 under mixed
  precision (the master copy); frozen ones keep the dtype they were loaded in.
- **FSDP1** (``FullyShardedDataParallel`` with ``transformer_auto_wrap_policy``): one flat parameter per
  layer, and the root's flat parameter for everything else, never resharded after forward.

A rank keeps ``1/N`` of every unit (padded to a multiple of ``N``), of its optimizer state and, after
backward, of its gradients. During the step (torch 2.13: ``_fully_shard/_fsdp_param_group.py``,
``_fsdp_collectives.py``; ``fsdp/_runtime_utils.py`` for FSDP1):

- **gather**: before a unit's forward its parameters are all-gathered in the compute dtype (the mixed
  precision policy's ``param_dtype``). FSDP2 gathers into a flat buffer and copies out into the
  parameters; in forward it keeps that buffer until the next unit's copy-out, in backward it frees it at
  once. FSDP1 gathers into the flat parameter, from a low-precision copy of its shard when it casts.
- **reshard after forward** (``fsdp``: FULL_SHARD / ``reshard_after_forward=True``): a layer frees its
  gathered parameters after its forward and gathers them again in backward; ``fsdp_shard_grad_op`` keeps
  every unit gathered until its backward.
- **backward**: FSDP2 prefetches the next unit's gather in each pre-backward (its buffer lives until that
  unit's copy-out); FSDP1 under the Trainer's ``backward_prefetch=NO_PREFETCH`` does not prefetch.
- **post-backward**: a unit's full gradients are reduce-scattered into a shard. FSDP2 copies them into a
  flat reduce-scatter input, kept until the next unit's reduce (one buffer in flight), and frees them;
  FSDP1 concatenates its views' gradients into one flat gradient, which it reduces and frees. The unit is
  resharded.

Under gradient accumulation accelerate's ``no_sync`` (``set_requires_gradient_sync(False)``) leaves FSDP2's
gradients unreduced between micro-batches: every unit's full gradients live through the cycle's last
micro-batch (the state's ``gradients``), and each unit reduces them after its backward there. FSDP1 under
accumulation, and FSDP1 over a quantized base, are refused (``options.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from lengthscan.memory import optimizers
from lengthscan.memory.families import ENCODER_DECODER
from lengthscan.memory.tape import BYTES
from lengthscan.memory.weights import TORCH_DTYPES

ROOT, EMBED, TAIL = "root", "embed", "tail"
INPUT_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight", "shared.weight")
OUTPUT_EMBEDDINGS = ("lm_head.weight", "lm_head.bias", "embed_out.weight", "predictions.decoder.weight",
                     "predictions.decoder.bias", "generator_lm_head.weight", "vocab_projector.weight",
                     "proj_out.weight")


def _padded(numel: int, world: int) -> int:
    return -(-numel // world) * world


@dataclass
class Unit:
    """One FSDP unit: its parameters' elements, the bytes its shards keep, and the trained elements."""

    numel: int = 0  # elements gathered in the compute dtype
    packed: int = 0  # bytes of 4-bit weights' packed data, gathered as they are (bnb_4bit_quant_storage)
    stored: int = 0  # bytes of the whole unit in the dtypes its shards keep (padding aside)
    trained: int = 0
    any_trained: bool = False
    reshard: bool = False  # freed after its forward
    grad_sizes: list = field(default_factory=list)  # the bytes of each gradient autograd makes, in the replay
    trained_shapes: list = field(default_factory=list)  # (elements, (rows, columns) or None) of each trained one


#: families whose ``_no_split_modules`` (transformers 5.25) name their embeddings: a unit of their own
EMBEDDING_UNITS = ("bert", "camembert", "roberta", "xlm-roberta")
#: families with no ``_no_split_modules``: no layer is wrapped, the layers stay in the root
UNWRAPPED = ("blenderbot", "blenderbot-small", "data2vec-audio", "distilbert", "electra", "marian", "pegasus",
             "wav2vec2", "wavlm")


def _unit_of(name: str, p, tied: bool, version: int, model_type: str):
    """Which unit a parameter belongs to (``name``: the first name the trace gave it)."""
    if p.layer is not None:  # (a negative layer: an audio feature encoder's convolution, left in the root)
        return ROOT if model_type in UNWRAPPED or p.layer < 0 else p.layer
    if model_type in EMBEDDING_UNITS and ".embeddings." in name:
        return EMBED
    if version == 1:
        return ROOT
    if name.endswith(INPUT_EMBEDDINGS):
        return TAIL if tied else EMBED
    parts = name.split(".")
    final_norm = len(parts) == 3 and ("norm" in parts[1].lower() or parts[1].startswith("ln_"))
    return TAIL if name.endswith(OUTPUT_EMBEDDINGS) or final_norm else ROOT


class Sharding:
    """What FSDP adds and takes away on one rank, for a traced step (see the module's docstring)."""

    def __init__(self, tr, parallel, options):
        self.world = parallel.devices
        self.version = parallel.fsdp_version or 2
        if parallel.fsdp and self.version == 2 and tr.model_type in ENCODER_DECODER:
            raise ValueError(f"FSDP2 over {tr.model_type}: accelerate's layout puts its shared embedding in two FSDP "
                             "groups, which torch refuses; price FSDP1 (--fsdp-version 1)")
        reshard = parallel.strategy != "fsdp_shard_grad_op"
        loaded = BYTES[TORCH_DTYPES[options.torch_dtype]]
        low = {"bf16": 2, "fp16": 2}.get(options.precision)
        self.master = 4 if low and self.version == 2 else loaded  # accelerate upcasts what trains to fp32
        self.compute = low or loaded  # the mixed precision policy's param_dtype and reduce_dtype
        names: dict = {}
        for name, p in tr.tape.params.items():
            names.setdefault(id(p), (name, p, []))[2].append(name)
        units: dict = {}
        self.owner: dict = {}  # id(param) -> its unit
        self.tied = False
        q = options.quantization
        prepared = 4 if q is not None and options.prepare_kbit else loaded  # prepare_model_for_kbit_training
        self.replicated = 0  # bytes every rank keeps whole: uint8-stored 4-bit weights (accelerate ignores them)
        self.quant_state = 0  # 4-bit weights' quantization state (absmax ...), on every rank
        for name, p, aliases in names.values():
            tied = any(a.endswith(OUTPUT_EMBEDDINGS) for a in aliases[1:])
            key = _unit_of(name, p, tied, self.version, tr.model_type)
            self.tied = self.tied or (tied and key == TAIL)
            self.owner[id(p)] = key
            u = units.setdefault(key, Unit(reshard=reshard and key not in (ROOT, TAIL)))
            if p.quantized:
                packed = q.packed_bytes(p.numel)
                if q.quant_storage == "u8":
                    self.replicated += p.nbytes
                else:
                    u.packed += packed
                    u.stored += packed
                    self.quant_state += p.nbytes - packed
                continue
            u.numel += p.numel
            trains = p.trainable and p.used
            u.stored += p.numel * (self.master if trains else prepared)
            if trains:
                u.trained += p.numel
                u.any_trained = True
                u.grad_sizes.append(p.numel * self.compute)
                u.trained_shapes.append((p.numel, p.shape))
        self.units = units
        self.layers = sorted(k for k in units if isinstance(k, int))
        self._reset()

    def _reset(self) -> None:
        """The replay's state: what is gathered, prefetched, done, and the buffers in flight."""
        self.gathered, self.prefetched, self.done, self.prebackward, self.done_forward = set(), set(), set(), \
            set(), set()
        self.kept_ag = 0  # FSDP2: the last forward gather's output, kept until the next gather is copied out
        self.pending_rs = 0  # FSDP2: the last reduce-scatter input, kept until the next unit's reduce

    # -- sizes ---------------------------------------------------------------------------------

    def full(self, unit) -> int:
        """Bytes of the unit's gathered parameters."""
        u = self.units[unit]
        return _padded(u.numel, self.world) * self.compute + _padded(u.packed, self.world)

    def _reduced(self, unit) -> int:
        """Elements reduce-scattered: FSDP1's whole flat parameter once any of it trains, FSDP2's trained ones."""
        u = self.units[unit]
        return (u.numel if u.any_trained else 0) if self.version == 1 else u.trained

    def shard_grads(self, unit) -> int:
        return _padded(self._reduced(unit), self.world) // self.world * self.master

    def state(self, optimizer: str) -> dict:
        """The per-rank state terms: sharded weights and the optimizer state of the shards."""
        shards = sum(-(-u.stored // self.world) for u in self.units.values())
        out = {"sharded_weights": shards, "optimizer_state": optimizers.state_bytes(optimizer, self._trained_shards())}
        if self.replicated or self.quant_state:
            out["weights"] = self.replicated + self.quant_state
        return out

    def optimizer_temporaries(self, optimizer: str) -> int:
        return optimizers.temporaries(optimizer, self._trained_shards())

    def _trained_shards(self) -> list:
        """The optimizer's parameters, a shard of each: FSDP2's per-parameter shards keep their rows (cut
        in N) and columns; FSDP1's ``use_orig_params=True`` hands the optimizer flat views of its shard."""
        dtype = {4: "f32", 2: "bf16"}[self.master]
        out = []
        for unit in self.units.values():
            if self.version == 2:
                for numel, shape in unit.trained_shapes:
                    rows = -(-shape[0] // self.world) if shape else None
                    out.append(SimpleNamespace(numel=rows * shape[1] if shape else -(-numel // self.world),
                                               dtype=dtype, shape=(rows, shape[1]) if shape else None))
            elif unit.trained:
                out.append(SimpleNamespace(numel=-(-unit.trained // self.world), dtype=dtype, shape=None))
        return out

    # -- the replay's hooks (``timeline.replay(units=...)``) -------------------------------------

    def _gather(self, live, unit, keep_output: bool = False) -> None:
        """All-gather ``unit``; FSDP2 keeps its gather output when ``keep_output`` (until the next gather's
        copy-out in forward), else frees it once copied out."""
        if unit in self.gathered or unit not in self.units:
            return
        self.gathered.add(unit)
        full = self.full(unit)
        if self.version == 2:
            if unit in self.prefetched:  # gathered by the prefetch: only the copy-out is left
                self.prefetched.discard(unit)
                live.add("fsdp_gathered", full)
                live.add("fsdp_gather_buffer", -full)
                return
            self._all_gather(live, full)
            live.add("fsdp_gathered", full)
            if keep_output:
                live.add("fsdp_gather_buffer", -self.kept_ag)
                self.kept_ag = full
            else:
                live.add("fsdp_gather_buffer", -full)
        else:
            cast = full // self.world if self.compute != self.master else 0  # the low-precision shard it reads
            live.add("fsdp_gather_buffer", cast)
            live.add("fsdp_gathered", full)
            live.add("fsdp_gather_buffer", -cast)

    def _prefetch(self, live, unit) -> None:
        """FSDP2's backward prefetch: the next unit's gather output, copied out at its pre-backward."""
        if self.version != 2 or unit not in self.units or unit in self.gathered or unit in self.prefetched \
                or unit in self.done:
            return
        self.prefetched.add(unit)
        self._all_gather(live, self.full(unit))

    def _all_gather(self, live, full: int) -> None:
        """FSDP2's gather output; under mixed precision the shard is first cast to the compute dtype (freed
        once copied in)."""
        cast = full // self.world if self.compute != self.master else 0
        live.add("fsdp_gather_buffer", cast)
        live.add("fsdp_gather_buffer", full)
        live.add("fsdp_gather_buffer", -cast)

    def _free(self, live, unit) -> None:
        if unit in self.gathered:
            self.gathered.discard(unit)
            live.add("fsdp_gathered", -self.full(unit))

    def begin(self, live) -> None:
        """The root's pre-forward (it gathers itself), then the embedding's (or the tail's, holding it)."""
        self._reset()
        self._gather(live, ROOT, keep_output=True)
        self._gather(live, EMBED, keep_output=True)
        if self.tied:  # the tail holds the input embedding: gathered as the forward starts
            self._gather(live, TAIL, keep_output=True)

    def forward_enter(self, live, layer) -> None:
        if EMBED not in self.done_forward:  # the first layer begins: the embedding's post-forward ran
            self.done_forward.add(EMBED)
            if self.units.get(EMBED, Unit()).reshard:
                self._free(live, EMBED)
        self._gather(live, layer, keep_output=True)

    def forward_leave(self, live, layer) -> None:
        if layer in self.units and self.units[layer].reshard:
            self._free(live, layer)
        if self.layers and layer == self.layers[-1]:
            self._gather(live, TAIL, keep_output=True)  # the final norm's pre-forward

    def forward_end(self, live) -> None:
        """The root's post-forward: the last gather output dropped (nothing resharded: the root and the
        tail are not, the layers already were)."""
        for unit in (ROOT, TAIL, EMBED):
            if unit in self.units and self.units[unit].reshard:
                self._free(live, unit)
        live.add("fsdp_gather_buffer", -self.kept_ag)
        self.kept_ag = 0

    def backward_begin(self, live) -> None:
        """The root's pre-backward, as backward starts: without a tail, FSDP2 prefetches the last layer."""
        self._gather(live, ROOT)
        if TAIL not in self.units and self.layers:
            self._prefetch(live, self.layers[-1])

    def backward_node(self, live, node) -> None:
        """A node outside the layers: the first that uses a tail parameter (the head's matmul) runs the
        tail's pre-backward, which prefetches the last layer; one using the embedding runs its pre-backward
        (the copy-out of its prefetched gather)."""
        owners = {self.owner.get(id(x.param)) for x in node.inputs if x.param is not None}
        if EMBED in owners and EMBED not in self.done:
            self._gather(live, EMBED)
        if TAIL in self.prebackward or TAIL not in self.units or TAIL not in owners:
            return
        self.prebackward.add(TAIL)
        self._gather(live, TAIL)
        if self.layers:
            self._prefetch(live, self.layers[-1])

    def backward_enter(self, live, layer) -> None:
        """``layer``'s pre-backward (after the tail's post-backward, for the last layer); FSDP2 prefetches
        the unit whose backward comes next."""
        if self.layers and layer == self.layers[-1] and not self.tied:
            self.backward_leave(live, TAIL)
        self._gather(live, layer)
        if layer in self.layers:
            i = self.layers.index(layer)
            self._prefetch(live, self.layers[i - 1] if i else EMBED)

    def backward_leave(self, live, layer) -> None:
        """A unit's post-backward: reduce-scatter its gradients into a shard, reshard it."""
        if layer in self.done or layer not in self.units:
            return
        self.done.add(layer)
        reduced, shard = _padded(self._reduced(layer), self.world) * self.compute, self.shard_grads(layer)
        if self.version == 2:
            self._free(live, layer)  # resharded before the reduce
            live.add("fsdp_reduce_buffer", -self.pending_rs)
            self.pending_rs = reduced
            live.add("fsdp_reduce_buffer", reduced)
            live.add("gradients", shard)
            if self.compute != self.master and shard:  # the reduced shard, cast to the parameter's dtype
                live.spike("fsdp_reduce_buffer", shard // self.master * self.compute)
            self._drop_gradients(live, layer)
        else:
            if reduced:
                live.add("fsdp_reduce_buffer", reduced)  # the flat gradient: the views' gradients concatenated
                self._drop_gradients(live, layer)
                live.add("gradients", shard)
                live.add("fsdp_reduce_buffer", -reduced)
            self._free(live, layer)

    def _drop_gradients(self, live, unit) -> None:
        """The unit's full gradients freed, one by one as autograd made them (the allocator model frees blocks)."""
        for n in self.units[unit].grad_sizes:
            live.add("gradients", -n)

    def state_blocks(self, optimizer: str) -> tuple[list, list]:
        """The persistent allocations, for the allocator model: each unit's shard (FSDP1's flat parameter;
        FSDP2's per-parameter shards taken together), and each unit's optimizer state, moment by moment."""
        state = [-(-u.stored // self.world) for u in self.units.values() if u.stored]
        state += [n for n in (self.replicated, self.quant_state) if n]
        moments = 2 if optimizer.startswith(("adamw", "paged_adamw")) else 1
        opt = []
        for shard in self._trained_shards():
            total = optimizers.state_bytes(optimizer, [shard])
            opt += [total // moments] * moments if total else []
        return state, opt

    def end(self, live) -> None:
        """The final callback: the tail (if no layer ran), the embedding and the root reduce; the last
        reduce buffer is freed."""
        for unit in (TAIL, EMBED, ROOT):
            self.backward_leave(live, unit)
        for unit in list(self.prefetched):  # a gather no backward used (a frozen embedding's)
            self.prefetched.discard(unit)
            live.add("fsdp_gather_buffer", -self.full(unit))
        live.add("fsdp_reduce_buffer", -self.pending_rs)
        self.pending_rs = 0
