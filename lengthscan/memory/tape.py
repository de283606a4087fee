"""A symbolic autograd tape: tensors as sizes and dtypes, ops that record what backward keeps.

A family's forward pass is written once against :class:`Tape` (``linear``, ``layer_norm``,
``sdpa`` ...), mirroring its transformers modeling code. Each op allocates its output, and
records an autograd node with the tensors PyTorch saves for backward (its derivatives.yaml
formulas), so :mod:`lengthscan.memory.timeline` can replay the step's allocations. Mixed precision
follows CUDA autocast's policy: matmul-like ops compute in the low dtype (inputs cast, weight
casts cached until the forward ends), layer/group norm, softmax and the losses in fp32, every
other op in the promoted dtype of its inputs.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "bool": 1, "u8": 1}


class Storage:
    """One allocation."""

    __slots__ = ("created", "held", "kind", "last_use", "layer", "nbytes", "saved_by")

    def __init__(self, nbytes: int, kind: str, held: bool, layer: int | None, created: int):
        self.nbytes, self.kind, self.held, self.layer, self.created = nbytes, kind, held, layer, created
        self.saved_by: list[int] = []
        self.last_use = created


class Tensor:
    """A symbolic tensor: element count, dtype, whether it needs a gradient, its storage."""

    __slots__ = ("dtype", "numel", "param", "requires_grad", "storage")

    def __init__(self, numel: int, dtype: str, requires_grad: bool, storage: Storage | None, param=None):
        self.numel, self.dtype, self.requires_grad = numel, dtype, requires_grad
        self.storage, self.param = storage, param

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES[self.dtype]


@dataclass
class Param:
    """A model parameter (several names may share one, as tied embeddings do)."""

    numel: int
    trainable: bool = True
    tensor: Tensor | None = None
    cast: dict = field(default_factory=dict)  # autocast's per-forward cache: dtype -> Tensor
    used: bool = False
    dtype: str = "f32"
    nbytes: int = 0  # bytes stored (a quantized weight: its packed data and quantization state)
    quantized: bool = False
    shape: tuple | None = None  # (rows, columns) of a matrix; None for a vector (Adafactor factors matrices)
    layer: int | None = None  # the layer whose forward first used it (None: outside the layers)


@dataclass
class Node:
    """An autograd node: the tensors whose gradients it produces, what it keeps, its scratch."""

    inputs: list
    outputs: list
    saved: list
    layer: int | None
    alias: bool = False  # a view: the input's gradient is a view of the output's
    workspace: int = 0  # bytes allocated and freed inside its backward
    transposed: bool = False  # a matmul with the weight transposed: its weight gradient is a transposed view
    forward_workspace: int = 0
    outside: bool = False  # keeps its tensors on ctx, past checkpointing's saved-tensor hooks (bitsandbytes' int8)


class Tape:
    """The forward pass of one training step, op by op."""

    def __init__(self, precision: str = "fp32", weights: str = "f32", plan=None, grad: bool = True):
        self.low = {"bf16": "bf16", "fp16": "f16"}.get(precision)
        self.grad = grad  # False: a forward under torch.no_grad (evaluation): nothing needs a gradient, no node
        self.outputs: list[Tensor] = []
        self.weights = weights
        self.plan = plan  # lengthscan.memory.weights.WeightPlan: dtypes, quantized layers, what trains
        self.linear_hook = None  # lengthscan.memory.adapted.linear when a plan quantizes or adapts layers
        self.linears: list[str] = []  # the linear layers built through the hook, and those given an adapter
        self.adapted: list[str] = []
        self.input_grads = False  # enable_input_require_grads: the input embeddings' output needs a gradient
        self.params: dict[str, Param] = {}
        self.nodes: list[Node] = []
        self.storages: list[Storage] = []
        self.events: list[tuple] = []  # ("alloc", storage) | ("node", index) | ("ws", bytes), in time order
        self.layer: int | None = None
        self.checkpointed: set[int] = set()
        self.layer_inputs: dict[int, list[Tensor]] = {}
        self.layer_ws: dict[int, list[int]] = {}
        self._inputs: list[Tensor] = []
        self.kind = "activations_other"
        self.loss: Tensor | None = None
        self.trl_head: tuple | None = None  # (kind, rows): a TRL trainer's head instead of the logits (fused_head.py)
        self.cast_inputs: str | None = None  # FSDP2's mixed precision: a layer's inputs cast to this dtype

    # -- tensors -------------------------------------------------------------------------------

    def new(self, numel: int, dtype: str, requires_grad: bool, kind: str | None = None, held: bool = False) -> Tensor:
        """A tensor in fresh storage, allocated now."""
        storage = Storage(int(numel) * BYTES[dtype], kind or self.kind, held, self.layer, len(self.events))
        self.storages.append(storage)
        self.events.append(("alloc", storage))
        return Tensor(int(numel), dtype, requires_grad and self.grad, storage)

    def input(self, numel: int, dtype: str = "i64") -> Tensor:
        """A tensor of the batch (live before the step)."""
        t = self.new(numel, dtype, False, "batch", held=True)
        return t

    def param(self, name: str, numel: int, trainable: bool = True, tie: str | None = None,
              stored: tuple | None = None, shape: tuple | None = None) -> Tensor:
        """The parameter ``name`` (``tie``: the name of the parameter it shares storage with).

        Its dtype and whether it trains are the plan's (``weights`` and ``trainable`` without one);
        ``stored``: ``(dtype, nbytes)`` of a quantized weight, which never trains."""
        key = tie or name
        p = self.params.get(key)
        if p is None:
            dtype = self.weights
            if stored is not None:
                dtype, nbytes, trainable = stored[0], stored[1], False
            else:
                if self.plan is not None:
                    dtype, trainable = self.plan.dtype(key), self.plan.trainable(key, trainable)
                nbytes = int(numel) * BYTES[dtype]
            p = self.params[key] = Param(int(numel), trainable, dtype=dtype, nbytes=nbytes,
                                         quantized=stored is not None, shape=shape, layer=self.layer)
            storage = Storage(nbytes, "weights", True, None, -1)
            p.tensor = Tensor(int(numel), dtype, trainable and self.grad, storage, p)
            if self.plan is not None and self.plan.duplicated(key):  # peft's frozen original_module
                original = self.params[f"{key}#original"] = Param(int(numel), False, dtype=dtype, nbytes=nbytes,
                                                                   shape=shape)
                original.tensor = Tensor(int(numel), dtype, False, Storage(nbytes, "weights", True, None, -1), original)
        elif tie and name != key:
            self.params.setdefault(name, p)
        return p.tensor

    def declare(self, name: str, numel: int, trainable: bool = True) -> None:
        """A parameter the forward pass never uses (counted, no gradient, no optimizer state)."""
        self.param(name, numel, trainable)

    def use(self, t: Tensor) -> Tensor:
        if t.storage is not None:
            t.storage.last_use = len(self.events)
        if t.param is not None:
            t.param.used = True
        return t

    def node(self, inputs, outputs, saved, alias=False, workspace=0, forward_workspace=0, transposed=False,
             outside=False) -> None:
        """Record one op: ``inputs`` are used (live until it is done); if any needs a gradient, an
        autograd node producing theirs that keeps ``saved`` for backward (None entries skipped) and
        ``workspace`` bytes of scratch in backward; ``forward_workspace`` bytes of scratch now."""
        for x in inputs:  # every input lives until the op is done, scratch included
            if x is not None:
                self.use(x)
        inputs = [x for x in inputs if x is not None and x.requires_grad]
        if forward_workspace:
            self.events.append(("ws", forward_workspace))
            if self.layer is not None:
                self.layer_ws.setdefault(self.layer, []).append(len(self.events) - 1)
        if not inputs:
            self.events.append(("op", None))  # the inputs' last use: freed once the op is done
            return
        saved = [s for s in saved if s is not None]
        node = Node(inputs, outputs, saved, self.layer, alias, workspace, transposed, outside=outside)
        index = len(self.nodes)
        self.nodes.append(node)
        for s in saved:
            self.use(s)
            if s.storage is not None:
                s.storage.saved_by.append(index)
        self.events.append(("node", index))

    # -- dtype rules (CUDA autocast) -------------------------------------------------------------

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        """``x.to(dtype)``: a copy unless already ``dtype``; weights' casts are cached per forward."""
        if x.dtype == dtype or dtype in ("i64", "bool"):
            return self.use(x)
        if x.param is not None:
            cached = x.param.cast.get(dtype)
            if cached is None:
                cached = x.param.cast[dtype] = self.new(x.numel, dtype, x.requires_grad, "weight_copies")
                self.node([x], [cached], [])
            x.param.used = True
            return cached
        out = self.new(x.numel, dtype, x.requires_grad)
        self.node([self.use(x)], [out], [])
        return out

    def compute(self, *xs: Tensor) -> str:
        """The dtype a matmul-like op computes in: autocast's low dtype, else its inputs'."""
        return self.low or self.promote(*xs)

    @staticmethod
    def promote(*xs: Tensor) -> str:
        floats = [x.dtype for x in xs if x is not None and x.dtype in ("f32", "bf16", "f16")]
        if "f32" in floats or not floats:
            return "f32"
        return floats[0]

    def fp32(self, x: Tensor) -> Tensor:
        """Autocast's fp32 policy: a low-precision input is cast up first."""
        return self.cast(x, "f32") if self.low and x.dtype != "f32" else self.use(x)

    # -- layers ----------------------------------------------------------------------------------

    @contextmanager
    def scope(self, kind: str):
        """Activations allocated inside are reported as ``kind`` (attention, mlp, logits_loss ...)."""
        outer, self.kind = self.kind, kind
        try:
            yield
        finally:
            self.kind = outer

    def begin_layer(self, index: int, checkpoint: bool, inputs: list[Tensor], cast: tuple = (0,)) -> list:
        """Ops from here belong to layer ``index``; with ``checkpoint`` only ``inputs`` are kept. Returns the
        inputs the layer computes with: under FSDP2's mixed precision (``cast_inputs``) the floating ones at
        positions ``cast`` are cast to the compute dtype as the unit's forward begins (``cast_forward_inputs``;
        the caller keeps the originals until the layer returns)."""
        self.layer = index
        self._inputs = [x for x in inputs if x is not None]
        if checkpoint:
            self.checkpointed.add(index)
            self.layer_inputs[index] = self._inputs
            for x in self._inputs:
                self.use(x)
        if self.cast_inputs is None or index < 0:  # (negative: an audio feature encoder's convolutions, not units)
            return list(inputs)
        return [self.cast(x, self.cast_inputs) if i in cast and x is not None and x.dtype in ("f32", "bf16", "f16")
                else x for i, x in enumerate(inputs)]

    def end_layer(self, output: Tensor) -> None:
        """The layer returns: its inputs, held by the caller's loop variable, may die from here."""
        for x in self._inputs:
            self.use(x)
        self.layer = None
        self.use(output)

    def finish(self, loss: Tensor, keep: list[Tensor] = (), hold: list[Tensor] = ()) -> None:
        """The loss closes the forward pass; ``keep`` are the outputs alive until it returns, ``hold`` other
        tensors alive until then that no caller keeps (a KV cache the Trainer ignores)."""
        self.loss = loss
        self.outputs = [t for t in keep if t is not None and t.storage is not None and not t.storage.held]
        end = len(self.events)
        for t in (*keep, *hold):
            if t is not None and t.storage is not None:
                t.storage.last_use = max(t.storage.last_use, end)
        for s in self.storages:  # autocast caches weight casts until the forward pass returns
            if s.kind == "weight_copies":
                s.last_use = end
        self.events.append(("end", None))
