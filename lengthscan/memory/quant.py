"""A bitsandbytes-quantized base model: what its linear layers store, and which it leaves alone.

``--quantization-config`` reads a ``BitsAndBytesConfig`` dict (as ``to_dict()`` writes it, or a
model ``config.json`` holding ``quantization_config``) into :class:`Quantization`. transformers
replaces every linear layer but those it skips (the output embeddings, the model's last module,
tied weights, ``llm_int8_skip_modules``) by ``bnb.nn.Linear4bit`` or ``bnb.nn.Linear8bitLt``:

* 4-bit (NF4/FP4): two weights a byte (``Params4bit``, ``uint8``), and per block of 64 weights
  an fp32 absmax; with double quantization the absmax are themselves 8-bit (one byte a block),
  with an fp32 absmax per 256 blocks and an fp32 offset. The forward and backward passes
  dequantize the whole weight into the compute dtype (``bnb_4bit_compute_dtype``) first.
* LLM.int8: one byte a weight (``Int8Params``) and an fp32 scale per output row (``SCB``); the
  matmul keeps its input for backward and dequantizes the weight into the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.memory.json_config import read_json_object

#: bitsandbytes' block of 4-bit weights sharing one absmax, and of absmax sharing one (double quantization)
BLOCK_4BIT, BLOCK_NESTED = 64, 256
METHODS = ("nf4", "fp4", "int8")
COMPUTE_DTYPES = {"float32": "f32", "fp32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16",
                  "fp16": "f16", "half": "f16", "float": "f32"}
MAX_CONFIG_BYTES = 64 << 20


class QuantizationError(ValueError):
    """A quantization config lengthscan cannot price."""


@dataclass(frozen=True)
class Quantization:
    """How transformers quantizes the base model with bitsandbytes.

    ``method``: ``nf4``/``fp4`` (4-bit, QLoRA) or ``int8`` (LLM.int8). ``compute_dtype``: the 4-bit
    matmuls' dtype (``bnb_4bit_compute_dtype``; None: the layer picks its input's). ``skip``:
    ``llm_int8_skip_modules`` (None: transformers' defaults only). ``quant_storage``: the dtype the packed
    4-bit data is stored as (``bnb_4bit_quant_storage``: ``u8``, or a float one, as FSDP-QLoRA needs to
    shard it; the bytes are the same).
    """

    method: str = "nf4"
    double_quant: bool = False
    compute_dtype: str | None = "bf16"
    skip: tuple | None = None
    threshold: float = 6.0
    source: str = ""
    quant_storage: str = "u8"

    def __post_init__(self):
        if self.method not in METHODS:
            raise QuantizationError(f"quantization method must be one of {', '.join(METHODS)}, not {self.method!r}")

    @property
    def four_bit(self) -> bool:
        return self.method in ("nf4", "fp4")

    def packed_bytes(self, numel: int) -> int:
        """Bytes of a weight's packed data alone (what FSDP shards and gathers; the rest is its state)."""
        return (numel + 1) // 2 if self.four_bit else numel

    def weight_bytes(self, numel: int, rows: int) -> int:
        """Bytes a quantized ``rows x (numel / rows)`` weight takes with its quantization state."""
        if not self.four_bit:
            return numel + 4 * rows  # int8 weights, an fp32 scale a row (SCB)
        blocks = -(-numel // BLOCK_4BIT)
        packed = (numel + 1) // 2 + 16 * 4  # and the layer's own copy of the 16-value code (NF4/FP4)
        if not self.double_quant:
            return packed + 4 * blocks
        # 8-bit absmax, fp32 absmax of absmax, offset, the 256-value code of the nested state
        return packed + blocks + 4 * -(-blocks // BLOCK_NESTED) + 4 + 256 * 4

    def absmax_temporary(self, numel: int) -> int:
        """Bytes the dequantization allocates besides the weight: the fp32 absmax of a nested state."""
        if not self.four_bit or not self.double_quant:
            return 0
        return 2 * 4 * -(-numel // BLOCK_4BIT)  # dequantize_blockwise's output, then + offset

    def skipped(self, module: str, defaults: tuple) -> bool:
        """Whether transformers leaves ``module`` unquantized (``should_convert_module``'s rules)."""
        import re

        patterns = tuple(defaults if self.skip is None else self.skip)
        boundary = r"(?:(?<=\.)|(?=\.|$))"
        return any(re.match(rf"(?:{key}){boundary}", module) or module.endswith(key) for key in patterns)

    def describe(self) -> str:
        if self.four_bit:
            dq = " double-quantized" if self.double_quant else ""
            compute = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}.get(self.compute_dtype or "", "input dtype")
            return f"4-bit {self.method.upper()}{dq} (compute {compute})"
        return "LLM.int8 (8-bit)"


def read_quantization_config(path: str) -> Quantization:
    """A ``BitsAndBytesConfig`` dict, or a model ``config.json`` holding ``quantization_config``."""
    data = read_json_object(path, flag="--quantization-config", folder_file="config.json",
                            missing="give BitsAndBytesConfig.to_dict() as JSON, or a model config.json holding "
                                    "quantization_config", max_bytes=MAX_CONFIG_BYTES, error=QuantizationError)
    if isinstance(data, dict) and isinstance(data.get("quantization_config"), dict):
        data = data["quantization_config"]
    elif isinstance(data, dict) and data.get("model_type"):
        raise QuantizationError(f"--quantization-config {path}: this model config has no quantization_config "
                                "(the checkpoint is not quantized): leave the flag out, or give a "
                                "BitsAndBytesConfig")
    if not isinstance(data, dict):
        raise QuantizationError(f"--quantization-config {path}: not a JSON object")
    return quantization_from_dict(data, str(path))


def quantization_from_dict(data: dict, source: str = "") -> Quantization:
    """:class:`Quantization` from ``BitsAndBytesConfig.to_dict()``."""
    where = f"--quantization-config {source}: " if source else ""
    method = str(data.get("quant_method", "bitsandbytes")).lower()
    if method != "bitsandbytes":
        raise QuantizationError(f"{where}quant_method {method!r} is not priced: lengthscan prices bitsandbytes "
                                "(4-bit NF4/FP4 and LLM.int8); give a BitsAndBytesConfig")
    four = bool(data.get("load_in_4bit", data.get("_load_in_4bit", False)))
    eight = bool(data.get("load_in_8bit", data.get("_load_in_8bit", False)))
    if four == eight:
        raise QuantizationError(f"{where}set exactly one of load_in_4bit and load_in_8bit")
    if eight and data.get("llm_int8_has_fp16_weight"):
        raise QuantizationError(f"{where}llm_int8_has_fp16_weight keeps fp16 weights besides the int8 ones: not "
                                "priced; leave it false (the default)")
    skip = data.get("llm_int8_skip_modules")
    if skip is not None and (not isinstance(skip, list) or not all(isinstance(s, str) for s in skip)):
        raise QuantizationError(f"{where}llm_int8_skip_modules must be a list of module names")
    compute = data.get("bnb_4bit_compute_dtype")
    if compute is not None:
        compute = COMPUTE_DTYPES.get(str(compute).removeprefix("torch."))
        if compute is None:
            raise QuantizationError(f"{where}bnb_4bit_compute_dtype {data.get('bnb_4bit_compute_dtype')!r} is not "
                                    "one of float32, bfloat16, float16")
    storage = str(data.get("bnb_4bit_quant_storage") or "uint8").removeprefix("torch.")
    if four and storage != "uint8" and storage not in COMPUTE_DTYPES:
        raise QuantizationError(f"{where}bnb_4bit_quant_storage {storage} is not uint8, float32, bfloat16 or float16")
    quant_type = str(data.get("bnb_4bit_quant_type") or "fp4").lower()
    if four and quant_type not in ("nf4", "fp4"):
        raise QuantizationError(f"{where}bnb_4bit_quant_type {quant_type!r} is not nf4 or fp4")
    return Quantization(method=quant_type if four else "int8",
                        double_quant=bool(data.get("bnb_4bit_use_double_quant", False)) and four,
                        compute_dtype=compute if four else None, skip=None if skip is None else tuple(skip),
                        threshold=float(data.get("llm_int8_threshold", 6.0) or 0.0), source=source,
                        quant_storage=COMPUTE_DTYPES.get(storage, "u8") if four else "u8")
