"""Loading a tokenizer from a local folder or file: a FIFO, socket or device among the files
transformers opens by name (or lengthscan reads before loading: ``tokenizer_config.json``) is named
and refused, never opened (a read of it would block for ever, or never end)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def _special(path, kind):
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes to it: opening it for reading would block for ever
    else:
        path.symlink_to("/dev/zero")  # a device: a read never ends


@pytest.mark.parametrize("name,kind", [("tokenizer_config.json", "fifo"), ("chat_template.jinja", "device"),
                                       ("special_tokens_map.json", "fifo")])
def test_a_special_file_in_the_tokenizer_folder_is_refused_unread(tmp_path, bpe_dir, name, kind):
    folder = tmp_path / "tok"
    folder.mkdir()
    for f in bpe_dir.iterdir():
        if f.name != name:
            shutil.copy(f, folder / f.name)
    _special(folder / name, kind)
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)))
    what = "a FIFO" if kind == "fifo" else "a character device"
    for tokenizer in (folder, folder / "tokenizer.json"):  # the folder, or its file with its config beside it
        if not (folder / "tokenizer_config.json").is_file() and tokenizer.is_file():
            continue  # a lone tokenizer.json is loaded by itself: its folder is not read
        proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer", str(tokenizer),
                               "--input", "text", "--full", "--out", str(tmp_path / "o"), "--quiet"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert f"{folder / name}: {what}, not a regular file" in proc.stderr
        assert not (tmp_path / "o").exists()
