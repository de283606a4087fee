"""Audio audits end to end: manifests, audio folders and HF Audio columns, real files, real speech,
model configs built locally; seconds against ``soundfile.info``, tokens against direct calls."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile

from lengthscan.cli.main import main
from tests.support import audio_files as af
from tests.support.reference import direct_counts

TRANSCRIPTS = [
    "the quick brown fox jumps over the lazy dog",
    "please call stella",
    "out of memory errors are often a handful of over long samples",
    "",
    "a longer transcript of a longer clip that goes on and on for a while",
]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Real speech from espeak-ng when installed, plus written clips in several formats and rates;
    one clip over 30 s; one corrupt file; one missing file in the manifest."""
    d = tmp_path_factory.mktemp("clips")
    files = []
    for i, text in enumerate(af.SENTENCES):
        speech = af.espeak_wav(d / f"speech{i}.wav", text)
        if speech is not None:
            files.append(speech)
    files += [
        af.write_audio(d / "a.flac", 16000 * 3 + 17, 16000, format="FLAC"),
        af.write_audio(d / "b.wav", 44100 * 2 + 5, 44100, channels=2),
        af.write_audio(d / "c.ogg", 22050 * 4, 22050, format="OGG", subtype="VORBIS"),
        af.write_audio(d / "d.mp3", 48000 * 1, 48000, format="MP3", subtype="MPEG_LAYER_III"),
        af.write_audio(d / "long.wav", 8000 * 31 + 3, 8000),
    ]
    corrupt = af.random_bytes(d / "corrupt.wav")
    return d, files, corrupt


def _manifest(d, files, corrupt, *, relative: bool):
    rows = []
    for i, f in enumerate(files):
        rows.append({"path": f.name if relative else str(f), "transcript": TRANSCRIPTS[i % len(TRANSCRIPTS)]})
    rows.append({"path": corrupt.name if relative else str(corrupt), "transcript": "broken"})
    rows.append({"path": "gone.wav" if relative else str(d / "gone.wav"), "transcript": "missing file"})
    return rows


