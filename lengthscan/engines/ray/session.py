"""Ray for one job: importing it with an actionable message, joining or starting a session.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from lengthscan.sources.source import SourceError, first_line

INSTALL = 'pip install "lengthscan[ray]"'


class EngineError(SourceError):
    """The Ray engine cannot run this (ray missing, a source it cannot read distributed): exit 2."""


@contextmanager
def ray_session(ray, ray_address: str | None):
    """Ray for one job: joined (``ray_address``; the running session if there is one) or started
    locally and shut down after. Yields whether it was joined (``ray.init`` called before)."""
    import logging

    # Ray's INFO and WARNING lines (a token generated, a local instance started, progress bars
    # off, per-dataset plans) would interleave with ours and break --quiet: errors only
    loggers = [logging.getLogger(name) for name in ("ray", "ray.data")]
    saved_levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logging.ERROR, logger.level))
    started_ray = not ray.is_initialized()
    try:
        if started_ray:
            check_reachable(ray_address)
            start(ray, ray_address)
        try:
            yield not started_ray
        finally:
            if started_ray:
                ray.shutdown()
    finally:
        for logger, level in zip(loggers, saved_levels):
            logger.setLevel(level)


def start(ray, address: str | None) -> None:
    """``ray.init``; an ``EngineError`` (exit 2, one line) where Ray cannot start or join: its processes
    did not come up (too little memory or address space: ``ulimit -v``, a container's limits), the
    session folder cannot be written, a cluster refused the connection."""
    import logging

    try:
        ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.ERROR)
    except Exception as exc:
        joining = address not in (None, "local")
        where = f"join the Ray cluster at {address}" if joining else "start a local Ray"
        # Ray 2.5x's `ray start --head` turns token authentication on, and a driver without
        # RAY_AUTH_MODE=token is refused with only a log line, after 20 s of retries
        token = (" (a cluster started with token authentication, Ray's default for `ray start`, needs "
                 "RAY_AUTH_MODE=token in this process's environment)"
                 if joining and not os.environ.get("RAY_AUTH_MODE") else "")
        raise EngineError(f"--engine ray: could not {where} ({type(exc).__name__}: {first_line(exc)}){token}; "
                          "check that `ray start --head` works on this machine, or run with --engine local") from None


#: seconds to wait for a cluster's address to answer before Ray's own minutes of retries
CONNECT_TIMEOUT_S = 5.0


def check_reachable(address: str | None) -> None:
    """A ``--ray-address`` HOST:PORT (or ray://HOST:PORT) that accepts a TCP connection, checked
    in seconds: Ray itself retries an unreachable address for minutes. ``None``, ``auto`` and
    ``local`` are Ray's to resolve."""
    import socket
    from urllib.parse import urlsplit

    if address is None or address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise EngineError(f"--ray-address {address}: give HOST:PORT (the head node's GCS port, 6379 by default), "
                          "ray://HOST:PORT, or auto")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise EngineError(f"--ray-address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                          "start one with `ray start --head`, or leave --ray-address out for a local Ray") from None


@contextmanager
def user_errors():
    """A lengthscan user error raised in a Ray task or actor (a template that loops, a row a source
    cannot read) reaches the caller as itself, its one line, not as Ray's wrapper of it (the remote
    traceback in terminal colours); other errors pass as they are."""
    try:
        yield
    except Exception as exc:
        from lengthscan.engines.errors import user_error_in

        user = user_error_in(exc)
        if user is not None and user is not exc:
            raise user from None
        raise


def import_ray():
    try:
        import ray
    except ImportError:
        raise EngineError(f"the Ray engine needs Ray, which is not installed: {INSTALL}") from None
    return ray
