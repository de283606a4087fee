"""clean's image paths made absolute, as audit resolved them: ``dataset/`` and ``rejects/`` are not
in the data file's folder, so a relative path (``pic.png``, ``../other/pic.png``) would no longer
resolve there (``measure.images.refs.local_path``: beside the data file, else from the working
directory).

Paths are rewritten where audit reads them: the images column (a path, a list of paths, or
``Image(decode=False)`` values ``{"bytes", "path"}`` without bytes) and the image parts of the
conversation columns (a part's ``image``, ``path`` or ``url``, OpenAI's ``image_url``), in Arrow
struct columns and in ``datasets``' ``Json`` values (JSON text) alike. URLs, data URIs, bytes and
absolute paths are left as they are; every column keeps its type.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Keys of an image part that may hold a path (``base64`` holds the image itself).
PATH_KEYS = ("image", "path", "url")


def absolute_path(p, base_dir: str):
    """``p`` as an absolute path, resolved as audit resolves it; anything else unchanged."""
    from lengthscan.measure.images.refs import local_path

    if not isinstance(p, str) or not p or os.path.isabs(p) or "://" in p or p.startswith("data:"):
        return p
    return os.path.normpath(os.path.abspath(local_path(p, base_dir)))


def absolute_images(table: pa.Table, base_dir: str, *, images: str | None, conversations: tuple = ()) -> pa.Table:
    """``table`` with the relative image paths of the ``images`` column and of the image parts of
    the ``conversations`` columns made absolute."""
    def fix(p):
        return absolute_path(p, base_dir)

    names = ([(images, _column_paths)] if images else []) + [(c, _part_paths) for c in conversations if c]
    for name, how in names:
        if name not in table.column_names:
            continue
        position = table.schema.get_field_index(name)
        col = table.column(name)
        chunks = [how(chunk, fix) for chunk in col.chunks]
        if all(new is old for new, old in zip(chunks, col.chunks)):
            continue
        table = table.set_column(position, table.schema.field(name), pa.chunked_array(chunks, col.type))
    return table


def _column_paths(array: pa.Array, fix) -> pa.Array:
    """An images column's paths fixed: strings, lists of them, ``{"bytes", "path"}`` structs."""
    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _strings(array, fix, None)
    if _is_list(t):
        return _with_values(array, _column_paths(array.values, fix))
    if pa.types.is_struct(t) and "path" in [f.name for f in t]:
        mask = None
        if "bytes" in [f.name for f in t]:  # the bytes are the image: their path is only a name
            mask = array.field("bytes").is_null()
        return _with_field(array, "path", _strings(array.field("path"), fix, mask))
    if getattr(t, "extension_name", None) == "arrow.json":
        return _json_values(array, lambda v: _fixed_refs(v, fix))
    return array


def _part_paths(array: pa.Array, fix) -> pa.Array:
    """A conversation column's image parts with their paths fixed, at any depth."""
    t = array.type
    if getattr(t, "extension_name", None) == "arrow.json":
        return _json_values(array, lambda v: _fixed_parts(v, fix))
    if _is_list(t):
        return _with_values(array, _part_paths(array.values, fix))
    if not pa.types.is_struct(t):
        return array
    names = [f.name for f in t]
    out = array
    is_image = None
    if "type" in names and (pa.types.is_string(t.field("type").type) or pa.types.is_large_string(t.field("type").type)):
        is_image = pc.fill_null(pc.is_in(array.field("type"), pa.array(["image", "image_url"])), False)
    for f in t:
        child = out.field(f.name)
        if is_image is not None and f.name in PATH_KEYS + ("image_url",) and \
                (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)):
            new = _strings(child, fix, is_image)
        elif is_image is not None and f.name == "image_url" and pa.types.is_struct(f.type) and \
                "url" in [g.name for g in f.type]:
            new = _with_field(child, "url", _strings(child.field("url"), fix, is_image))
        else:
            new = _part_paths(child, fix)
        if new is not child:
            out = _with_field(out, f.name, new)
    return out


def _fixed_parts(value, fix):
    """A decoded JSON value with the paths of its image parts fixed."""
    if isinstance(value, list):
        return [_fixed_parts(v, fix) for v in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") in ("image", "image_url"):
        out = {k: fix(v) if k in PATH_KEYS else v for k, v in value.items()}
        url = out.get("image_url")
        if isinstance(url, dict) and "url" in url:
            out["image_url"] = {**url, "url": fix(url["url"])}
        elif isinstance(url, str):
            out["image_url"] = fix(url)
        return out
    return {k: _fixed_parts(v, fix) for k, v in value.items()}


def _fixed_refs(value, fix):
    """A decoded JSON images value (a path, a list, a ``{"bytes", "path"}`` dict) with its paths fixed."""
    if isinstance(value, list):
        return [_fixed_refs(v, fix) for v in value]
    if isinstance(value, dict) and value.get("bytes") is None and "path" in value:
        return {**value, "path": fix(value["path"])}
    return fix(value)


def _is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _strings(array: pa.Array, fix, mask) -> pa.Array:
    """A string array with ``fix`` applied where ``mask`` (None: everywhere) holds; the same array
    where nothing changes."""
    values = array.to_pylist()
    where = range(len(values)) if mask is None else np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    changed = False
    for i in where:
        new = fix(values[i])
        if new != values[i]:
            values[i], changed = new, True
    return pa.array(values, array.type) if changed else array


def _with_values(array: pa.Array, values: pa.Array) -> pa.Array:
    """A list array with its child values replaced (same offsets and nulls)."""
    if values is array.values:
        return array
    kind = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
    # ``offsets`` (of a sliced array too) index ``values``, the whole child
    return kind.from_arrays(array.offsets, values, type=array.type, mask=array.is_null() if array.null_count else None)


def _with_field(array: pa.StructArray, name: str, child: pa.Array) -> pa.StructArray:
    """A struct array with one field's values replaced (same nulls)."""
    if child is array.field(name):
        return array
    fields = [array.type.field(k) for k in range(array.type.num_fields)]
    children = [child if f.name == name else array.field(f.name) for f in fields]
    return pa.StructArray.from_arrays(children, fields=fields, mask=array.is_null() if array.null_count else None)


def _json_values(array: pa.Array, fix_value) -> pa.Array:
    """An ``arrow.json`` array with each decoded value passed through ``fix_value``."""
    texts = array.storage.to_pylist()
    changed = False
    for i, text in enumerate(texts):
        if text is None:
            continue
        value = json.loads(text)
        new = fix_value(value)
        if new != value:
            texts[i], changed = json.dumps(new, ensure_ascii=False), True
    if not changed:
        return array
    return pa.ExtensionArray.from_storage(array.type, pa.array(texts, array.type.storage_type))
