"""``dataset/`` and ``rejects/`` as ``save_to_disk`` Arrow shards, written batch by batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from lengthscan.sources.features import conform


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

    def __init__(self, path: Path, features, *, embed_local_files: bool | str = False):
        from lengthscan.sources import features as feats

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.features = features if isinstance(features, dict) else features.to_dict()
        self.rows = 0
        self._embed = embed_local_files
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
            self._writer = ArrowWriter(features=self._hf_features, path=file, embed_local_files=False)

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
            self._writer.write_table(table, max_chunksize=self.BATCH_ROWS)
        self.rows += table.num_rows

    def close(self, fingerprint: str) -> None:
        if self._schema is None:
            if self.rows == 0:  # ArrowWriter writes no file without a batch: write the schema alone
                # (no record batch: ``Schema.empty_table`` cannot build an extension column, datasets' Json)
                self._writer.write_table(pa.Table.from_batches([], self._hf_features.arrow_schema))
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
