"""What the tests hand to worker processes (``engines/procs.py``): importable there, since the
workers find the repository's root on their path (the folder that holds ``lengthscan``)."""

from __future__ import annotations

import os

from lengthscan.measure.chat.template import Renderer


class Picky(Exception):
    """An exception that pickles but does not unpickle (its ``__init__`` wants two arguments)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def raise_picky() -> None:
    raise Picky("picky failure", 3)


class DyingRenderer(Renderer):
    """Renders as ``Renderer`` does, but ends its process (as the kernel's OOM killer would) on a
    conversation whose first message is "die"."""

    def render(self, messages: list, tools=None, **kw):
        if messages and messages[0].get("content") == "die":
            os._exit(9)
        return super().render(messages, tools, **kw)
