"""The processor of images loaded from a local folder: a FIFO, socket or device among the files
transformers opens by name is named and refused, never opened (a read of it never ends)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.slow  # the CLI in a child process, a processor folder built
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_special_file_in_the_processor_folder_is_refused_unread(tmp_path, train_texts, kind):
    from tests.support.vision import vision_dir, write_pictures

    tok = vision_dir(tmp_path / "tok", "qwen2_5_vl", train_texts[:200])
    proc_dir = shutil.copytree(tok, tmp_path / "processor")
    odd = proc_dir / "video_preprocessor_config.json"
    os.mkfifo(odd) if kind == "fifo" else odd.symlink_to("/dev/zero")  # a read blocks for ever, or never ends
    pic = write_pictures(tmp_path / "pics")[0]
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A picture."}], "images": [str(pic)]}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "lengthscan", "audit", str(src), "--tokenizer", str(tok),
                           "--processor", str(proc_dir), "--messages", "messages", "--images", "images",
                           "--chat-template", "qwen2_5_vl", "--full", "--out", str(tmp_path / "o"), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert f"{odd}: {what}, not a regular file" in proc.stderr
    assert not (tmp_path / "o").exists()
