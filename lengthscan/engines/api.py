"""The public calls: ``lengthscan.audit``, ``lengthscan.clean`` and their Ray forms.

Each takes a :class:`~lengthscan.engines.spec.Spec` and/or the keywords of its fields; their
signatures and the keyword part of their docstrings are generated from the option records'
declarations (``engines.spec``), as the CLI's flags are. The engine is the spec's ``engine``
field: ``"local"`` (this process and its ``num_proc`` workers) or ``"ray"`` (a Ray cluster's actors; ``audit_ray``
and ``clean_ray`` are the same calls with that default).
"""

from __future__ import annotations

from lengthscan.engines.audit import run_audit
from lengthscan.engines.clean import run_clean
from lengthscan.engines.options import RunOptions
from lengthscan.engines.records import AuditResult
from lengthscan.engines.results import CleanResult
from lengthscan.engines.spec import Spec, keyword_docs, keyword_signature, spec_for

__all__ = ["audit", "clean", "audit_ray", "clean_ray", "engine_for", "Spec"]


def engine_for(run: RunOptions):
    """The measuring loop's engine ``run`` asks for: ``LocalEngine`` or ``RayEngine``."""
    if run.engine == "ray":
        from lengthscan.engines.ray.engine import RayEngine

        return RayEngine(run.ray_address, run.num_blocks)
    from lengthscan.engines.loop import LocalEngine

    return LocalEngine(run.num_proc)


def audit(source, spec: Spec | None = None, **keywords) -> AuditResult:
    spec = spec_for("audit", spec, keywords)
    return run_audit(source, spec, engine_for(spec.run))


def clean(source, spec: Spec | None = None, **keywords) -> CleanResult:
    spec = spec_for("clean", spec, keywords)
    if spec.output.out is None:
        raise TypeError("clean() missing required keyword argument: 'out' (or a spec with output.out)")
    return run_clean(source, spec, engine_for(spec.run))


def audit_ray(source, spec: Spec | None = None, **keywords) -> AuditResult:
    return audit(source, spec, **{"engine": "ray", **keywords})


def clean_ray(source, spec: Spec | None = None, **keywords) -> CleanResult:
    return clean(source, spec, **{"engine": "ray", **keywords})


audit.__doc__ = f"""Measure the lengths of ``source``'s columns as the model receives them; with ``out``, write
``lengths.parquet``, ``report.json`` and ``report.html`` there atomically.

``source`` is anything ``open_source`` opens (path, glob, directory, audio folder, hub id, remote
files, Dataset or DatasetDict). ``spec`` is a :class:`Spec`; the keywords change its fields.
With ``limits``, the audit reports what ``clean`` would do to each row, and ``fail_over`` marks the
result failed when more rows would be dropped or truncated. The keywords:

{keyword_docs("audit")}
"""
clean.__doc__ = f"""Decide every row of ``source`` by ``limits`` and write ``dataset/``, ``rejects/``,
``lengths.parquet``, ``report.json`` and ``report.html`` to ``out``, atomically (kept + truncated +
dropped = source rows, checked per split). With ``fail_over``, a source where more rows would be
dropped or truncated publishes nothing (``gate_failed``).

``spec`` is a :class:`Spec` (its sampling fields and ``packing`` are the audit's; clean decides
every row); the keywords change its fields (``out`` is required, here or in the spec). The keywords:

{keyword_docs("clean")}
"""
audit_ray.__doc__ = "``audit`` with ``engine='ray'``: the same measurement on Ray, the same result and outputs."
clean_ray.__doc__ = "``clean`` with ``engine='ray'``: the same decisions on Ray, the same result and outputs."


def _signed(call, command: str, returns, **defaults) -> None:
    signature = keyword_signature(command, returns)
    params = [p.replace(default=defaults[p.name]) if p.name in defaults else p
              for p in signature.parameters.values()]
    call.__signature__ = signature.replace(parameters=params)


_signed(audit, "audit", AuditResult)
_signed(clean, "clean", CleanResult)
_signed(audit_ray, "audit", AuditResult, engine="ray")
_signed(clean_ray, "clean", CleanResult, engine="ray")
