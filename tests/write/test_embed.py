"""--embed-audio and the audio paths a clean writes: values with no file are rejects with their reason,
kept rows' files are embedded, and a manifest's relative audio paths still resolve after the clean."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lengthscan.cli.main import main
from tests.factories import silent_wav, write_jsonl
from tests.support.audio_files import write_audio
from tests.support.cli import in_process


def test_embed_audio_with_values_holding_no_file(tmp_path, capsys):
    """An Audio value with neither bytes nor path, and one whose file is gone, are rejects (with
    their reason) and the clean publishes: kept rows' files embedded, rejects as they were."""
    from datasets import load_from_disk

    wav = write_audio(tmp_path / "a.wav", 16000, 16000)
    features = {"audio": {"_type": "Audio", "decode": False}, "text": {"_type": "Value", "dtype": "string"}}
    audio = pa.array([{"bytes": None, "path": str(wav)}, {"bytes": None, "path": None}, None,
                      {"bytes": None, "path": str(tmp_path / "gone.wav")}],
                     type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    table = pa.table({"audio": audio, "text": list("abcd")})
    pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})}),
                   tmp_path / "au.parquet")
    out = tmp_path / "o"
    proc = in_process(capsys, "clean", tmp_path / "au.parquet", "--audio", "audio", "--sampling-rate", 16000,
                      "--embed-audio", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    kept = load_from_disk(str(out / "dataset")).data.column("audio").to_pylist()
    assert kept == [{"bytes": wav.read_bytes(), "path": "a.wav"}]
    rejects = load_from_disk(str(out / "rejects")).data.to_pylist()
    assert [r["row"] for r in rejects] == [1, 2, 3]
    assert [r["audio"] for r in rejects] == [None, None, {"bytes": None, "path": str(tmp_path / "gone.wav")}]
    assert [r["reason"] for r in rejects] == ["input_missing", "input_missing", "input_missing_file"]


def test_a_manifests_audio_paths_stay_usable_after_clean(tmp_path, bpe_dir):
    import soundfile as sf

    data = tmp_path / "data"
    data.mkdir()
    silent_wav(data / "a.wav", 32000)
    silent_wav(data / "long.wav", 16000 * 40)
    write_jsonl(data / "m.jsonl", [{"audio_filepath": "a.wav", "text": "hi", "duration": 2.0},
                              {"audio_filepath": "long.wav", "text": "long", "duration": 40.0}])
    with pytest.warns(UserWarning, match="--embed-audio embeds Audio columns"):
        assert main(["clean", str(data / "m.jsonl"), "--audio", "audio_filepath", "--sampling-rate", "16000",
                     "--limit", "input_seconds<=30", "--crop-audio", "--embed-audio", "--out", str(tmp_path / "o"),
                     "--quiet"]) == 0
    from datasets import load_from_disk

    kept = load_from_disk(str(tmp_path / "o" / "dataset"))
    assert all(os.path.isabs(p) and os.path.exists(p) for p in kept["audio_filepath"])
    assert kept["duration"] == [2.0, 30.0] and sf.info(kept["audio_filepath"][1]).duration == 30.0
