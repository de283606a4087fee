"""Peak training memory of one step from a model config and a batch shape (no weights, no torch).

>>> from lengthscan.memory import MemoryOptions, Shape, estimate, load_config
>>> est = estimate(load_config("facebook/bart-base"), Shape(8, 1024, 128), MemoryOptions(precision="bf16"))
>>> est.peak_bytes, est.phase, est.terms
>>> qlora = MemoryOptions(precision="bf16", torch_dtype="bf16", adapter=read_adapter_config("lora/"),
...                       quantization=read_quantization_config("bnb-4bit.json"), gradient_checkpointing=True)

See docs/memory.md for the model, term by term, and its validation.
"""

from lengthscan.memory.adapters import Lora, read_adapter_config
from lengthscan.memory.api import MemoryEstimate, estimate, estimate_many, families, load_config, shape_warnings
from lengthscan.memory.budget import largest_fitting, usable_bytes
from lengthscan.memory.options import MemoryOptions, Shape
from lengthscan.memory.quant import Quantization, read_quantization_config

__all__ = ["Lora", "MemoryEstimate", "MemoryOptions", "Quantization", "Shape", "estimate", "estimate_many", "families",
           "largest_fitting", "load_config", "read_adapter_config", "read_quantization_config", "shape_warnings",
           "usable_bytes"]
