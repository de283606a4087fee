"""Remote corpora: ``s3://``, ``gs://``, ``http(s)://`` and ``hf://`` files, and hub dataset ids,
read by byte range with every byte counted.

``stores`` lists files and reads ranges through each scheme's library (pyarrow's own S3 and GCS
filesystems; fsspec for HTTP and ``huggingface_hub``'s ``HfFileSystem`` for the hub, each without
read-ahead); ``remote_file`` wraps a store's file in the file object pyarrow reads, with retries,
byte accounting and change detection; ``opening`` turns a URL or glob into a ``Source``;
``hub_ids`` resolves a hub dataset id to the Parquet files of one commit.
"""
