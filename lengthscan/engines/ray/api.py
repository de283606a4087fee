"""``audit_ray`` and ``clean_ray``: ``lengthscan.audit`` and ``lengthscan.clean`` with the Ray Data
engine (``engines.ray.engine.RayEngine``) as the measuring loop's engine; same results and outputs,
row for row.

Their keywords are ``audit``'s and ``clean``'s, read from those functions' signatures (plus the
cluster's, ``ray_address`` and ``num_blocks``), so that the two forms cannot drift: a keyword the
local function takes, the Ray one takes, with the same default.
"""

from __future__ import annotations

import inspect

from lengthscan.engines.audit import AuditOptions, audit, run_audit
from lengthscan.engines.clean import CleanOptions, clean, run_clean
from lengthscan.engines.ray.session import EngineError

__all__ = ["EngineError", "audit_ray", "clean_ray", "RAY_KEYWORDS"]

#: the keywords the Ray forms add to the local ones: the cluster to join and the number of read blocks
RAY_KEYWORDS = ("ray_address", "num_blocks")


def audit_ray(source, *, ray_address: str | None = None, num_blocks: int | None = None, **kwargs):
    """``lengthscan.audit`` on a Ray cluster: every keyword of ``audit``, the same ``AuditResult`` and outputs.

    ``ray_address`` is passed to ``ray.init`` (None: the running Ray session, else a new local
    one; ``"auto"`` joins a running cluster). ``num_blocks`` overrides the number of read tasks.
    The length cache is the local engine's, read and written on the driver; ``num_proc`` is ignored
    (the actor pool uses the cluster's CPUs). ``--limit`` decisions run on the driver over the merged
    ``lengths`` file, as in the local engine.
    """
    from lengthscan.engines.ray.engine import RayEngine

    return run_audit(source, AuditOptions.of(**_local_keywords(audit, source, kwargs)),
                     RayEngine(ray_address, num_blocks))


def clean_ray(source, *, ray_address: str | None = None, num_blocks: int | None = None, **kwargs):
    """``lengthscan.clean`` on a Ray cluster: every keyword of ``clean``, the same ``CleanResult`` and outputs.

    ``ray_address`` and ``num_blocks`` as in ``audit_ray``; ``format`` "parquet" writes Parquet
    shards. ``num_proc`` is ignored (the actor pool uses the cluster's CPUs). One pass where every
    threshold is known before measuring (the rows written on the driver), else two, the second's
    rows written by the actors (see ``engines.ray.write``).
    """
    from lengthscan.engines.ray.engine import RayEngine

    return run_clean(source, CleanOptions.of(**_local_keywords(clean, source, kwargs)),
                     RayEngine(ray_address, num_blocks))


def _local_keywords(local, source, kwargs: dict) -> dict:
    """``kwargs`` bound to ``local``'s signature with its defaults filled in, as a call of ``local`` would
    have them (an unknown or missing keyword is the TypeError the local call raises)."""
    try:
        bound = inspect.signature(local).bind(source, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{local.__name__}_ray(): {exc}") from None
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != "source"}


def _with_ray_keywords(ray_form, local) -> None:
    """Give ``ray_form`` the signature ``local`` has, with the Ray keywords after ``source``."""
    params = list(inspect.signature(local).parameters.values())
    ray = [p for p in inspect.signature(ray_form).parameters.values() if p.name in RAY_KEYWORDS]
    ray_form.__signature__ = inspect.Signature([params[0], *ray, *params[1:]],
                                               return_annotation=inspect.signature(local).return_annotation)


_with_ray_keywords(audit_ray, audit)
_with_ray_keywords(clean_ray, clean)
