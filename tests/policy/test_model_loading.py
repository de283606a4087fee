"""Loading a model's config and feature extractor from a local folder: a FIFO, socket or
device among the files transformers opens by name is named and refused, never opened (a read of it
would block for ever, or never end)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "lengthscan", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("given", ["folder", "config.json"])
def test_a_fifo_in_the_model_folder_is_refused_unread(tmp_path, bpe_dir, bart_dir, given):
    model = tmp_path / "model"
    shutil.copytree(bart_dir, model)
    os.mkfifo(model / "preprocessor_config.json")  # nobody writes to it: opening it would block for ever
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)))
    proc = _cli("audit", src, "--tokenizer", bpe_dir, "--model", model if given == "folder" else model / given,
                "--input", "text", "--full", "--out", tmp_path / "o", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{model / 'preprocessor_config.json'}: a FIFO, not a regular file" in proc.stderr
    assert not (tmp_path / "o").exists()
