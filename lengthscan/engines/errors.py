"""Which errors are the user's (bad usage or unreadable input: exit 2, their one line), and how
one is found inside another error: a Ray task's or actor's error carries the original as its
``cause`` (its own text is the remote traceback in terminal colours), and Ray wraps those
again. Duck-typed: Ray is never imported here."""

from __future__ import annotations


def user_error_types() -> tuple:
    """The classes of lengthscan's own user errors."""
    from lengthscan.engines.options import OptionError
    from lengthscan.measure.chat.template import ChatTemplateError
    from lengthscan.measure.columns import ColumnError
    from lengthscan.measure.images.processor import ProcessorError
    from lengthscan.measure.text.loading import TokenizerError
    from lengthscan.pack.options import PackingError
    from lengthscan.policy.model_limits import ModelError
    from lengthscan.policy.rules import RuleError
    from lengthscan.sources.sampling import SampleError
    from lengthscan.sources.source import SourceError
    from lengthscan.write.staging import OutputError

    return (ColumnError, SampleError, SourceError, TokenizerError, OutputError, ModelError, RuleError,
            ChatTemplateError, OptionError, PackingError, ProcessorError)


def is_user_error(exc: BaseException) -> bool:
    """Bad usage or unreadable input (exit 2, one line, no traceback), raised here (not a remote
    error that only inherits the class: see ``user_error_in``)."""
    return isinstance(exc, user_error_types()) and not is_remote(exc)


def is_remote(exc: BaseException) -> bool:
    """A Ray task's or actor's error (``ray.exceptions.RayTaskError`` and its per-cause subclasses)."""
    return any(c.__name__ == "RayTaskError" and c.__module__.startswith("ray.") for c in type(exc).__mro__)


def user_error_in(exc: BaseException) -> BaseException | None:
    """The user error ``exc`` is or holds: itself, the original inside a Ray error (its ``cause``),
    or one it was raised from (``raise ... from``, as Ray wraps a task's error); None otherwise."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if is_user_error(exc):
            return exc
        cause = getattr(exc, "cause", None) if is_remote(exc) else None
        exc = cause if isinstance(cause, BaseException) else exc.__cause__  # raise ... from: not any context
    return None


def remote_cause(exc: BaseException) -> BaseException:
    """The original error inside a Ray error (its ``cause``), else ``exc``: for the one line an
    internal error prints (the remote traceback goes to the file)."""
    cause = getattr(exc, "cause", None) if is_remote(exc) else None
    return cause if isinstance(cause, BaseException) else exc
