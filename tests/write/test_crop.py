"""``--crop-audio`` writes clips that hold exactly the frames kept: a codec that pads its last block
(IMA and MS ADPCM, GSM 6.10 in WAV) would hold more than the limit and more than the length
column says, so such clips are written as FLAC; the others keep their container. Checked by reading
the written files back with soundfile and librosa, as a training script loads them."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import soundfile

from lengthscan.cli.main import main
from tests.support import audio_files as af

#: (subtype, rate): WAV codecs with blocks, and PCM, at rates where 1.5 s is no whole number of blocks
CLIPS = [("IMA_ADPCM", 24000), ("MS_ADPCM", 22050), ("GSM610", 8000), ("IMA_ADPCM", 11025), ("PCM_16", 44100)]


def test_cropped_clips_hold_the_frames_kept(tmp_path):
    import librosa
    from datasets import load_from_disk

    files = [af.write_audio(tmp_path / f"{sub}-{rate}.wav", int(rate * 3.3) + k, rate, subtype=sub)
             for k, (sub, rate) in enumerate(CLIPS)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(f), "label": i}) + "\n" for i, f in enumerate(files)))
    out = tmp_path / "out"
    assert main(["clean", str(manifest), "--audio", "path", "--limit", "input_seconds<=1.5", "--crop-audio",
                 "--sampling-rate", "16000", "--out", str(out), "--quiet", "--no-cache"]) == 0
    kept = load_from_disk(str(out / "dataset"))
    assert kept["label"] == list(range(len(files)))
    assert pq.read_table(out / "lengths.parquet").to_pydict()["decision"] == ["truncate"] * len(files)
    for (sub, rate), path, length in zip(CLIPS, kept["path"], kept["length"]):
        frames = soundfile.read(path, always_2d=True)[0].shape[0]
        assert frames == int(np.floor(1.5 * rate)), (sub, rate, frames)
        assert length == len(librosa.load(path, sr=16000)[0])  # the length column: input_samples
        assert soundfile.info(path).format == ("WAV" if sub == "PCM_16" else "FLAC"), sub
