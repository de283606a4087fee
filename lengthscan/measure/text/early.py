"""What a run's counter begins as soon as it is made, in threads, while the source is opened
(a JSON Lines file's layout is a read of the whole file).

On a first run with a tokenizer (no fast path remembered for its files, ``fastpath.Memo``):

* transformers' load of it: seconds, most of them importing transformers (begun when the
  counting begins: the import would slow the source's opening);
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


class Early:
    """The early work for ``handle``'s tokenizer: ``engine`` (the count-only engine's proof)
    unless the run counts with the tokenizer only."""

    def __init__(self, handle: TokenizerHandle, *, engine: bool):
        from lengthscan.measure.text.countbpe.prefetch import Prefetch
        from lengthscan.sources.cache_dir import cache_root

        self._loader: threading.Thread | None = None
        self._file = None
        memo = handle.memo() if not handle.loaded else None
        first = memo is not None and not memo.remembers()  # a first run with these files: transformers loads them
        if first:  # started when the counting begins: the import would slow the source's opening
            self._loader = threading.Thread(target=self._load, args=(handle,), name="lengthscan-tokenizer-load",
                                            daemon=True)
        path = handle.tokenizer_file() if (engine or first) else None
        if first and path is not None:
            self._file = Prefetch(path, cache_root() / "countbpe", engine=engine)
        elif memo is not None and engine:  # a later run: the remembered backend and its engine, read early
            threading.Thread(target=_read_back, args=(memo, cache_root() / "countbpe"),
                             name="lengthscan-count-prefetch", daemon=True).start()
        self.first = first

    @staticmethod
    def _load(handle: TokenizerHandle) -> None:
        try:
            handle.tokenizer  # noqa: B018 - loaded, for the thread that asks next
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001, S110 - the load at the counting raises it, with its message
            pass

    def _start(self) -> None:
        if self._loader is not None and self._loader.ident is None:
            self._loader.start()

    def loading(self) -> bool:
        """transformers is still loading the tokenizer (started now if it was not)."""
        self._start()
        return self._loader is not None and self._loader.is_alive()

    def wait(self) -> None:
        """transformers' load of the tokenizer has ended (it is started now if it was not)."""
        if self._loader is not None:
            self._start()
            self._loader.join()

    def file_backend(self) -> Tokenizer | None:
        """While transformers loads the tokenizer on a first run: ``tokenizer.json`` as ``tokenizers``
        loads it (waited for), to count with until the load ends; None otherwise."""
        if self._file is None or not self.loading():
            return None
        return self._file.backend()


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
