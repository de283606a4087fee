"""LoRA adapters as peft builds them: which modules get one, what trains, in which dtype.

A peft ``adapter_config.json`` (the file, or the folder ``LoraConfig.save_pretrained`` writes) is
read into :class:`Lora`, a frozen record the tracer consults for every linear layer it builds
(``lengthscan/memory/adapted.py``). Matching follows peft's ``check_target_module_exists``:
``target_modules`` as a list matches a module whose full name equals an entry or ends with
``.entry``; as a string it is a regular expression the full name must match whole;
``all-linear`` is every linear layer but the output embedding (``lm_head``) and, for sequence
classification, the classifier head. ``exclude_modules``, ``layers_to_transform`` and
``layers_pattern`` narrow it as peft does; a module of ``modules_to_save`` never gets an adapter:
peft wraps it whole (a frozen original and a trained copy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lengthscan.memory.json_config import read_json_object

#: peft's shorthand for every linear layer
ALL_LINEAR = "all-linear"
#: names peft tries for a sequence-classification head (peft.utils.constants.SEQ_CLS_HEAD_NAMES)
SEQ_CLS_HEADS = ("score", "classifier")
#: the bias settings of a LoraConfig
BIASES = ("none", "all", "lora_only")
#: adapter configs bigger than this are not peft's
MAX_ADAPTER_CONFIG_BYTES = 1 << 20


class AdapterError(ValueError):
    """An adapter config lengthscan cannot price (another peft type, unknown targets ...)."""


@dataclass(frozen=True)
class Lora:
    """A LoRA (or DoRA) adapter: rank, targets, dropout, what else trains.

    ``targets``: a tuple of names (matched whole or as a dotted suffix), ``("all-linear",)``, or
    a one-element tuple holding a regular expression when ``regex`` is set. ``autocast_dtype``:
    peft casts bf16/fp16 adapter weights to fp32 (``get_peft_model(autocast_adapter_dtype=True)``,
    its default).
    """

    r: int = 8
    alpha: float = 8.0
    dropout: float = 0.0
    targets: tuple = (ALL_LINEAR,)
    regex: bool = False
    exclude: tuple = ()
    exclude_regex: bool = False
    modules_to_save: tuple = ()
    bias: str = "none"
    use_dora: bool = False
    layers_to_transform: tuple = ()
    layers_pattern: tuple = ()
    autocast_dtype: bool = True
    task_type: str | None = None
    source: str = ""

    def __post_init__(self):
        if int(self.r) != self.r or self.r < 1:
            raise AdapterError(f"LoRA rank r must be a whole number of at least 1, not {self.r!r}")
        if not 0 <= self.dropout < 1:
            raise AdapterError(f"lora_dropout must be in [0, 1), not {self.dropout!r}")
        if self.bias not in BIASES:
            raise AdapterError(f"bias must be one of {', '.join(BIASES)}, not {self.bias!r}")
        if not self.targets:
            raise AdapterError("the adapter has no target_modules: name the layers to adapt (e.g. q_proj,v_proj "
                               "or all-linear)")

    @property
    def all_linear(self) -> bool:
        return not self.regex and len(self.targets) == 1 and str(self.targets[0]).lower() == ALL_LINEAR

    def saved(self, module: str) -> bool:
        """Whether ``module`` is (inside) one of ``modules_to_save``: peft trains a copy of it whole."""
        return any(re.match(rf"(^|.*\.){re.escape(m)}($|\..*)", module) for m in self.modules_to_save)

    def targets_module(self, module: str, *, output_layer: bool = False) -> bool:
        """Whether peft puts an adapter on the linear layer ``module`` (its full name in the model)."""
        if self._excluded(module) or self.saved(module):
            return False
        if self.all_linear:
            return not output_layer
        if self.regex:
            return re.fullmatch(self.targets[0], module) is not None
        if module in self.targets:
            return True
        if not any(module.endswith(f".{key}") for key in self.targets):
            return False
        if not self.layers_to_transform:
            return True
        if self.layers_pattern:
            found = [re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", module) for p in self.layers_pattern]
            match = next((m for m in found if m is not None), None)
        else:
            match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
        return match is not None and int(match.group("idx")) in self.layers_to_transform

    def _excluded(self, module: str) -> bool:
        if not self.exclude:
            return False
        if self.exclude_regex:
            return re.fullmatch(self.exclude[0], module) is not None
        return module in self.exclude or any(module.endswith(f".{key}") for key in self.exclude)

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    def describe(self) -> str:
        targets = self.targets[0] if self.regex or self.all_linear else ",".join(self.targets)
        kind = "DoRA" if self.use_dora else "LoRA"
        return f"{kind} r={self.r} alpha={self.alpha:g} dropout={self.dropout:g} on {targets}"


def read_adapter_config(path: str) -> Lora:
    """A peft ``adapter_config.json`` (or the folder holding one) as :class:`Lora`.

    Another peft type (IA3, prefix tuning ...), a file that is not one, or a LoRA variant the
    tracer does not model raise :class:`AdapterError` naming the file and the fix."""
    data = read_json_object(path, flag="--adapter-config", folder_file="adapter_config.json",
                            missing="give the adapter_config.json peft writes, or the folder "
                                    "LoraConfig.save_pretrained wrote",
                            max_bytes=MAX_ADAPTER_CONFIG_BYTES, error=AdapterError)
    return lora_from_dict(data, str(path))


def lora_from_dict(data: dict, source: str = "") -> Lora:
    """:class:`Lora` from a ``LoraConfig.to_dict()``-like dict."""
    where = f"--adapter-config {source}: " if source else ""
    kind = str(data.get("peft_type") or "LORA").upper()
    if kind != "LORA":
        raise AdapterError(f"{where}peft_type {kind} is not priced: lengthscan prices LoRA and DoRA adapters "
                           "(peft_type LORA); train with a LoraConfig, or price full fine-tuning without "
                           "--adapter-config")
    for unsupported, what in (("target_parameters", "LoRA on parameters (target_parameters)"),
                              ("rank_pattern", "per-module ranks (rank_pattern)"),
                              ("alpha_pattern", "per-module alphas (alpha_pattern)")):
        if data.get(unsupported):
            raise AdapterError(f"{where}{what} is not priced yet: remove {unsupported} to price the uniform rank")
    for unsupported, what in (("use_qalora", "QA-LoRA"), ("layer_replication", "layer replication"),
                              ("trainable_token_indices", "trainable token indices"), ("use_bdlora", "BD-LoRA"),
                              ("alora_invocation_tokens", "activated LoRA"), ("arrow_config", "Arrow routing"),
                              ("lora_bias", "a bias on lora_B (lora_bias)")):
        if data.get(unsupported):
            raise AdapterError(f"{where}{what} is not priced: lengthscan prices plain LoRA and DoRA")
    targets, regex = _targets(data.get("target_modules"), where)
    exclude, exclude_regex = _names(data.get("exclude_modules"))
    layers = data.get("layers_to_transform")
    layers = (layers,) if isinstance(layers, int) else tuple(layers or ())
    pattern = data.get("layers_pattern")
    pattern = (pattern,) if isinstance(pattern, str) else tuple(pattern or ())
    try:
        return Lora(r=int(data.get("r", 8)), alpha=float(data.get("lora_alpha", 8)),
                    dropout=float(data.get("lora_dropout", 0.0) or 0.0), targets=targets, regex=regex,
                    exclude=exclude, exclude_regex=exclude_regex,
                    modules_to_save=tuple(data.get("modules_to_save") or ()), bias=str(data.get("bias", "none")),
                    use_dora=bool(data.get("use_dora", False)), layers_to_transform=layers, layers_pattern=pattern,
                    task_type=data.get("task_type"), source=source)
    except AdapterError as exc:
        raise AdapterError(f"{where}{exc}") from None
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"{where}a value does not read: {exc}") from None


def _targets(value, where: str) -> tuple[tuple, bool]:
    if value is None:
        raise AdapterError(f"{where}target_modules is not set: peft then picks the model's default targets; write "
                           "them out (e.g. [\"q_proj\", \"v_proj\"] or \"all-linear\")")
    if isinstance(value, str):
        if value.lower() == ALL_LINEAR:
            return (ALL_LINEAR,), False
        try:
            re.compile(value)
        except re.error as exc:
            raise AdapterError(f"{where}target_modules {value!r} is not a regular expression ({exc})") from None
        return (value,), True
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise AdapterError(f"{where}target_modules must be a list of module names or a regular expression")
    return tuple(sorted(value)), False


def _names(value) -> tuple[tuple, bool]:
    if not value:
        return (), False
    if isinstance(value, str):
        return (value,), True
    return tuple(value), False


def lora_from_flags(r: int, targets: str | None, alpha: float | None = None, dropout: float = 0.0,
                    use_dora: bool = False) -> Lora:
    """The ``--lora-r``/``--lora-targets`` shortcut: ``targets`` comma-separated names, or all-linear."""
    names = tuple(sorted(n.strip() for n in (targets or ALL_LINEAR).split(",") if n.strip()))
    if len(names) == 1 and names[0].lower() == ALL_LINEAR:
        names = (ALL_LINEAR,)
    return Lora(r=r, alpha=float(alpha if alpha is not None else 2 * r), dropout=dropout, targets=names,
                use_dora=use_dora, source="flags")
