"""Outputs: per-row ``lengths.parquet`` streamed as rows are measured, ``report.json``, and
publication of an output directory in one rename, so a reader sees the old or the new output,
never a half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import arrays
from .features import conform
from .records import FLAG_NAMES

#: Files an audit writes; a directory holding only these may be replaced by a new audit.
AUDIT_FILES = {"lengths.parquet", "report.json", "report.html"}

_FLAG_LOOKUP = np.array([FLAG_NAMES[k] for k in sorted(FLAG_NAMES)], dtype=object)


class OutputError(ValueError):
    """The output directory cannot be written (exit code 2)."""


def lengths_schema(fields, *, with_split: bool, multi_file: bool, bounded=()) -> pa.Schema:
    """Columns of ``lengths.parquet`` for these role fields (``measure.RoleField``); ``bounded``
    roles (decide-only mode) also get ``{name}_at_least`` and ``{name}_at_most``."""
    cols = [("row", pa.int64())]
    if with_split:
        cols.append(("split", pa.string()))
    if multi_file:
        cols += [("source_file", pa.string()), ("file_row", pa.int64())]
    for f in fields:
        for spec in f.specs:
            cols.append((spec.name, pa.float64() if spec.unit == "seconds" else pa.int64()))
            if f.role in bounded and spec.unit == "tokens":
                cols += [(f"{spec.name}_at_least", pa.int64()), (f"{spec.name}_at_most", pa.int64())]
        cols += [(f"{f.role}_flag", pa.string()), (f"{f.role}_error", pa.string())]
    return pa.schema(cols)


def lengths_batch(schema: pa.Schema, rows: np.ndarray, *, split: str | None,
                  located: tuple[list[str], np.ndarray] | None, measured: dict) -> pa.RecordBatch:
    """One batch of ``lengths.parquet`` rows (``schema`` from ``lengths_schema``): ``measured``
    maps role -> ``records.Measured``; ``located`` is (source files, rows in them) or None."""
    cols: dict[str, pa.Array] = {"row": arrays.numeric(rows, pa.int64())}
    if "split" in schema.names:
        cols["split"] = arrays.strings([split] * rows.size)
    if "source_file" in schema.names:
        files, file_rows = located
        cols["source_file"] = arrays.strings(files)
        cols["file_row"] = arrays.numeric(file_rows, pa.int64())
    for role, m in measured.items():
        for spec, values in m.values.items():
            kind = schema.field(spec.name).type
            cols[spec.name] = arrays.numeric(values, kind, mask=~(values >= 0))
            if f"{spec.name}_at_least" in schema.names:
                lo, hi = (m.bounds or {}).get(spec, (np.full(rows.size, -1), np.full(rows.size, -1)))
                cols[f"{spec.name}_at_least"] = arrays.numeric(lo, pa.int64(), mask=lo < 0)
                cols[f"{spec.name}_at_most"] = arrays.numeric(hi, pa.int64(), mask=hi < 0)
        cols[f"{role}_flag"] = arrays.strings(_FLAG_LOOKUP[m.flags])
        cols[f"{role}_error"] = arrays.strings(m.errors if m.errors is not None else [None] * rows.size)
    return pa.record_batch([cols[n] for n in schema.names], schema=schema)


class LengthsWriter:
    """Streams per-row measurements into a Parquet file."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.schema = schema
        self._writer = pq.ParquetWriter(path, schema)
        self.rows = 0

    def write(self, rows: np.ndarray, *, split: str | None, located: tuple[list[str], np.ndarray] | None,
              measured: dict) -> None:
        """One batch: ``measured`` maps role -> ``records.Measured``."""
        self._writer.write_batch(lengths_batch(self.schema, rows, split=split, located=located, measured=measured))
        self.rows += rows.size

    def close(self) -> None:
        self._writer.close()


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


