"""The block scanner of JSON nesting (numpy) against the line-by-line regex it replaces."""

from __future__ import annotations

import io
import json
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


@pytest.mark.parametrize("newline_at_end", [True, False])
def test_a_deep_line_cut_by_the_readers_blocks_is_named(tmp_path, newline_at_end):
    """The layout's one pass checks a line of many brackets with the read that ends it: one cut by
    the JSON reader's 1 MiB blocks, or the last line of a file without a line break, is named by
    its number; lines of many brackets inside strings (shallow) read on in the same pass."""
    from lengthscan.sources.json_lines import BLOCK, NestingError, json_lines_layout
    from lengthscan.sources.streams import open_text

    shallow = json.dumps({"text": "usage: cmd " + "[-x] {a|b} " * 150})  # 300 brackets, all in the string
    lines = [shallow] * (BLOCK // len(shallow) + 3)
    deep = '{"text": "y", "m": ' + "[" * 2000 + "]" * 2000 + "}"
    src = tmp_path / "man.jsonl"
    src.write_text("\n".join(lines) + "\n" + "\n".join(lines[:5]) + "\n")
    assert json_lines_layout(lambda: open_text(src))[0] == len(lines) + 5
    cut = BLOCK // (len(shallow) + 1)  # the line that starts in the first block and ends in the second
    body = lines[:cut] + [deep] + lines[cut:]
    src.write_text("\n".join(body) + ("\n" if newline_at_end else ""))
    with pytest.raises(NestingError, match=f"^line {cut + 1} nests"):
        json_lines_layout(lambda: open_text(src))
    src.write_text("\n".join(lines + [deep]) + ("\n" if newline_at_end else ""))
    with pytest.raises(NestingError, match=f"^line {len(lines) + 1} nests"):
        json_lines_layout(lambda: open_text(src))
