

#: Per-row image measurements of a conversation field with images (lengths.parquet columns, rule metrics).
IMAGE_METRICS = ("image_tokens", "images")
#: Per-row side columns of such a field: its costliest image's tokens, width and height.
IMAGE_NOTES = {"max_image_tokens": "int64", "max_image_width": "int64", "max_image_height": "int64"}