def test_csv_manifest_seconds_and_target_tokens(tmp_path, clips, bpe_dir):
    d, files, corrupt = clips
    rows = _manifest(d, files, corrupt, relative=False)
    manifest = tmp_path / "manifest.csv"
    with open(manifest, "w", newline="") as fh:
        w = csv.DictWriter(fh, ["path", "transcript"])
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "out"
    assert main(["audit", str(manifest), "--audio", "path", "--target", "transcript", "--tokenizer",
                 str(bpe_dir), "--full", "--out", str(out), "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    n = len(files)
    assert t["input_seconds"][:n] == [soundfile.info(str(f)).duration for f in files]
    # in CSV an empty cell is a missing value (documented): that transcript has no length
    expected = direct_counts(bpe_dir, [r["transcript"] or None for r in rows], "target")
    assert t["target_tokens"] == expected and t["target_flag"][3] == "missing"
    assert t["input_flag"][n:] == ["unreadable", "missing_file"]
    assert t["input_seconds"][n:] == [None, None]
    assert "gone.wav" in t["input_error"][n + 1] and t["input_error"][n]
    report = json.loads((out / "report.json").read_text())
    f = report["splits"][0]["fields"]["input_seconds"]
    assert f["unmeasured"] == 2 and f["flags"] == {"unreadable": 1, "missing_file": 1}
    assert f["max"] == pytest.approx(max(soundfile.info(str(x)).duration for x in files), abs=5e-4)
    assert report["splits"][0]["pair"]["ratio"]["name"] == "target_tokens/input_seconds"


def test_relative_paths_resolve_against_the_manifest(tmp_path, clips):
    d, files, corrupt = clips
    nemo = d / "manifest.jsonl"  # NeMo style, paths relative to the manifest's folder
    with open(nemo, "w") as fh:
        for r in _manifest(d, files, corrupt, relative=True)[:-2]:
            fh.write(json.dumps({"audio_filepath": r["path"], "text": r["transcript"], "duration": 0.0}) + "\n")
    out = tmp_path / "o"
    assert main(["audit", str(nemo), "--audio", "audio_filepath", "--out", str(out), "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    assert t["input_seconds"] == [soundfile.info(str(f)).duration for f in files]
    assert set(t["input_flag"]) == {None}


def test_audio_folder_with_sidecar_transcripts(tmp_path, clips, bpe_dir):
    d, files, _ = clips
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    picked = files[-4:]
    for i, f in enumerate(picked):
        dst = folder / ("sub" if i % 2 else "") / f.name
        shutil.copy(f, dst)
        if i != 1:
            dst.with_suffix(".lab" if i == 2 else ".txt").write_text(TRANSCRIPTS[i] + "\n")
    out = tmp_path / "o"
    assert main(["audit", str(folder), "--audio", "audio", "--target", "text", "--tokenizer", str(bpe_dir),
                 "--out", str(out), "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    ordered = sorted((folder / ("sub" if i % 2 else "") / f.name for i, f in enumerate(picked)), key=str)
    assert t["input_seconds"] == [soundfile.info(str(p)).duration for p in ordered]
    texts = [p.with_suffix(".txt").read_text().strip() if p.with_suffix(".txt").exists() else
             p.with_suffix(".lab").read_text().strip() if p.with_suffix(".lab").exists() else None for p in ordered]
    assert t["target_tokens"] == direct_counts(bpe_dir, texts, "target")
    assert t["target_flag"].count("missing") == 1


def test_hf_audio_column_is_read_undecoded(tmp_path, clips):
    from datasets import Audio, Dataset

    d, files, _ = clips
    embedded = [{"bytes": f.read_bytes(), "path": None} for f in files[-3:]]
    by_path = [{"bytes": None, "path": str(f)} for f in files[:2]]
    ds = Dataset.from_dict({"audio": embedded + by_path}).cast_column("audio", Audio(decode=False))
    ds.save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "o"
    assert main(["audit", str(tmp_path / "ds"), "--audio", "audio", "--out", str(out), "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    assert t["input_seconds"] == [soundfile.info(str(f)).duration for f in files[-3:] + files[:2]]


def _whisper_dir(tmp_path):
    from transformers import WhisperConfig, WhisperFeatureExtractor

    out = tmp_path / "whisper"
    WhisperConfig(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64).save_pretrained(out)
    WhisperFeatureExtractor().save_pretrained(out)
    return out


def _wav2vec2_dir(tmp_path):
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    out = tmp_path / "w2v"
    Wav2Vec2Config().save_pretrained(out)
    Wav2Vec2FeatureExtractor(sampling_rate=16000).save_pretrained(out)
    return out


def test_whisper_model_limits_samples_and_frames(tmp_path, clips):
    from transformers import WhisperFeatureExtractor

    from lengthscan.measure.audio.durations import resampled_length

    d, files, _ = clips
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(f)}) + "\n" for f in files))
    out = tmp_path / "o"
    assert main(["audit", str(manifest), "--audio", "path", "--model", str(_whisper_dir(tmp_path)),
                 "--out", str(out), "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    infos = [soundfile.info(str(f)) for f in files]
    samples = [int(resampled_length(np.asarray([i.frames]), i.samplerate, 16000)[0]) for i in infos]
    assert t["input_samples"] == samples
    assert t["input_frames"] == [s // 160 for s in samples]
    # the extractor's own frame count on a real clip shorter than 30 s, unpadded
    import librosa

    y, _ = librosa.load(str(files[0]), sr=16000)
    feats = WhisperFeatureExtractor()(y, sampling_rate=16000, padding="longest", return_tensors="np")
    assert feats["input_features"].shape[-1] == t["input_frames"][0]
    report = json.loads((out / "report.json").read_text())
    checks = {c["measure"]: c for c in report["splits"][0]["limits"]}
    assert checks["input_seconds"]["limit"] == 30 and checks["input_seconds"]["over_in_measured"] == 1
    assert checks["input_seconds"]["worst_rows"][0]["row"] == len(files) - 1
    assert report["model"]["model_type"] == "whisper"


def test_wav2vec2_conv_frames(tmp_path, clips):
    from lengthscan.measure.audio.durations import conv_frames

    d, files, _ = clips
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(f)}) + "\n" for f in files))
    out = tmp_path / "o"
    assert main(["audit", str(manifest), "--audio", "path", "--model", str(_wav2vec2_dir(tmp_path)),
                 "--out", str(out), "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    expected = conv_frames(np.asarray(t["input_samples"]), (10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2))
    assert t["input_frames"] == expected.tolist()
    assert t["input_frames"][0] == (t["input_samples"][0] - 400) // 320 + 1  # wav2vec2's 25 ms / 20 ms frames


def test_sampling_rate_flag_without_a_model(tmp_path, clips):
    d, files, _ = clips
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(f)}) + "\n" for f in files))
    out = tmp_path / "o"
    assert main(["audit", str(manifest), "--audio", "path", "--sampling-rate", "8000", "--out", str(out),
                 "--quiet"]) == 0
    t = pq.read_table(out / "lengths.parquet").to_pydict()
    assert "input_frames" not in t and len(t["input_samples"]) == len(files)
    assert main(["audit", str(manifest), "--audio", "path", "--input", "path", "--out", str(out)]) == 2


def test_clean_drops_long_audio_or_crops_it(tmp_path, clips):
    from datasets import Audio, Dataset, load_from_disk

    from lengthscan.cli.main import main as cli

    d, files, _ = clips
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(f), "label": i}) + "\n" for i, f in enumerate(files)))
    durations = [soundfile.info(str(f)).duration for f in files]
    out = tmp_path / "drop"
    assert cli(["clean", str(manifest), "--audio", "path", "--limit", "input_seconds<=2.5", "--out", str(out),
                "--quiet"]) == 0
    kept = load_from_disk(str(out / "dataset"))
    assert kept["label"] == [i for i, s in enumerate(durations) if s <= 2.5]
    rejects = load_from_disk(str(out / "rejects"))
    assert set(rejects["reason"]) == {"input_seconds<=2.5"}

    out = tmp_path / "crop"
    assert cli(["clean", str(manifest), "--audio", "path", "--limit", "input_seconds<=2.5", "--crop-audio",
                "--sampling-rate", "16000", "--out", str(out), "--quiet"]) == 0
    kept = load_from_disk(str(out / "dataset"))
    assert kept["label"] == list(range(len(files)))
    for path, original in zip(kept["path"], durations):
        info = soundfile.info(path)
        if original > 2.5:
            assert path.startswith(str(out / "dataset" / "audio")) and info.duration <= 2.5
            assert info.duration > 2.5 - 1 / info.samplerate - 1e-9
        else:
            assert info.duration == original
    lengths = pq.read_table(out / "lengths.parquet").to_pydict()
    assert lengths["decision"].count("truncate") == sum(s > 2.5 for s in durations)

    # audio embedded as bytes in an Audio(decode=False) column stays bytes, cropped
    embedded = Dataset.from_dict({"audio": [{"bytes": f.read_bytes(), "path": f.name} for f in files[-3:]]})
    embedded.cast_column("audio", Audio(decode=False)).save_to_disk(str(tmp_path / "emb"))
    out = tmp_path / "crop-bytes"
    assert cli(["clean", str(tmp_path / "emb"), "--audio", "audio", "--limit", "input_seconds<=2.5",
                "--crop-audio", "--out", str(out), "--quiet"]) == 0
    import io

    kept = load_from_disk(str(out / "dataset")).cast_column("audio", Audio(decode=False))
    for value in kept["audio"]:
        assert soundfile.info(io.BytesIO(value["bytes"])).duration <= 2.5


