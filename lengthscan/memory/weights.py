"""The weights of the run launched: their dtype, which are quantized, which train.

:class:`WeightPlan` gathers what ``from_pretrained(dtype=..., quantization_config=...)``,
``prepare_model_for_kbit_training`` and ``get_peft_model`` decide about each parameter, so the
tracer (``tape.py``) asks one object:

* the dtype a parameter is stored in: ``--torch-dtype`` (the Trainer keeps it: a bf16-loaded model
  trained with ``bf16=True`` has no fp32 master copy); ``prepare_model_for_kbit_training`` casts
  every bf16/fp16 parameter of a quantized model to fp32 (norms, embeddings, the head, biases);
  peft casts bf16/fp16 adapters to fp32 (``autocast_adapter_dtype=True``, its default);
* whether it trains: everything without an adapter; with one, only the adapters, the copies of
  ``modules_to_save`` and the biases ``bias`` names.
"""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.memory.adapters import Lora
from lengthscan.memory.quant import Quantization

#: the tape's dtype for each --torch-dtype
TORCH_DTYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
ADAPTER_PARTS = (".lora_A.", ".lora_B.", ".lora_magnitude_vector.")


@dataclass(frozen=True)
class WeightPlan:
    """Dtypes, quantization and trainability of a model's parameters."""

    torch_dtype: str = "f32"
    lora: Lora | None = None
    quantization: Quantization | None = None
    prepare_kbit: bool = True

    @property
    def active(self) -> bool:
        """Whether any layer is built differently from a plain full fine-tuning's."""
        return self.lora is not None or self.quantization is not None

    def dtype(self, name: str) -> str:
        """The dtype parameter ``name`` is stored in (a quantized weight excepted: see quant.py)."""
        if is_adapter(name):
            if self.lora is not None and not self.lora.autocast_dtype and self.quantization is None:
                return self.torch_dtype
            return "f32"
        if self.quantization is not None and self.prepare_kbit:
            return "f32"
        return self.torch_dtype

    def trainable(self, name: str, default: bool) -> bool:
        """Whether parameter ``name`` gets a gradient and optimizer state."""
        if self.lora is None:
            return default
        if is_adapter(name) or ".modules_to_save." in name:
            return True
        module = name.rsplit(".", 1)[0]
        if self.lora.saved(module):
            return True
        return self.lora.bias == "all" and name.endswith(".bias")

    def duplicated(self, name: str) -> bool:
        """Whether peft keeps a frozen original besides the trained copy (``modules_to_save``)."""
        return self.lora is not None and self.lora.saved(name.rsplit(".", 1)[0])


def is_adapter(name: str) -> bool:
    return any(part in name for part in ADAPTER_PARTS)