def staging_dir(final: Path) -> Path:
    """A fresh temporary directory beside ``final`` (same file system, so rename is atomic)."""
    final = final.resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        if _is_stale(stale):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def check_writable(final: Path, *, overwrite: bool, ours: set[str] = AUDIT_FILES) -> None:
    """Refuse early to replace a directory holding files we did not write, unless ``overwrite``."""
    if final.exists() and not final.is_dir():
        raise OutputError(f"{final}: exists and is not a directory")
    if final.is_dir() and not overwrite:
        foreign = sorted(p.name for p in final.iterdir() if p.name not in ours)
        if foreign:
            raise OutputError(f"{final}: exists and holds other files ({', '.join(foreign[:5])}); "
                              "choose another --out or pass --overwrite")


def publish(tmp: Path, final: Path) -> None:
    """Move ``tmp`` into place as ``final``; an existing ``final`` is swapped out, then removed."""
    final = final.resolve()
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def _is_stale(path: Path) -> bool:
    """A temporary directory whose creating process is gone."""
    try:
        pid = int(path.name.split("tmp-")[1].split("-")[0])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class DatasetWriter:
    """Writes one split as ``save_to_disk`` does (Arrow IPC stream, ``state.json``,
    ``dataset_info.json``), a batch at a time, so ``datasets.load_from_disk`` opens it; an empty
    split is still loadable. ``features`` is the ``Features.to_dict()`` form (or a ``Features``).

    Plain columns are written with pyarrow alone, in record batches of 1,000 rows and with the
    schema metadata ``datasets``' own ``ArrowWriter`` writes; richer features (``Audio``,
    ``ClassLabel``...) and ``embed_local_files`` go through that writer.
    """

    #: Rows per record batch, as ``datasets.config.DEFAULT_MAX_BATCH_SIZE``.
    BATCH_ROWS = 1000

    def __init__(self, path: Path, features, *, embed_local_files: bool = False):
        from . import features as feats

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.features = features if isinstance(features, dict) else features.to_dict()
        self.rows = 0
        file = str(self.path / "data-00000-of-00001.arrow")
        self._schema = None
        if not embed_local_files and feats.is_plain(self.features):
            self._schema = feats.arrow_schema(self.features)
            self._sink = pa.OSFile(file, "wb")
            self._writer = pa.ipc.new_stream(self._sink, self._schema)
        else:
            from datasets import Features
            from datasets.arrow_writer import ArrowWriter

            self._hf_features = Features.from_dict(self.features)
            self._writer = ArrowWriter(features=self._hf_features, path=file, embed_local_files=embed_local_files)

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self._schema is None:
            self._writer.write_table(table)
        else:
            table = conform(table, self._schema)
            self._writer.write_table(table, max_chunksize=self.BATCH_ROWS)
        self.rows += table.num_rows

    def close(self, fingerprint: str) -> None:
        if self._schema is None:
            if self.rows == 0:  # ArrowWriter writes no file without a batch: write the schema alone
                self._writer.write_table(self._hf_features.arrow_schema.empty_table())
            self._writer.finalize()
            self._writer.close()
        else:
            self._writer.close()
            self._sink.close()
        state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_fingerprint": fingerprint,
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
                 "_output_all_columns": False, "_split": None}
        (self.path / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        info = {key: None for key in _INFO_KEYS}
        info.update(description="", citation="", homepage="", license="", features=self.features)
        (self.path / "dataset_info.json").write_text(json.dumps({k: info[k] for k in sorted(info)}, indent=2))


#: The fields of ``datasets.DatasetInfo``, as ``dataset_info.json`` lists them.
_INFO_KEYS = ("description", "citation", "homepage", "license", "features", "post_processed", "supervised_keys",
              "builder_name", "dataset_name", "config_name", "version", "splits", "download_checksums",
              "download_size", "post_processing_size", "dataset_size", "size_in_bytes")


def write_dataset_dict_index(path: Path, splits: list[str]) -> None:
    """``dataset_dict.json``, which makes ``load_from_disk`` return a DatasetDict."""
    (Path(path) / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
