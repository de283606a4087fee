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


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs on this platform")
def test_a_special_file_or_folder_in_the_place_of_a_cache_file_is_not_read(tmp_path):
    import os

    from lengthscan.sources.cache_dir import regular_cache_file

    write_cache_json(tmp_path / "ok.json", [1])
    assert regular_cache_file(tmp_path / "ok.json") and not regular_cache_file(tmp_path / "missing.json")
    os.mkfifo(tmp_path / "fifo.json")  # nobody writes to it: a read would block for ever
    (tmp_path / "zero.json").symlink_to("/dev/zero")  # a read would never end
    (tmp_path / "folder.json").mkdir()
    for name, what in (("fifo.json", "a FIFO"), ("zero.json", "a device"), ("folder.json", "a folder")):
        with pytest.warns(RuntimeWarning, match=f"{name} has the place of a file taken by {what}"):
            assert read_cache_json(tmp_path / name) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.json", "ok.json"]  # the others removed
