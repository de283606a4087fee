"""``clean --embed-audio``: the bytes of ``Audio`` columns' files written into the output.

Done here rather than by ``datasets``' writer, whose embedding fails deep inside with a
``TypeError`` on an audio value holding neither bytes nor a path, and with a bare
``FileNotFoundError`` on a path that is gone. As ``datasets`` does, an embedded value keeps the
file's base name as its path. A value with neither bytes nor path becomes null; a file that cannot
be read is an error in ``dataset/`` (its rows were measured: the file went away since) and stays a
path in ``rejects/`` (a row rejected as ``input_missing_file`` keeps what it had).
"""

from __future__ import annotations

import os

import pyarrow as pa


def embed_audio(table: pa.Table, features: dict, *, strict: bool) -> pa.Table:
    """``table`` with the local files of its ``Audio`` columns embedded (see the module)."""
    from lengthscan.sources.streams import open_regular
    from lengthscan.write.staging import OutputError

    for name, feature in features.items():
        if not (isinstance(feature, dict) and feature.get("_type") == "Audio") or name not in table.column_names:
            continue
        values = table.column(name).to_pylist()
        for i, value in enumerate(values):
            if not isinstance(value, dict) or value.get("bytes") is not None:
                continue
            path = value.get("path")
            if path is None:
                values[i] = None
                continue
            if "://" in path:  # a remote file is not fetched: kept as a path
                continue
            try:  # a FIFO or device named as the path is refused unread: it would block or never end
                with open_regular(path) as fh:
                    values[i] = {"bytes": fh.readall(), "path": os.path.basename(path)}
            except OSError as exc:
                if strict:
                    raise OutputError(f"--embed-audio: cannot read {path} to embed it ({exc.strerror or exc}); "
                                      "it was readable when measured: restore it, or clean without --embed-audio "
                                      "to keep paths") from None
        index = table.column_names.index(name)
        table = table.set_column(index, name, pa.array(values, type=table.schema.field(name).type))
    return table
