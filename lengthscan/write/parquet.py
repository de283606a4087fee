"""``clean --format parquet``: ``dataset/`` and ``rejects/`` as Parquet shards instead of Arrow.

A split is a folder of ``data-NNNNN-of-MMMMM.parquet`` files (one for the local engine, one or
more for the Ray engine) in row order, with the ``huggingface`` schema metadata ``datasets``
writes, so ``datasets.load_dataset("parquet", data_dir="OUT/dataset")`` gives back the columns,
rows and features of the Arrow layout (a DatasetDict with one folder per split when the source
has splits). An empty split is still one file holding the schema and no row group: pyarrow,
pandas or polars read it; ``datasets.load_dataset`` refuses a split without rows ("corresponds to
no data"), a limit of ``datasets`` (``load_from_disk`` of the Arrow layout loads empty splits).

``ParquetDatasetWriter`` has ``arrow_dataset.DatasetWriter``'s interface (``write(table)``,
``close(fingerprint)``, ``rows``, ``features``). As there, plain columns are written with pyarrow
alone; richer features (``Audio`` ...) and ``embed_local_files`` go through ``datasets``' own
Parquet writer.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lengthscan.sources.features import conform

#: Output formats of ``clean --format``.
FORMATS = ("arrow", "parquet")
#: Rows per Parquet row group (``datasets``' default for Parquet is its batch size too).
ROW_GROUP_ROWS = 1000


def shard_name(index: int, count: int, fmt: str) -> str:
    """``data-00003-of-00010.arrow``: the shard names of ``save_to_disk`` and of the Hub."""
    return f"data-{index:05d}-of-{count:05d}.{fmt}"


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        from lengthscan.write.staging import OutputError

        raise OutputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return fmt


def dataset_writer(fmt: str):
    """``arrow_dataset.DatasetWriter`` for arrow, ``ParquetDatasetWriter`` for parquet."""
    if check_format(fmt) == "parquet":
        return ParquetDatasetWriter
    from lengthscan.write.arrow_dataset import DatasetWriter

    return DatasetWriter


class ParquetDatasetWriter:
    """One split as one Parquet shard, a batch at a time (``arrow_dataset.DatasetWriter``'s interface)."""

    def __init__(self, path: Path, features, *, embed_local_files: bool | str = False):
        from lengthscan.sources import features as feats

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # a datasets Features is a dict too: to_dict() gives the plain JSON form
        self.features = features.to_dict() if hasattr(features, "to_dict") else features
        self.rows = 0
        self._embed = embed_local_files
        file = str(self.path / shard_name(0, 1, "parquet"))
        self._schema = None
        if not embed_local_files and feats.is_plain(self.features):
            import pyarrow.parquet as pq

            self._schema = feats.arrow_schema(self.features)
            self._writer = pq.ParquetWriter(file, self._schema)
        else:
            from datasets import Features
            from datasets.arrow_writer import ParquetWriter

            self._hf_features = Features.from_dict(self.features)
            self._writer = ParquetWriter(features=self._hf_features, path=file, embed_local_files=False)

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self._schema is None:
            if self._embed:
                from lengthscan.write.embed import embed_audio

                table = embed_audio(table, self.features, strict=self._embed == "strict")
            self._writer.write_table(table)
        else:
            table = conform(table, self._schema)
            self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += table.num_rows

    def close(self, fingerprint: str) -> None:
        """``fingerprint`` is accepted for the interface: Parquet shards carry no ``state.json``."""
        if self._schema is None:
            self._writer.finalize()  # without rows, datasets' writer still writes the schema
            self._writer.close()
        else:
            self._writer.close()  # without rows, a file with the schema and no row group
