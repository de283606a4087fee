"""Text cache files carry their content's checksum: what was written reads back, anything else
(changed content, no checksum, not JSON) is not used, with a warning, and removed."""

from __future__ import annotations

import pytest

from lengthscan.sources.cache_dir import read_cache_json, read_cache_text, write_cache_json, write_cache_text


def test_what_was_written_reads_back_and_a_change_does_not(tmp_path):
    path = tmp_path / "c" / "differences.json"
    write_cache_json(path, {"class \\p{L}": [[170, 170], [181, 181]]})
    assert read_cache_json(path) == {"class \\p{L}": [[170, 170], [181, 181]]}
    path.write_text(path.read_text().replace("181", "182"))  # one routed character fewer
    with pytest.warns(RuntimeWarning, match="cache not used: .*differences.json has a checksum its content"):
        assert read_cache_json(path) is None
    assert not path.exists()  # rebuilt by the caller, never read again
    path.write_text('{"class \\\\p{L}": []}')  # no checksum line
    with pytest.warns(RuntimeWarning, match="no checksum"):
        assert read_cache_json(path) is None
    write_cache_text(path, "not json")
    with pytest.warns(RuntimeWarning, match="not JSON"):
        assert read_cache_json(path) is None
    assert read_cache_text(tmp_path / "missing.json") is None
    write_cache_text(path, "line one\nline two\n")
    assert read_cache_text(path) == "line one\nline two\n"
