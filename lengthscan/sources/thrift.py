"""Thrift's compact protocol, as Parquet writes its footer, page headers and page index: structs
decoded to ``Struct`` (fields in order, unknown ones kept) and encoded back byte for byte.

pyarrow reads a footer but neither exposes the page index's locations nor builds a file from some
of a column's pages; ``parquet_pages`` needs both, so it reads and writes the few structs itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# compact-protocol type codes
STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)


@dataclass
class Struct:
    """A decoded struct: ``fields`` maps a field id to (type code, value), in the order read."""

    fields: dict = field(default_factory=dict)

    def get(self, fid: int, default=None):
        return self.fields[fid][1] if fid in self.fields else default

    def set(self, fid: int, kind: int, value) -> None:
        self.fields[fid] = (kind, value)
        self.fields = dict(sorted(self.fields.items()))

    def drop(self, *fids: int) -> None:
        for fid in fids:
            self.fields.pop(fid, None)


class Reader:
    """Decodes compact-protocol values from ``data`` at ``pos``."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int):
        if kind in (TRUE, FALSE):
            return kind == TRUE
        if kind == BYTE:
            b = self.byte()
            return b - 256 if b > 127 else b
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            self.pos += 8
            return struct.unpack("<d", self.data[self.pos - 8:self.pos])[0]
        if kind == BINARY:
            n = self.varint()
            self.pos += n
            return bytes(self.data[self.pos - n:self.pos])
        if kind in (LIST, SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if elem in (TRUE, FALSE):  # booleans in a list are one byte each
                return elem, [self.byte() == TRUE for _ in range(size)]
            return elem, [self.value(elem) for _ in range(size)]
        if kind == MAP:
            size = self.varint()
            if not size:
                return (0, 0), []
            types = self.byte()
            kt, vt = types >> 4, types & 0x0F
            return (kt, vt), [(self.value(kt), self.value(vt)) for _ in range(size)]
        if kind == STRUCT:
            return self.struct()
        raise ValueError(f"thrift: unknown type {kind} at byte {self.pos}")

    def struct(self) -> Struct:
        out, last = Struct(), 0
        while True:
            head = self.byte()
            if head == STOP:
                return out
            delta, kind = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            out.fields[fid] = (kind, self.value(kind))
            last = fid


class Writer:
    """Encodes compact-protocol values."""

    def __init__(self):
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while True:
            if n < 0x80:
                self.out.append(n)
                return
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, kind: int, value) -> None:
        if kind in (TRUE, FALSE):
            return
        if kind == BYTE:
            self.out.append(value & 0xFF)
        elif kind in (I16, I32, I64):
            self.zigzag(value)
        elif kind == DOUBLE:
            self.out += struct.pack("<d", value)
        elif kind == BINARY:
            self.varint(len(value))
            self.out += value
        elif kind in (LIST, SET):
            elem, items = value
            if len(items) < 15:
                self.out.append(len(items) << 4 | elem)
            else:
                self.out.append(0xF0 | elem)
                self.varint(len(items))
            for item in items:
                if elem in (TRUE, FALSE):
                    self.out.append(TRUE if item else FALSE)
                else:
                    self.value(elem, item)
        elif kind == MAP:
            (kt, vt), items = value
            self.varint(len(items))
            if items:
                self.out.append(kt << 4 | vt)
                for k, v in items:
                    self.value(kt, k)
                    self.value(vt, v)
        elif kind == STRUCT:
            self.struct(value)
        else:
            raise ValueError(f"thrift: unknown type {kind}")

    def struct(self, s: Struct) -> None:
        last = 0
        for fid, (kind, value) in sorted(s.fields.items()):
            if kind in (TRUE, FALSE):
                kind = TRUE if value else FALSE
            if 0 < fid - last <= 15:
                self.out.append((fid - last) << 4 | kind)
            else:
                self.out.append(kind)
                self.zigzag(fid)
            self.value(kind, value)
            last = fid
        self.out.append(STOP)


def decode(data: bytes, pos: int = 0) -> tuple[Struct, int]:
    """The struct at ``pos`` and the position after it."""
    reader = Reader(data, pos)
    return reader.struct(), reader.pos


def encode(s: Struct) -> bytes:
    writer = Writer()
    writer.struct(s)
    return bytes(writer.out)
