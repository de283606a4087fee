"""A first run's fast path proven apart from the counting (``early.py``).

``answer_for`` loads the tokenizer as the run would, waits for what the counting asks (the roles
counted on ``tokenizer.json`` as ``tokenizers`` loads it, their first texts, and that backend's
digest), proves the fast path for each role on the loaded tokenizer's own backend
(``fastpath.prove``: structure, probes, the first texts), remembers that proof for these files
(``fastpath.Memo``, as a run that proved it itself would), and checks that this backend counts as
the file's does (``counts_digest``: the same digest). Where both hold it answers ``{"ok": True,
"reasons": {role: why}}``; otherwise ``{"ok": False, "why": ...}`` (with ``"remembered"`` where the
proof was remembered: the counting counts again with the remembered backend, without loading
transformers itself).

Where transformers is not imported yet (a command's first run), this runs in a process of its own
(``prover``, which makes the count-only engine's proof first): its seconds of importing never take
the counting process's GIL. Where it is (a
notebook, a test session), in a thread of the counting process.
"""

from __future__ import annotations

from typing import Callable


def answer_for(handle, asked: Callable[[], dict | None], file_digest: str | None = None) -> tuple:
    """(answer, remember) for ``handle``'s tokenizer to what ``asked()`` (waited for) asks:
    ``remember()`` writes the proof to the cache, before or after the answer is given (None:
    nothing to write, or written already: the counting reads it back). The answer is None where
    nothing was asked (the counting ended otherwise). ``file_digest``: ``tokenizer.json``'s
    ``counts_digest``, where the prover made it itself (else the question carries it)."""
    from lengthscan.measure.text.counts_digest import counts_digest
    from lengthscan.measure.text.fastpath import METHOD_FAST, input_backend, prove

    try:
        tok = handle.tokenizer
        own = input_backend(tok)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the counting loads it itself and says what is wrong
        asked()
        return {"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:200]}"}, None
    question = asked()
    if not question:
        return None, None
    methods = {role: prove(tok, role, texts, handle.call_ids, backend=own) for role, texts in question["roles"].items()}
    bad = next((f"{role}: {m.reason}" for role, m in methods.items() if m.method != METHOD_FAST), None)
    if bad is not None:
        return {"ok": False, "why": bad}, None
    memo, info = handle.memo(), handle.loaded_info()

    def remember() -> None:  # proven on the loaded tokenizer's own backend, whatever the file's counted
        if memo is not None:
            for role, method in methods.items():
                memo.remember(role, method, info)
    expected = file_digest if file_digest is not None else question.get("digest")
    if expected is None or counts_digest(own) != expected:
        # the counting counts again, with the backend remembered now (it never loads transformers itself)
        remember()
        return {"ok": False, "why": "the loaded tokenizer's backend does not count as tokenizer.json as tokenizers "
                                    "loads it", "remembered": memo is not None}, None
    return {"ok": True, "reasons": {role: m.reason for role, m in methods.items()}, "info": info}, remember


def prover(conn, name: str, revision: str | None, hide_torch: bool, tokenizer_json: str,
           engine_cache: str | None = None, stamp: tuple | None = None, engine_only: bool = False) -> None:
    """The prover process's work (``conn``: its end of a pipe; ``name``: the tokenizer folder):
    ``tokenizer_json``'s digest and, with ``engine_cache``, the count-only engine's proof of that
    file, made into that cache (``prefetch.prove_file``; ``{"engine": True}`` is sent once it has
    ended, proven or not); then, once told to go on (the counting has begun on the file), the
    answer to the counting's question (``answer_for``), the proof written to the cache after it
    (the counting's process waits for this process at its exit). ``stamp``: the file's ``file_stamp``
    when the counting began to read it (a file changed since has no digest here: the counts
    are not confirmed). ``engine_only``: the engine's proof alone (a run of conversations only,
    which counts nothing on the file), then the process ends."""
    try:
        from pathlib import Path

        from lengthscan import heap
        from lengthscan.measure.text.countbpe.prefetch import prove_file
        from lengthscan.sources.cache_dir import file_stamp_or_none

        path = Path(tokenizer_json)
        digest = prove_file(path, Path(engine_cache) if engine_cache is not None else None)
        heap.trim()  # the file read as JSON, and the proof's tables, freed: their pages back
        if stamp is None or file_stamp_or_none(path) != tuple(stamp):
            digest = None
        conn.send({"engine": True})
        if engine_only:  # nothing is counted on the file (conversations only): done, its memory freed
            return
        first = conn.recv()  # {"go": True}, or the question itself
        if _loads_the_file(path.parent):
            _yield_to_the_counting()
        if hide_torch:
            from lengthscan.torchless import hide_torch as hide

            hide()
        from lengthscan.measure.text.handle import TokenizerHandle

        asked = (lambda: first) if "roles" in first else conn.recv
        answer, remember = answer_for(TokenizerHandle(name, revision=revision), asked, digest)
        if answer is not None:
            conn.send(answer)
        if remember is not None:
            remember()
    except (KeyboardInterrupt, SystemExit, EOFError, BrokenPipeError):
        pass
    except BaseException as exc:  # noqa: BLE001 - the counting process loads it itself and says what is wrong
        try:
            conn.send({"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:200]}"})
        except (OSError, ValueError):
            pass
    finally:
        conn.close()


def _loads_the_file(folder) -> bool:
    """The folder's ``tokenizer_config.json`` names the generic class, which transformers builds from
    ``tokenizer.json`` itself: its answer is all but sure to confirm the counts, so it may come at
    the end. A model's own class may rebuild the backend otherwise (then the rows counted before the
    answer are counted again: it should come early)."""
    import json

    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("tokenizer_class") in ("PreTrainedTokenizerFast",
                                                                          "TokenizersBackend")


def _yield_to_the_counting() -> None:
    """From here the prover's work (seconds of importing and loading) is only needed when the
    counting ends: it takes the cores the counting leaves idle, not the counting's (a lower
    scheduling priority, where the system has one)."""
    import os

    try:
        os.nice(10)
    except (AttributeError, OSError):
        pass
