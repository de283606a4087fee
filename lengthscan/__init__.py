"""lengthscan: audit and fix the sequence lengths of training data before training starts.

The public API is imported lazily so that ``lengthscan --help`` stays instant.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "audit": ("lengthscan.pipeline", "audit"),
    "open_source": ("lengthscan.sources", "open_source"),
    "load_source": ("lengthscan.sources", "load_source"),
    "AuditResult": ("lengthscan.records", "AuditResult"),
    "FieldSpec": ("lengthscan.records", "FieldSpec"),
    "TokenCounter": ("lengthscan.tokens", "TokenCounter"),
    "token_lengths": ("lengthscan.mapping", "token_lengths"),
    "add_lengths": ("lengthscan.mapping", "add_lengths"),
    "clean": ("lengthscan.cleaner", "clean"),
    "CleanResult": ("lengthscan.cleaner", "CleanResult"),
    "within_limits": ("lengthscan.mapping", "within_limits"),
    "truncate_to_limits": ("lengthscan.mapping", "truncate_to_limits"),
    "LengthCappedCollator": ("lengthscan.trainer", "LengthCappedCollator"),
    "add_length_column": ("lengthscan.trainer", "add_length_column"),
    "trainer_length_kwargs": ("lengthscan.trainer", "trainer_length_kwargs"),
    "length_grouped_sampler": ("lengthscan.trainer", "length_grouped_sampler"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lengthscan' has no attribute {name!r}")
