"""What a run's counter begins as soon as it is made, in threads, while the source is opened
(a JSON Lines file's layout is a read of the whole file).

On a first run with a tokenizer (no fast path remembered for its files, ``fastpath.Memo``):

* transformers' load of it and the fast path's proof, in a process of its own (``confirm.py``,
  begun when the counting begins): seconds, most of them importing transformers, none of them
  taking this process's GIL;
* its ``tokenizer.json`` loaded by ``tokenizers`` alone, then the count-only engine's proof made
  for it (``countbpe/prefetch.py``).

Nothing here decides anything: ``choice.py`` may count with the file's backend while
transformers loads (``RoleStrategies.speculating``), and takes the run's results only once the loaded
tokenizer's own backend is found to serialize the same and the fast path is proven on it
(otherwise the rows are counted again). A thread that fails leaves its work to ``choice.py``,
which then fails the same way in the open, with its message.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lengthscan.measure.text.handle import TokenizerHandle


_APART = {"on": False}


def prove_apart() -> None:
    """This process is a command's (``cli.main.run``): a first run's prover may be a process of
    its own. Elsewhere (a script, a notebook) it is a thread: a spawned process would import the
    caller's ``__main__`` again, which a script without a ``__name__`` guard does not survive."""
    _APART["on"] = True


class Early:
    """The early work for ``handle``'s tokenizer: ``engine`` (the count-only engine's proof)
    unless the run counts with the tokenizer only."""

    def __init__(self, handle: TokenizerHandle, *, engine: bool):
        from lengthscan.measure.text.countbpe.prefetch import Prefetch
        from lengthscan.sources.cache_dir import cache_root

        self._handle = handle
        self._file = None
        self._prover = None  # (process, our end of its pipe) or (thread, its queue), once started
        self._answer: dict | None = None
        self.asked = False
        memo = handle.memo() if not handle.loaded else None
        path = handle.tokenizer_file() if memo is not None else None
        #: a first run with these files (no fast path remembered for them) that can be counted on the file
        self.first = path is not None and not memo.remembers()
        if self.first:
            self._file = Prefetch(path, cache_root() / "countbpe", engine=engine)
        elif memo is not None and engine:  # a later run: the remembered backend and its engine, read early
            threading.Thread(target=_read_back, args=(memo, cache_root() / "countbpe"),
                             name="lengthscan-count-prefetch", daemon=True).start()

    def _start(self) -> None:
        """The prover (``confirm.py``), started when the counting begins (its import of transformers
        would slow the source's opening): in a command where transformers is not imported yet, a
        process of its own; else a thread."""
        if not self.first or self._prover is not None:
            return
        import sys

        if "transformers" in sys.modules or not _APART["on"]:
            import queue

            questions: queue.Queue = queue.Queue()
            thread = threading.Thread(target=self._confirm_here, args=(questions,), name="lengthscan-tokenizer-proof",
                                      daemon=True)
            thread.start()
            self._prover = (thread, questions)
            return
        import multiprocessing as mp

        from lengthscan.measure.text.confirm import confirm
        from lengthscan.torchless import torch_hidden

        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        handle = self._handle
        process = ctx.Process(target=confirm, name="lengthscan-tokenizer-proof", daemon=True,
                              args=(theirs, handle.name, handle.revision, torch_hidden()))
        process.start()
        theirs.close()
        self._prover = (process, ours)

    def _confirm_here(self, questions) -> None:
        from lengthscan.measure.text.confirm import answer_for

        try:
            answer = answer_for(self._handle, questions.get)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the counting proves again itself, and says what is wrong
            answer = {"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
        self._answer = answer if answer is not None else {"ok": False, "why": "nothing was asked"}

    def file_backend(self) -> Tokenizer | None:
        """On a first run: ``tokenizer.json`` as ``tokenizers`` loads it (waited for), to count with
        until the prover has confirmed it (its process started now); None otherwise."""
        if self._file is None or self.asked:
            return None
        backend = self._file.backend()
        if backend is not None:
            self._start()
        return backend

    def ask(self, roles: dict[str, list[str]]) -> None:
        """Send the prover the roles counted on the file's backend with their first texts, and the
        digest of what that backend's counts depend on (``counts_digest``; once)."""
        if self.asked:
            return
        from lengthscan.measure.text.counts_digest import counts_digest

        self.asked = True
        question = {"roles": roles, "digest": counts_digest(self._file.backend())}
        prover, channel = self._prover
        if isinstance(prover, threading.Thread):
            channel.put(question)
            return
        try:
            channel.send(question)
        except (OSError, ValueError):  # the prover is gone: ``answer`` says so
            pass

    def answer(self, *, wait: bool) -> dict | None:
        """The prover's answer (None while it works, unless ``wait``): ``{"ok": True, "reasons":
        {role: why}}``, or ``{"ok": False, "why": ...}``."""
        if self._answer is not None:
            return self._answer
        prover, channel = self._prover
        if isinstance(prover, threading.Thread):
            if not wait and prover.is_alive():
                return None
            prover.join()
            return self._answer
        if not wait and not channel.poll():
            return None
        try:
            self._answer = channel.recv()
        except (EOFError, OSError):
            self._answer = {"ok": False, "why": f"the prover process ended (exit {prover.exitcode})"}
        channel.close()
        prover.join(timeout=5)
        return self._answer


def _read_back(memo, cache_dir) -> None:
    """A later run's remembered backend snapshot and the engine's cached proof, read while the
    source is opened (what the counting reads first; nothing is proven here)."""
    from lengthscan.measure.text.countbpe.prefetch import prove_for

    try:
        backend = memo.backend()
        if backend is not None:
            prove_for(backend, cache_dir)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001, S110 - read again at the counting, which says what is wrong
        pass
