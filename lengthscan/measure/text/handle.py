"""One tokenizer by name: loaded on first use, hashed by its files, described for the report,
and pickled by name (a worker process or Ray actor loads it again from its folder).

The handle knows *which* tokenizer; how each role is counted with it is ``choice.py``'s and
``strategies.py``'s. Its one tokenizing method, ``call_ids``, is the reference every other way of
counting must equal: ``__call__`` as the model's data pipeline runs it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from lengthscan.measure.text.facts import TokenizerFacts
from lengthscan.measure.text.fastpath import CHAT_ROLE, Memo
from lengthscan.measure.text.loading import (
    hash_tokenizer,
    load_tokenizer,
    refuse_special_files,
    tokenizer_max_length,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TokenizerHandle:
    """``tokenizer`` is a local directory, a hub name, or an already loaded tokenizer object."""

    def __init__(self, tokenizer, *, revision: str | None = None, trust_remote_code: bool = False,
                 name: str | None = None, share_backend: bool = False):
        self.revision = revision
        self.trust_remote_code = trust_remote_code
        self._hash: str | None = None
        self._loading = threading.Lock()  # one load, whichever thread asks first (``early.py``'s may)
        #: the tokenizer is loaded here for a run, and only the run calls it (``share_backend``): not a
        #: caller's object, nor one a caller reaches (``TokenCounter.tokenizer``) and may call with truncation
        self.owned = share_backend and isinstance(tokenizer, (str, os.PathLike))
        if isinstance(tokenizer, (str, os.PathLike)):
            self.name = str(tokenizer)
            self._tokenizer = None  # loaded on first use: a rerun on cached lengths never needs it
            if Path(self.name).exists():  # its files are read before it is loaded (its config, its hash)
                refuse_special_files(Path(self.name), self.name)
            if not Path(self.name).is_dir():
                self._load()  # a hub name: load now, so a bad name fails before any work
        else:
            self.name = name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The transformers tokenizer, loaded on first use."""
        if self._tokenizer is None:
            self._load()
        return self._tokenizer

    def _load(self) -> None:
        with self._loading:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.name, revision=self.revision,
                                                 trust_remote_code=self.trust_remote_code)
                from lengthscan import heap

                heap.trim()  # the files' parsed JSON freed: its pages back to the system

    def tokenizer_file(self) -> Path | None:
        """The local ``tokenizer.json`` this tokenizer is loaded from (None: a hub name, an object,
        or a folder without one)."""
        path = Path(self.name)
        if path.is_dir():
            path = path / "tokenizer.json"
        return path if path.name == "tokenizer.json" and path.is_file() else None

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    @property
    def hash(self) -> str:
        """SHA-256 over the tokenizer's files (a local folder or file is hashed without loading it)."""
        if self._hash is None:
            local = Path(self.name).exists()
            self._hash = hash_tokenizer(None if local else self.tokenizer, self.name)
        return self._hash

    def call_ids(self, texts: list[str], role: str) -> list[list[int]]:
        """Ids of ``texts`` by the tokenizer's own ``__call__`` for ``role``: the reference."""
        tok = self.tokenizer
        if role == "target":
            return tok(text_target=texts)["input_ids"]
        if role == CHAT_ROLE:
            return tok(texts, add_special_tokens=False)["input_ids"]
        return tok(texts)["input_ids"]

    # -- what the report says of it ---------------------------------------------------------
    def description(self) -> tuple[str, bool, int | None]:
        """(class name, is fast, real ``model_max_length``) of the tokenizer: from the loaded one (or
        as the process that loaded it told, ``told``), else remembered from an earlier run on these
        files, else read from ``tokenizer_config.json``
        (every length came from the cache: the tokenizer was never loaded)."""
        if self.loaded or self.__dict__.get("_told"):
            info = self.loaded_info() if self.loaded else self._told
            return info["cls"], info["is_fast"], info["model_max_length"]
        memo = self.memo()
        remembered = memo.info() if memo is not None else {}
        if remembered:
            return remembered.get("cls"), remembered.get("is_fast"), remembered.get("model_max_length")
        config = self._config()
        max_len = tokenizer_max_length(SimpleNamespace(model_max_length=config.get("model_max_length")))
        return f"{config.get('tokenizer_class', '?')} (not loaded)", False, max_len

    def model_max_length(self) -> int | None:
        """The tokenizer's real ``model_max_length`` (None for transformers' placeholder)."""
        return self.description()[2]

    def told(self, info: dict) -> None:
        """What ``loaded_info`` says of this tokenizer, as another process that loaded it said it
        (a first run's prover, ``early.py``)."""
        self._told = dict(info)

    def loaded_info(self) -> dict:
        tok = self._tokenizer
        info = {"cls": type(tok).__name__, "is_fast": bool(getattr(tok, "is_fast", False)),
                "model_max_length": tokenizer_max_length(tok)}
        try:
            info["facts"] = self.facts().to_dict()  # read once
        except Exception:  # noqa: BLE001 - a tokenizer without these (a custom class): a later run loads it
            pass
        return info

    def facts(self, *, load: bool = True) -> TokenizerFacts | None:
        """What rendering conversations reads off the tokenizer (``facts.py``): from the loaded one,
        else as the process that loaded it told (a first run's prover), else remembered from an
        earlier run on these files, else (``load``) loaded now; None: not known without loading.
        Read once (a row's EOS asks for them)."""
        found = self.__dict__.get("_facts")
        if found is None and not self.loaded:
            memo = self.memo()
            for info in (self.__dict__.get("_told") or {}, memo.info() if memo is not None else {}):
                found = TokenizerFacts.from_dict(info["facts"]) if isinstance(info.get("facts"), dict) else None
                if found is not None:
                    break
        if found is None and (load or self.loaded):
            found = TokenizerFacts.of(self.tokenizer)
        self._facts = found
        return found

    def _config(self) -> dict:
        path = Path(self.name)
        path = (path.parent if path.is_file() else path) / "tokenizer_config.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def memo(self) -> Memo | None:
        """Where a local tokenizer folder's proven fast paths are remembered (None: not one)."""
        if self.trust_remote_code or not Path(self.name).is_dir():
            return None
        from lengthscan.sources.cache_dir import cache_root

        root = cache_root() / "fastpath"
        memo = self.__dict__.get("_memo")
        if memo is None or memo.path.parent != root:  # one per cache folder (its snapshot read once)
            memo = self._memo = Memo(root, self.hash)
        return memo

    # -- pickling: workers reload by name ---------------------------------------------------
    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_loading", None)
        state.pop("_memo", None)
        if Path(self.name).is_dir():
            state["_tokenizer"] = None  # workers load it from the directory, once each
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._loading = threading.Lock()
