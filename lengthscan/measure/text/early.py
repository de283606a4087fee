"""What a run's counter begins as soon as it is made, in threads, while the source is opened
(a JSON Lines file's layout is a read of the whole file).

On a first run with a tokenizer (no fast path remembered for its files, ``fastpath.Memo``):

* its ``tokenizer.json`` loaded by ``tokenizers`` alone (``countbpe/prefetch.py``), to count with
  from the first row;
* in a command's process, a prover process begun at once (``confirm.prover``): the count-only
  engine's proof for that file first (seconds on a large vocabulary, on the core the source's
  opening leaves free, never this process's GIL), then transformers' load of the tokenizer and
  the fast path's proof. Elsewhere (a script, a notebook, a process with transformers imported)
  the engine's proof is made in a thread here, and the fast path's in a thread begun with the
  counting.

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
    unless the run counts with the tokenizer only; ``file``: texts may be counted on the file's
    backend while transformers loads the tokenizer (not where every field is a conversation: a
    rendering needs the loaded tokenizer's template first, so only the engine's proof is begun)."""

    def __init__(self, handle: TokenizerHandle, *, engine: bool, file: bool = True):
        from lengthscan.measure.text.countbpe.prefetch import Prefetch
        from lengthscan.sources.cache_dir import cache_root

        self._handle = handle
        self._file = None
        self._prover = None  # (process, its inbox) or (thread, its queue), once started
        self._answer: dict | None = None
        self.asked = False
        #: the count-only engine's proof is made in the prover process (``engine_made`` waits for it)
        self.engine_apart = False
        memo = handle.memo() if not handle.loaded else None
        path = handle.tokenizer_file() if memo is not None else None
        #: a first run with these files (no fast path remembered for them) that can be counted on the file
        self.first = path is not None and not memo.remembers()
        if self.first:
            import sys

            apart = _APART["on"] and "transformers" not in sys.modules
            if apart and (file or engine):  # begun now: the engine's proof first, on the core the opening leaves
                apart = self._start_apart(path, cache_root() / "countbpe" if engine else None, engine_only=not file)
            if file or not apart:  # conversations only, proven apart: no backend of the file (hundreds of MiB)
                self._file = Prefetch(path, cache_root() / "countbpe", engine=engine and not apart)
        elif memo is not None and engine:  # a later run: the remembered backend and its engine, read early
            threading.Thread(target=_read_back, args=(memo, cache_root() / "countbpe"),
                             name="lengthscan-count-prefetch", daemon=True).start()

    def _start_apart(self, path, engine_cache, *, engine_only: bool = False) -> bool:
        """The prover process (``confirm.prover``): ``path``'s digest and, with ``engine_cache``,
        the count-only engine's proof of it made into that cache first (``engine_made``); then,
        once a role is counted on the file (``file_backend``: a command that counts in worker
        processes, or conversations only, never asks), transformers' load of the tokenizer and the
        fast path's proof (``ask``, ``answer``). Nothing it does takes this process's GIL. It
        writes the proof after its answer: this process waits for it at its exit (the next run is
        a later run). ``engine_only``: the process ends once the engine's proof is made (nothing will
        be counted on the file). False: the process could not be started (the thread's way is taken)."""
        import atexit
        import multiprocessing as mp

        from lengthscan.measure.text.confirm import prover
        from lengthscan.sources.cache_dir import file_stamp_or_none
        from lengthscan.torchless import torch_hidden

        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        handle = self._handle
        stamp = file_stamp_or_none(path)
        process = ctx.Process(target=prover, name="lengthscan-tokenizer-proof", daemon=True,
                              args=(theirs, handle.name, handle.revision, torch_hidden(), str(path),
                                    str(engine_cache) if engine_cache is not None else None, stamp, engine_only))
        try:
            process.start()
        except OSError:  # no process to be had (limits): the thread's way
            ours.close()
            theirs.close()
            return False
        theirs.close()
        atexit.register(self._at_exit)  # before multiprocessing's own exit ends its daemons
        self.engine_apart = engine_cache is not None
        self._prover = (process, _Inbox(process, ours))
        return True

    def _at_exit(self) -> None:
        """This process ends: a prover that has answered is writing its proof (waited for, the next
        run reads it); one that was never asked, or not answered yet (the run failed or was
        stopped), is ended."""
        process = self._prover[0]
        if self._answer is not None:
            process.join(20)
        if process.is_alive():
            process.terminate()
            process.join(2)

    def _start(self) -> None:
        """The counting begins on the file's backend: the prover process is told to go on to
        transformers; where there is none, the prover is a thread, started now."""
        if not self.first:
            return
        if self._prover is not None:
            if not isinstance(self._prover[0], threading.Thread):
                self._prover[1].go()
            return
        import queue

        questions: queue.Queue = queue.Queue()
        thread = threading.Thread(target=self._confirm_here, args=(questions,), name="lengthscan-tokenizer-proof",
                                  daemon=True)
        thread.start()
        self._prover = (thread, questions)

    def _confirm_here(self, questions) -> None:
        from lengthscan.measure.text.confirm import answer_for

        try:
            answer, remember = answer_for(self._handle, questions.get)
            if remember is not None:
                remember()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the counting proves again itself, and says what is wrong
            answer = {"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
        self._answer = answer if answer is not None else {"ok": False, "why": "nothing was asked"}

    def engine_made(self) -> None:
        """Wait until the prover process has made the count-only engine's proof (into the cache),
        or has ended without it (the caller then makes it itself)."""
        if self.engine_apart:
            self._prover[1].engine.wait()

    def file_backend(self) -> Tokenizer | None:
        """On a first run: ``tokenizer.json`` as ``tokenizers`` loads it (waited for), to count with
        until the prover has confirmed it (its thread started now, where it is one); None otherwise."""
        if self._file is None or self.asked:
            return None
        backend = self._file.backend()
        if backend is not None:
            self._start()
        return backend

    def ask(self, roles: dict[str, list[str]]) -> None:
        """Send the prover the roles counted on the file's backend with their first texts (once);
        a thread is sent the digest of what that backend's counts depend on (``counts_digest``),
        which a prover process makes itself from the file."""
        if self.asked:
            return
        self.asked = True
        prover, channel = self._prover
        # the texts the fast path's proof takes (``fastpath.prove``: at most 64 a role, none over 20,000 characters)
        roles = {role: [t for t in texts[:64] if len(t) <= 20_000] for role, texts in roles.items()}
        if isinstance(prover, threading.Thread):
            from lengthscan.measure.text.counts_digest import counts_digest

            channel.put({"roles": roles, "digest": counts_digest(self._file.backend())})
        else:
            channel.send({"roles": roles})

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
        if not wait and not channel.answered.is_set():
            return None
        self._answer = channel.answer()
        return self._answer


class _Inbox:
    """The counting process's end of the prover process's pipe, read by a thread of its own: the
    engine's message (``engine`` is set on it, or once the process has ended), then the answer."""

    def __init__(self, process, conn):
        self._process = process
        self._conn = conn
        self.engine = threading.Event()
        self.answered = threading.Event()
        self._answer: dict | None = None
        self._outbox = None  # the messages to send, by a thread of their own (``send``)
        self._went = False
        threading.Thread(target=self._read, name="lengthscan-tokenizer-proof-inbox", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                if "engine" in message:
                    self.engine.set()
                    continue
                self._answer = message
                break
        except (EOFError, OSError):
            pass
        finally:
            self.engine.set()
            self.answered.set()

    def go(self) -> None:
        """The counting has begun on the file's backend: the prover goes on to transformers (once)."""
        if not self._went:
            self._went = True
            self.send({"go": True})

    def send(self, message: dict) -> None:
        """``message`` sent by a thread of its own, in order: a question of long texts fills the
        pipe, and the prover reads it only once it has loaded the tokenizer; the counting never
        waits for that."""
        if self._outbox is None:
            import queue

            self._outbox = queue.Queue()
            threading.Thread(target=self._send, name="lengthscan-tokenizer-proof-send", daemon=True).start()
        self._outbox.put(message)

    def _send(self) -> None:
        while True:
            message = self._outbox.get()
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the prover is gone: ``answer`` says so
                return

    def answer(self) -> dict:
        self.answered.wait()
        if self._answer is None:
            self._process.join(timeout=5)
            answer = {"ok": False, "why": f"the prover process ended (exit {self._process.exitcode})"}
        else:
            answer = self._answer
        try:
            self._conn.close()
        except OSError:
            pass
        return answer


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
