"""Videos measured from their containers' headers, never decoding a frame: the header readers
(``headers.py``), the processors' counts (``qwen.py``, ``counter.py``), the references of a
conversation's videos (``refs.py``)."""

#: Per-row video measurements of a conversation field with videos (lengths.parquet columns, rule metrics):
#: the videos' tokens, their number, the frames the processor keeps of them, their seconds (their
#: frames' presentation span).
VIDEO_METRICS = ("video_tokens", "videos", "video_frames", "video_seconds")
#: Per-row side columns of such a field: the costliest video's tokens and kept frames, and the frames
#: the videos' files hold.
VIDEO_NOTES = {"max_video_tokens": "int64", "max_video_frames": "int64", "video_file_frames": "int64"}
