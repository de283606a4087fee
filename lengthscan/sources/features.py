"""Dataset features in the JSON form ``datasets`` stores them (``Features.to_dict()``), built and read
without importing ``datasets`` for plain columns (values, lists, structs): importing it costs about
half a second, which a cached ``clean`` should not pay. Anything richer (``Audio``, ``ClassLabel``,
``Image``, extension arrays) is left to ``datasets`` itself: :func:`is_plain` says which.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.types as pat

_VALUE_TYPES = {
    "null": pa.null(), "bool": pa.bool_(),
    "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float16": pa.float16(), "float32": pa.float32(), "float64": pa.float64(),
    "string": pa.string(), "large_string": pa.large_string(),
    "binary": pa.binary(), "large_binary": pa.large_binary(),
    "date32": pa.date32(), "date64": pa.date64(),
}
_DTYPES = {str(t): name for name, t in _VALUE_TYPES.items()}


class NotPlain(ValueError):
    """A type this module does not convert; ``datasets`` does it instead."""


def value(dtype: str) -> dict:
    return {"dtype": dtype, "_type": "Value"}


def list_of(feature: dict, length: int | None = None) -> dict:
    out = {"feature": feature}
    if length is not None and length >= 0:
        out["length"] = length
    out["_type"] = "List"
    return out


def from_arrow_type(t: pa.DataType) -> dict:
    """``datasets.features.generate_from_arrow_type(t).to_dict()`` for plain types."""
    if pat.is_struct(t):
        return {f.name: from_arrow_type(f.type) for f in t}
    if pat.is_fixed_size_list(t):
        return list_of(from_arrow_type(t.value_type), t.list_size)
    if pat.is_list(t):
        return list_of(from_arrow_type(t.value_type))
    if pat.is_large_list(t):
        return {"feature": from_arrow_type(t.value_type), "_type": "LargeList"}
    if pat.is_timestamp(t):
        return value(f"timestamp[{t.unit}]" if t.tz is None else f"timestamp[{t.unit}, tz={t.tz}]")
    if str(t) in _DTYPES and not isinstance(t, pa.ExtensionType):
        return value(_DTYPES[str(t)])
    raise NotPlain(f"arrow type {t}")


def to_arrow_type(feature) -> pa.DataType:
    """The Arrow type ``datasets`` stores a plain feature as."""
    if not isinstance(feature, dict):
        raise NotPlain(f"feature {feature!r}")
    kind = feature.get("_type")
    if kind is None:
        return pa.struct([pa.field(k, to_arrow_type(v)) for k, v in feature.items()])
    if kind == "Value":
        dtype = feature["dtype"]
        if dtype in _VALUE_TYPES:
            return _VALUE_TYPES[dtype]
        if dtype.startswith("timestamp["):
            unit, _, tz = dtype[len("timestamp["):-1].partition(", tz=")
            return pa.timestamp(unit, tz or None)
        raise NotPlain(f"dtype {dtype}")
    if kind == "List":
        inner = to_arrow_type(feature["feature"])
        length = feature.get("length", -1)
        return pa.list_(inner, length) if length >= 0 else pa.list_(inner)
    if kind == "LargeList":
        return pa.large_list(to_arrow_type(feature["feature"]))
    raise NotPlain(f"feature type {kind}")


def is_plain(features: dict) -> bool:
    try:
        arrow_schema(features)
    except NotPlain:
        return False
    return True


def arrow_schema(features: dict) -> pa.Schema:
    """The schema ``datasets`` writes for plain ``features``, with its ``huggingface`` metadata."""
    fields = [pa.field(name, to_arrow_type(f)) for name, f in features.items()]
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema(fields, metadata=meta)


def from_schema(schema: pa.Schema) -> dict:
    """``datasets.Features.from_arrow_schema(schema).to_dict()`` where every column is plain; features
    stored in the schema's ``huggingface`` metadata win where their Arrow type matches, as there."""
    stored: dict = {}
    if schema.metadata and b"huggingface" in schema.metadata:
        stored = (json.loads(schema.metadata[b"huggingface"]).get("info") or {}).get("features") or {}
    out = {}
    for field in schema:
        if field.name in stored:
            try:
                same = to_arrow_type(stored[field.name]) == field.type
            except NotPlain:  # e.g. Audio or ClassLabel: datasets decides
                raise NotPlain(f"column {field.name}: {stored[field.name].get('_type')}") from None
            if same:
                out[field.name] = stored[field.name]
                continue
        out[field.name] = from_arrow_type(field.type)
    return out


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns in ``schema``'s order and types (a no-op when they already are)."""
    table = table.select(schema.names)
    return table if table.schema == schema else table.cast(schema)


def features_without_views(schema):
    """``datasets.Features`` for a schema with view types, each read as its plain type (None when it
    has none); features stored in the file's metadata are kept for its other columns."""
    fields = [f.with_type(_without_views(f.type)) for f in schema]
    changed = {f.name for f, g in zip(schema, fields) if f.type != g.type}
    if not changed:
        return None
    meta = dict(schema.metadata or {})
    if b"huggingface" in meta:
        stored = json.loads(meta[b"huggingface"])
        for name in changed:
            ((stored.get("info") or {}).get("features") or {}).pop(name, None)
        meta[b"huggingface"] = json.dumps(stored).encode()
    plain = pa.schema(fields, metadata=meta)
    from datasets import Features

    try:
        return Features.from_dict(from_schema(plain))
    except NotPlain:
        return Features.from_arrow_schema(plain)


def _without_views(t: pa.DataType) -> pa.DataType:
    """``t`` with ``string_view``, ``binary_view`` and list views, at any depth, as their plain types."""
    if pat.is_string_view(t):
        return pa.string()
    if pat.is_binary_view(t):
        return pa.binary()
    if isinstance(t, (pa.ListViewType, pa.LargeListViewType)):
        inner = t.value_field.with_type(_without_views(t.value_type))
        return pa.list_(inner) if isinstance(t, pa.ListViewType) else pa.large_list(inner)
    if isinstance(t, (pa.ListType, pa.LargeListType)):
        inner = t.value_field.with_type(_without_views(t.value_type))
        return pa.list_(inner) if isinstance(t, pa.ListType) else pa.large_list(inner)
    if isinstance(t, pa.FixedSizeListType):
        return pa.list_(t.value_field.with_type(_without_views(t.value_type)), t.list_size)
    if pat.is_struct(t):
        return pa.struct([t.field(i).with_type(_without_views(t.field(i).type)) for i in range(t.num_fields)])
    if pat.is_map(t):
        return pa.map_(t.key_field.with_type(_without_views(t.key_type)),
                       t.item_field.with_type(_without_views(t.item_type)))
    if pat.is_dictionary(t):
        value = _without_views(t.value_type)
        return t if value == t.value_type else value
    return t
