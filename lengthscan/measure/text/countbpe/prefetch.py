"""The count-only engine's proof begun as the run starts, from the tokenizer's own file.

A first run proves the engine for the tokenizer (the rank table, ``proof.py``; the code-point
probe, ``codepoints.py``): seconds of work on a large vocabulary. Both depend only on parts of
``tokenizer.json`` (the BPE model; the pre-tokenizer and normalizer), so they can begin before
transformers has loaded the tokenizer, while the source's layout is read: ``Prefetch`` loads the
file with ``tokenizers`` (the backend a run may count with while transformers loads it, see
``choice.py``) and makes both in a thread. What it makes goes to the same in-process tables and
cache files as the proof made for the loaded tokenizer, under keys of the model's serialized
state and of the regex engines' versions: the loaded tokenizer uses it only where its own model
serializes the same, and a proof still being made is waited for, never made twice. A file the
engine refuses is left to the proof at the counting, which says why.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class Prefetch:
    """The tokenizer file ``tokenizer_json`` loaded, then (``engine``) the count-only engine's
    proof made for it, in a thread."""

    def __init__(self, tokenizer_json: Path, cache_dir: Path | None, *, engine: bool):
        self._backend: Tokenizer | None = None
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(tokenizer_json, cache_dir, engine),
                                        name="lengthscan-count-prefetch", daemon=True)
        self._thread.start()

    def backend(self) -> Tokenizer | None:
        """The file's own backend, untruncated and unpadded (waited for; None: it did not load)."""
        self._loaded.wait()
        return self._backend

    def _run(self, tokenizer_json: Path, cache_dir: Path | None, engine: bool) -> None:
        try:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_file(str(tokenizer_json))
            from lengthscan import heap

            heap.trim()  # the parsed JSON freed: its pages back to the system
            backend.no_truncation()
            backend.no_padding()
            self._backend = backend
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001, S110 - not a tokenizers file: transformers' load says what is wrong
            pass
        finally:
            self._loaded.set()
        if engine and self._backend is not None:
            prove_for(self._backend, cache_dir)


def prove_file(tokenizer_json: Path, cache_dir: Path | None) -> str | None:
    """``prove_for`` the file ``tokenizer_json`` (the prover process's first work, ``confirm.prover``;
    ``cache_dir`` None: the digest only),
    read as JSON: its BPE model built from the entry (the same state as ``tokenizers`` loads it),
    the other parts from the file without its vocabulary. Cheaper than loading the whole file with
    ``tokenizers``, then reading its model back. Returns the file's ``counts_digest`` (what the
    counting's backend, the file as ``tokenizers`` loads it, counts by); None: a file that does not
    read so, left to the counting, which says why."""
    try:
        from tokenizers import Tokenizer

        from lengthscan.measure.text.countbpe.proof import bpe_model, merge_pairs
        from lengthscan.measure.text.counts_digest import counts_digest

        text = tokenizer_json.read_text(encoding="utf-8")
        data = json.loads(text)
        model = data.get("model") or {}
        if model.get("type") != "BPE" or cache_dir is None:  # no count-only engine: the digest only
            return counts_digest(Tokenizer.from_str(text))
        pairs = merge_pairs(model.get("merges") or [])  # read once, for the model and the proof
        bpe = bpe_model(model, pairs)
        state = bpe.__getstate__()
        bpe.ignore_merges = False  # the proof's own merge loop (``derive_model``); the state is read
        parts = Tokenizer.from_str(json.dumps({**data, "model": {**model, "vocab": {}, "merges": []}}))
        digest = counts_digest(parts, state)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - not a tokenizers file: the counting says what is wrong
        return None
    _prove(parts, state, cache_dir, model, bpe, pairs)
    return digest


def prove_for(backend, cache_dir: Path | None) -> None:
    """The rank table and code-point probe for ``backend``'s model and split, into the caches."""
    try:
        state = backend.model.__getstate__()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001, S110 - unreadable: the proof at the counting says why
        return
    _prove(backend, state, cache_dir, None, backend.model)


def _prove(backend, state: bytes, cache_dir: Path | None, model: dict | None, bpe, pairs: list | None = None) -> None:
    """The rank table of the model whose state is ``state`` (``model``: that state read; ``bpe``:
    the model, only read; ``pairs``: its merges read) and the probe of ``backend``'s pre-tokenizer
    and normalizer."""
    from lengthscan.measure.text.countbpe.codepoints import differences
    from lengthscan.measure.text.countbpe.engine import component_state
    from lengthscan.measure.text.countbpe.pattern import normalizer_form, pre_tokenizer
    from lengthscan.measure.text.countbpe.tables import derived_for, hand_over

    try:
        pre = pre_tokenizer(component_state(backend.pre_tokenizer))
        form = normalizer_form(component_state(backend.normalizer))
        if derived_for(state, cache_dir, cached_only=True) is None:  # a first run: made now
            model = model if model is not None else json.loads(state)
            if model.get("type") != "BPE":
                return
            derived_for(state, cache_dir, model=model, bpe=bpe, pairs=pairs)
        differences(pre, form, cache_dir)
        hand_over(backend, state)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001, S110 - refused or unreadable: the proof at the counting says why
        pass
