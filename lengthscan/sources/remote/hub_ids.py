"""A hub dataset id read without downloading the dataset: its own Parquet files, else the hub's
converted Parquet (``refs/convert/parquet``), at one commit sha for the whole run.

The revision (``--revision``, default the main branch) is resolved once to its commit sha and
every file is read at that sha (``hf://datasets/ID@SHA/...``): a push during the run cannot mix
two versions. Splits follow the dataset card's ``configs`` where it names data files, else the
keywords ``datasets`` looks for in file and folder names (train, validation/valid/dev/val,
test/testing/eval/evaluation; no keyword anywhere: every file is train). The converted branch
holds ``CONFIG/SPLIT/NNNN.parquet``; a split the hub converted only in part (too large) sits in
``CONFIG/partial-SPLIT/``: it is read, and said to be a first part, never the whole split.
None (the caller falls back to ``load_dataset``) when neither holds Parquet files.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass

from lengthscan.sources.remote.stores import RemoteEntry, hub_version
from lengthscan.sources.source import SourceError, first_line

#: Split -> the keywords that name it in file and folder names (as ``datasets.data_files.SPLIT_KEYWORDS``).
SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
CONVERTED = "refs/convert/parquet"


@dataclass(frozen=True)
class HubFiles:
    """A hub dataset resolved to Parquet files: split -> entries, and how."""

    repo_id: str
    sha: str
    splits: dict[str, list[RemoteEntry]]
    resolved: str
    notes: tuple[str, ...] = ()


def resolve_hub(repo_id: str, *, config: str | None, revision: str | None) -> HubFiles | None:
    """``repo_id``'s Parquet files at ``revision``'s commit (see the module), or None."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        info = api.dataset_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:
        raise SourceError(f"{repo_id}: the hub does not give this dataset{f' at revision {revision}' * bool(revision)}:"
                          f" {first_line(exc)}") from None
    files = {s.rfilename: s for s in info.siblings or ()}
    card = info.card_data.to_dict() if info.card_data is not None else {}
    own = _own_parquet(repo_id, info.sha, files, card, config)
    if own is not None or revision not in (None, "main", info.sha):
        return own  # the hub converts the main branch only: another revision's conversion does not exist
    try:
        converted = api.dataset_info(repo_id, revision=CONVERTED, files_metadata=True)
    except Exception:
        return None
    return _converted(repo_id, converted.sha, {s.rfilename: s for s in converted.siblings or ()}, config)


def _entry(repo_id: str, sha: str, path: str, sibling) -> RemoteEntry:
    size = sibling.size if sibling.size is not None else (sibling.lfs.size if sibling.lfs else 0)
    return RemoteEntry(f"hf://datasets/{repo_id}@{sha}/{path}", int(size), hub_version(sibling.lfs, sibling.blob_id))


def _own_parquet(repo_id: str, sha: str, files: dict, card: dict, config: str | None) -> HubFiles | None:
    parquet = sorted(f for f in files if f.endswith(".parquet"))
    if not parquet:
        return None
    configs = card.get("configs") if isinstance(card.get("configs"), list) else []
    named = [c for c in configs if isinstance(c, dict) and c.get("data_files")]
    if named:
        names = [c.get("config_name", "default") for c in named]
        want = config or ("default" if "default" in names else names[0] if len(names) == 1 else None)
        if want not in names:
            raise SourceError(f"{repo_id}: {'no config ' + repr(config) if config else 'several configs'}; give "
                              f"--config with one of {', '.join(names)}")
        chosen = named[names.index(want)]
        splits = _card_splits(chosen["data_files"], parquet)
        how = f"the repository's Parquet files (config {want} of its dataset card)"
    else:
        if config is not None:
            parquet = [f for f in parquet if f.split("/")[0] == config]
            if not parquet:
                raise SourceError(f"{repo_id}: no config {config!r} (no folder of that name holds Parquet files)")
        splits = _keyword_splits(parquet)
        how = "the repository's Parquet files"
    if not splits:
        return None
    return HubFiles(repo_id, sha, {s: [_entry(repo_id, sha, f, files[f]) for f in fs] for s, fs in splits.items()},
                    f"{how} at commit {sha}")


def _card_splits(data_files, parquet: list[str]) -> dict[str, list[str]]:
    """split -> files, from a card config's ``data_files`` (a pattern, a list, or split entries)."""
    entries = data_files if isinstance(data_files, list) else [data_files]
    out: dict[str, list[str]] = {}
    for item in entries:
        split, paths = ("train", item) if not isinstance(item, dict) else (item.get("split", "train"), item.get("path"))
        for pattern in paths if isinstance(paths, list) else [paths]:
            out.setdefault(split, []).extend(f for f in parquet if fnmatch.fnmatchcase(f, str(pattern)))
    return {s: sorted(set(fs)) for s, fs in out.items() if fs}


def _keyword_splits(parquet: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s: [] for s in SPLIT_KEYWORDS}
    for f in parquet:
        tokens = set(re.split(r"[-._ /0-9]+", f.lower()))
        split = next((s for s, words in SPLIT_KEYWORDS.items() if tokens & set(words)), None)
        if split is not None:
            out[split].append(f)
    return {s: fs for s, fs in out.items() if fs} or {"train": parquet}


def _ordered(splits: dict) -> dict:
    """train, validation, test first (as ``datasets`` orders them), then the others by name."""
    known = [s for s in SPLIT_KEYWORDS if s in splits]
    return {s: splits[s] for s in known + sorted(s for s in splits if s not in SPLIT_KEYWORDS)}


def _converted(repo_id: str, sha: str, files: dict, config: str | None) -> HubFiles | None:
    parquet = sorted(f for f in files if f.endswith(".parquet") and f.count("/") == 2)
    configs = sorted({f.split("/")[0] for f in parquet})
    if not configs:
        return None
    want = config or ("default" if "default" in configs else configs[0] if len(configs) == 1 else None)
    if want not in configs:
        raise SourceError(f"{repo_id}: {'no config ' + repr(config) if config else 'several configs'} in the hub's "
                          f"Parquet conversion; give --config with one of {', '.join(configs)}")
    splits: dict[str, list[str]] = {}
    partial = []
    for f in parquet:
        cfg, folder, _ = f.split("/")
        if cfg != want:
            continue
        split = folder.removeprefix("partial-")
        if folder != split:
            partial.append(split)
        splits.setdefault(split, []).append(f)
    splits = _ordered(splits)
    notes = [f"split {s}: the hub converted only a first part of it (partial-{s}); the audit covers that part, "
             "not the whole split" for s in sorted(set(partial))]
    return HubFiles(repo_id, sha, {s: [_entry(repo_id, sha, f, files[f]) for f in fs] for s, fs in splits.items()},
                    f"the hub's Parquet conversion ({CONVERTED} at commit {sha}), config {want}", tuple(notes))