def test_cropping_clips_that_have_a_transcript_is_refused(tmp_path, bpe_dir, capsys):
    """A 59 s clip cropped to 30 s would keep its whole transcript: refused (exit 2, saying why and
    what to do) in audit and clean, unless the target is a label (--target-is-label)."""
    af.write_audio(tmp_path / "long.wav", 8000 * 59, 8000)
    af.write_audio(tmp_path / "short.wav", 8000 * 2, 8000)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"path": "long.wav", "transcript": "a long talk"}) + "\n"
                        + json.dumps({"path": "short.wav", "transcript": "hi"}) + "\n")
    args = [str(manifest), "--audio", "path", "--target", "transcript", "--tokenizer", str(bpe_dir),
            "--limit", "input_seconds<=30", "--crop-audio", "--quiet"]
    for command in ("audit", "clean"):
        capsys.readouterr()
        assert main([command, *args, "--out", str(tmp_path / command)]) == 2
        err = capsys.readouterr().err
        assert "--target-is-label" in err and "transcript" in err and "Traceback" not in err
        assert not (tmp_path / command).exists()
    assert main(["clean", *args, "--target-is-label", "--out", str(tmp_path / "label")]) == 0
    from datasets import load_from_disk

    kept = load_from_disk(str(tmp_path / "label" / "dataset"))
    assert kept["transcript"] == ["a long talk", "hi"]
    assert soundfile.info(kept["path"][0]).duration == 30.0
    # without --crop-audio, the long clip is dropped with its transcript: no refusal
    assert main(["clean", *args[:-2], "--quiet", "--out", str(tmp_path / "drop")]) == 0
    assert load_from_disk(str(tmp_path / "drop" / "dataset"))["transcript"] == ["hi"]
