"""A model's JSON config files, from its folder or the hub, as transformers finds them: the ones
there, parsed; a file that is not valid JSON is an error naming it."""

from __future__ import annotations

import json


def config_files(source: str, names: tuple[str, ...], error: type[Exception] = ValueError) -> dict:
    """name -> parsed dict, for each of ``names`` that ``source`` holds (absent ones left out);
    ``error`` raised for a file that does not parse."""
    from transformers.utils import cached_file

    out = {}
    for name in names:
        try:
            path = cached_file(source, name, _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False)
        except OSError:
            path = None
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    value = json.load(fh)
            except (OSError, ValueError) as exc:
                raise error(f"{source}/{name}: not valid JSON ({exc})") from None
            if isinstance(value, dict):
                out[name] = value
    return out
