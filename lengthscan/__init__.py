"""lengthscan: audit and fix the sequence lengths of training data before training starts.

The public API is imported lazily so that ``lengthscan --help`` stays instant.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "audit": ("lengthscan.engines.api", "audit"),
    "Spec": ("lengthscan.engines.spec", "Spec"),
    "open_source": ("lengthscan.sources.opener", "open_source"),
    "load_source": ("lengthscan.sources.opener", "load_source"),
    "AuditResult": ("lengthscan.engines.records", "AuditResult"),
    "FieldSpec": ("lengthscan.measure.records", "FieldSpec"),
    "TokenCounter": ("lengthscan.measure.text.counter", "TokenCounter"),
    "token_lengths": ("lengthscan.training.mapping", "token_lengths"),
    "image_tokens": ("lengthscan.training.images", "image_tokens"),
    "add_lengths": ("lengthscan.training.mapping", "add_lengths"),
    "clean": ("lengthscan.engines.api", "clean"),
    "audit_ray": ("lengthscan.engines.api", "audit_ray"),
    "keep_ray_actors": ("lengthscan.engines.ray.pool", "keep_actors"),
    "clean_ray": ("lengthscan.engines.api", "clean_ray"),
    "CleanResult": ("lengthscan.engines.results", "CleanResult"),
    "within_limits": ("lengthscan.training.mapping", "within_limits"),
    "truncate_to_limits": ("lengthscan.training.mapping", "truncate_to_limits"),
    "LengthCappedCollator": ("lengthscan.training.trainer", "LengthCappedCollator"),
    "add_length_column": ("lengthscan.training.trainer", "add_length_column"),
    "trainer_length_kwargs": ("lengthscan.training.trainer", "trainer_length_kwargs"),
    "length_grouped_sampler": ("lengthscan.training.trainer", "length_grouped_sampler"),
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
