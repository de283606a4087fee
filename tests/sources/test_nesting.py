"""The block scanner of JSON nesting (numpy) against the line-by-line regex it replaces."""

from __future__ import annotations

import io
import random

import pytest

from lengthscan.sources import nesting as nest
from lengthscan.sources.nesting import first_deep_line, nesting


def by_lines(data: bytes, limit: int) -> int | None:
    """The reference: every line read with the regex, the depth carried over (as before)."""
    depth, extra = 0, None
    for number, raw in enumerate(io.BytesIO(data), start=1):
        if extra is None and raw.strip():
            extra = 1 if raw.lstrip()[:1] == b"[" else 0
        top, depth = nesting(raw, depth)
        if top - (extra or 0) > limit:
            return number
    return None


def random_file(rng: random.Random) -> bytes:
    pieces = [b"[", b"]", b"{", b"}", b'"', b"\\", b"\\\\", b'\\"', b"a", b" ", b"\n", b'"x"', b"[[[", b"]]]"]
    weights = [8, 7, 8, 7, 4, 2, 1, 2, 6, 3, 2, 3, 1, 1]
    return b"".join(rng.choices(pieces, weights, k=rng.randint(0, 400)))


@pytest.mark.parametrize("block", [7, 64, 8 << 20])
def test_the_block_scanner_finds_the_lines_the_regex_finds(monkeypatch, tmp_path, block):
    monkeypatch.setattr(nest, "_BLOCK", block)  # blocks that end inside lines, strings and runs of backslashes
    rng = random.Random(block)
    path = tmp_path / "f.jsonl"
    checked = deep = 0
    for _ in range(600):
        data = random_file(rng)
        path.write_bytes(data)
        for limit in (2, 5, 32):
            want = by_lines(data, limit)
            assert first_deep_line(lambda: open(path, "rb"), limit) == want, (data, limit)
            checked += 1
            deep += want is not None
    assert deep > checked // 4 and deep < checked  # both answers were asked for


def test_json_lines_with_brackets_in_strings_are_shallow(tmp_path):
    path = tmp_path / "man.jsonl"
    row = '{"text": "' + "if [ x ]; then { [[ a ]]; } \\\" [[[[ \\\\" * 200 + '"}\n'
    path.write_text(row * 50 + '{"deep": ' + "[" * 40 + "]" * 40 + "}\n", encoding="utf-8")
    assert by_lines(path.read_bytes(), 32) == 51
    assert first_deep_line(lambda: open(path, "rb"), 32) == 51
