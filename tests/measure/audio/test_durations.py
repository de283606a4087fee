"""lengthscan.measure.audio.durations on real files: soundfile-written formats, espeak-ng speech, broken files,
scipy's odd WAVs; lengths checked against soundfile decoding, librosa.resample and transformers."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from lengthscan.measure.audio.durations import (
    AudioInfo,
    FrameRule,
    conv_frames,
    frame_rule,
    mel_frames,
    read_info,
    read_infos,
    resampled_length,
)
from tests.support import audio_files as af

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# librosa.load imports audioread, which imports stdlib modules deprecated in Python 3.13
pytestmark = pytest.mark.filterwarnings("ignore:'(aifc|audioop|sunau)' is deprecated:DeprecationWarning")


def decoded_length(path) -> int:
    import soundfile

    return len(soundfile.read(str(path), dtype="int16", always_2d=True)[0])


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    return af.write_format_matrix(tmp_path_factory.mktemp("formats"))


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """Real speech: a few sentences synthesised by espeak-ng (apt-get install espeak-ng)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (apt-get install -y espeak-ng): no real speech fixture")
    directory = tmp_path_factory.mktemp("speech")
    return [af.espeak_wav(directory / f"s{i}.wav", text) for i, text in enumerate(af.SENTENCES)]


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    good_wav = af.write_audio(d / "good.wav", 48000, 16000, 2)
    good_flac = af.write_audio(d / "good.flac", 48000, 16000, format="FLAC")
    good_mp3 = af.write_audio(d / "good.mp3", 48000, 16000, 2, format="MP3", subtype="MPEG_LAYER_III")
    return {
        "good_wav": good_wav,
        "missing": d / "nope.wav",
        "corrupt": af.random_bytes(d / "corrupt.wav"),
        "truncated_wav": af.truncate(good_wav, d / "half.wav"),
        "truncated_flac": af.truncate(good_flac, d / "half.flac"),
        "truncated_mp3": af.truncate(good_mp3, d / "half.mp3"),
        "header_only_wav": af.truncate(good_wav, d / "header.wav", 44 / good_wav.stat().st_size),
        "empty": af.empty_wav(d / "empty.wav"),
        "raw": af.raw_pcm(d / "speech.raw"),
        "midi": af.midi_file(d / "tune.mid"),
        "zero_bytes": af.truncate(good_wav, d / "zero.wav", 0.0),
        "directory": d,
    }


# -- formats: header lengths equal soundfile's, on paths, bytes and dicts -----------------------
def test_every_format_matches_soundfile_and_decoding(matrix):
    import soundfile

    assert len(matrix) == len(af.FORMATS) * len(af.RATES) * 2
    for path in matrix:
        ref = soundfile.info(str(path))
        info = read_info(str(path))
        assert info == AudioInfo(ref.frames, ref.samplerate, ref.channels, ref.format, ref.subtype), path
        assert info.seconds == ref.duration
        # the finding the module relies on: for these formats the header is the decoded length
        assert info.frames == decoded_length(path), path


def test_bytes_and_dicts_give_the_same_info(matrix):
    for path in matrix[::3]:
        by_path = read_info(str(path))
        data = path.read_bytes()
        assert read_info(data) == by_path
        assert read_info(bytearray(data)) == by_path
        assert read_info({"bytes": data, "path": None}) == by_path
        assert read_info({"bytes": None, "path": str(path)}) == by_path
        assert read_info({"bytes": data, "path": "/no/such/file.wav"}) == by_path  # bytes win
        assert read_info(path) == by_path  # os.PathLike


def test_relative_paths_resolve_against_base_dir(matrix, tmp_path, monkeypatch):
    path = matrix[0]
    expected = read_info(str(path))
    assert read_info(path.name, base_dir=str(path.parent)) == expected
    assert read_info({"bytes": None, "path": path.name}, base_dir=str(path.parent)) == expected
    assert read_info(str(path), base_dir=str(tmp_path)) == expected  # absolute paths ignore base_dir
    assert read_info(path.name, base_dir=str(tmp_path)).flag == "missing_file"
    monkeypatch.chdir(path.parent)
    assert read_info(path.name) == expected


def test_read_infos_keeps_order_and_results(matrix, bad):
    sources = [str(p) for p in matrix] + [str(p) for p in bad.values()] + [None, matrix[1].read_bytes()]
    plain = [read_info(s) for s in sources]
    assert read_infos(sources, threads=1) == plain
    assert read_infos(sources, threads=8) == plain
    assert read_infos([], threads=8) == []
    with pytest.raises(TypeError, match="int"):
        read_infos([str(matrix[0]), 3], threads=8)


# -- real speech --------------------------------------------------------------------------------
def test_speech_durations(speech):
    import soundfile

    for path in speech:
        info = read_info(str(path))
        ref = soundfile.info(str(path))
        assert (info.frames, info.samplerate, info.channels) == (ref.frames, ref.samplerate, ref.channels)
        assert info.frames == decoded_length(path)
        assert info.flag is None and not info.decoded
        assert 1.0 < info.seconds < 15.0


# -- bad files: a flag and a reason, never an exception ----------------------------------------
def test_missing_file(bad):
    info = read_info(str(bad["missing"]))
    assert (info.flag, info.frames, info.seconds) == ("missing_file", None, None)
    assert str(bad["missing"]) in info.error


def test_corrupt_file_reports_libsndfiles_message(bad):
    info = read_info(str(bad["corrupt"]))
    assert info.flag == "unreadable" and info.frames is None
    assert "Format not recognised" in info.error


def test_truncated_wav_measures_the_frames_present(bad):
    info = read_info(str(bad["truncated_wav"]))
    # libsndfile clips the data chunk to the file and says so in its log ("should be ...")
    assert info.frames == decoded_length(bad["truncated_wav"]) < 48000
    assert info.flag == "truncated" and not info.decoded
    assert "should be" in info.error and "192000" in info.error
    header_only = read_info(str(bad["header_only_wav"]))
    assert (header_only.flag, header_only.frames) == ("empty", 0)
    assert "should be" in header_only.error


def test_truncated_mp3_is_decoded(bad):
    import soundfile

    path = bad["truncated_mp3"]
    assert soundfile.info(str(path)).frames == 48000  # the tag still claims the whole file
    info = read_info(str(path))
    assert info.decoded and info.flag == "truncated"
    assert info.frames == decoded_length(path) < 48000
    assert "48000" in info.error
    assert read_info(path.read_bytes()) == info
    assert read_info(str(bad["good_wav"].with_name("good.mp3"))) == AudioInfo(48000, 16000, 2, "MP3", "MPEG_LAYER_III")


def test_truncated_flac_is_unreadable(bad):
    import soundfile

    assert soundfile.info(str(bad["truncated_flac"])).frames == 48000  # opens; STREAMINFO claims all
    info = read_info(str(bad["truncated_flac"]))
    assert info.flag == "unreadable" and info.frames is None
    assert "lost sync" in info.error or "psf_fseek" in info.error
    assert "48000" in info.error


def test_zero_length_audio_is_measured_and_flagged_empty(bad):
    info = read_info(str(bad["empty"]))
    assert (info.flag, info.frames, info.seconds, info.samplerate, info.error) == ("empty", 0, 0.0, 16000, None)


@pytest.mark.parametrize(
    "name, words",
    [("raw", "RAW"), ("midi", "Format not recognised"), ("zero_bytes", "recognised"),
     ("directory", "not a regular file")],
)
def test_unreadable_sources(bad, name, words):
    info = read_info(str(bad[name]))
    assert info.flag == "unreadable" and info.frames is None
    assert words in info.error


def test_raw_bytes_and_empty_values(bad):
    assert read_info(bad["raw"].read_bytes()).flag == "unreadable"
    assert read_info(b"").flag == "unreadable"
    assert read_info(None).flag == "missing"
    assert read_info({"bytes": None, "path": None}).flag == "missing"


@pytest.mark.parametrize("value", [3, 2.5, ["a.wav"], {"array": [0.0], "sampling_rate": 16000}])
def test_wrong_types_raise_type_error(value):
    with pytest.raises(TypeError, match=type(value).__name__):
        read_info(value)


def test_scipy_odd_wavs_never_raise():
    import soundfile

    paths = af.scipy_test_wavs()
    assert len(paths) >= 10
    flags = set()
    for path in paths:
        info = read_info(str(path))
        flags.add(info.flag)
        try:
            ref = soundfile.info(str(path))
        except Exception:
            assert info.flag == "unreadable" and info.error, path
            continue
        assert info.frames == ref.frames == decoded_length(path), path
    assert "unreadable" in flags and None in flags  # libsndfile rejects some (36/64-bit), reads most


# -- MP3 without a Xing/Info tag: libsndfile only estimates ------------------------------------
@pytest.fixture(scope="module")
def untagged(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp3")
    out = {}
    for rate in (16000, 44100):
        for mode in ("CONSTANT", "VARIABLE"):
            src = af.write_audio(d / f"{rate}-{mode}.mp3", 48000, rate, format="MP3", subtype="MPEG_LAYER_III",
                                 compression_level=0.5, bitrate_mode=mode)
            out[rate, mode] = af.strip_mp3_tag(src, d / f"{rate}-{mode}-untagged.mp3")
    return out


def test_untagged_mp3_counts_mpeg_frames(untagged):
    import soundfile

    for rate in (16000, 44100):
        cbr, vbr = read_info(str(untagged[rate, "CONSTANT"])), read_info(str(untagged[rate, "VARIABLE"]))
        # CBR: libsndfile decodes every frame, so its decoded length is the reference
        assert cbr.decoded and cbr.frames == decoded_length(untagged[rate, "CONSTANT"])
        # VBR: same audio, so the same number of MPEG frames; libsndfile's estimate falls far short
        assert vbr.decoded and vbr.frames == cbr.frames
        assert soundfile.info(str(untagged[rate, "VARIABLE"])).frames < vbr.frames
        assert read_info(untagged[rate, "VARIABLE"].read_bytes()) == vbr


def test_untagged_mp3_frames_are_walked_in_bounded_memory(untagged, tmp_path):
    """The frames of an untagged MP3 file are walked a window at a time: the same count as the walk
    of its bytes whatever the window, and a file of 32 MB never read whole (it was: any size)."""
    import tracemalloc

    from lengthscan.measure.audio.mpeg import mpeg_start, untagged_mp3_samples, walk_file

    for path in untagged.values():
        blob = path.read_bytes() + b"TAG" + bytes(125)  # an ID3v1 tag after the frames ends the walk
        (tmp_path / "t.mp3").write_bytes(blob)
        expected = untagged_mp3_samples(blob, None)
        assert expected and untagged_mp3_samples(None, str(tmp_path / "t.mp3")) == expected
        for window in (1, 7, 417, 4096):
            assert walk_file(str(tmp_path / "t.mp3"), mpeg_start(blob), window) == expected
    start = mpeg_start(blob := untagged[16000, "CONSTANT"].read_bytes())
    frames = blob[start:]
    big = tmp_path / "big.mp3"
    with open(big, "wb") as fh:
        fh.write(blob[:start])
        for _ in range((32 << 20) // len(frames)):
            fh.write(frames)
    tracemalloc.start()
    try:
        samples = untagged_mp3_samples(None, str(big))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert samples == untagged_mp3_samples(frames, None) * ((32 << 20) // len(frames))
    assert peak < 16 << 20, peak


def test_untagged_mp3_matches_mpg123(untagged, tmp_path):
    import subprocess

    import soundfile

    if shutil.which("mpg123") is None:
        pytest.skip("mpg123 not installed (apt-get install -y mpg123): no second decoder to compare with")
    for key, path in untagged.items():
        out = tmp_path / f"{key[0]}-{key[1]}.wav"
        subprocess.run(["mpg123", "-q", "-w", str(out), str(path)], check=True, capture_output=True)
        assert read_info(str(path)).frames == soundfile.info(str(out)).frames, key


# -- resampling: librosa.resample's output length ----------------------------------------------
def test_resampled_length_matches_librosa():
    import librosa

    rates = (8000, 11025, 16000, 22050, 44100, 48000)
    lengths = (0, 1, 2, 3, 147, 160, 441, 999, 12345, 16001)
    for orig in rates:
        for target in (8000, 16000, 22050, 24000, 48000):
            expected = [len(librosa.resample(np.zeros(n, np.float32), orig_sr=orig, target_sr=target)) for n in lengths]
            assert resampled_length(np.array(lengths), orig, target).tolist() == expected, (orig, target)
    # float rounding, as librosa does it: exact ceil(147 * 48000 / 44100) would be 160
    assert resampled_length(np.array([147]), 44100, 48000).tolist() == [161]
    assert len(librosa.resample(np.zeros(147, np.float32), orig_sr=44100, target_sr=48000)) == 161


def test_resampled_length_per_row_rates():
    frames, rates = np.array([16000, 22050, 44100, 0]), np.array([16000, 22050, 44100, 8000])
    out = resampled_length(frames, rates, 16000)
    assert out.dtype == np.int64 and out.tolist() == [16000, 16000, 16000, 0]


def test_speech_resampled_by_librosa_load(speech):
    import librosa

    for path in speech[:2]:
        info = read_info(str(path))
        y, _ = librosa.load(str(path), sr=16000)
        assert resampled_length(np.array([info.frames]), info.samplerate, 16000)[0] == len(y)


# -- model frames -------------------------------------------------------------------------------
def transformers_conv_lengths(n: int, kernels, strides) -> int:
    """transformers' _get_feat_extract_output_lengths, line for line, on a Python int."""
    for k, s in zip(kernels, strides):
        n = (n - k) // s + 1
    return n


def test_conv_frames_formula():
    kernels, strides = (10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2)
    lengths = np.concatenate([np.arange(0, 2000), [16000, 16001, 48000, 160000, 480000, 10**9]])
    expected = [max(transformers_conv_lengths(int(n), kernels, strides), 0) for n in lengths]
    assert conv_frames(lengths, kernels, strides).tolist() == expected
    assert conv_frames(np.array([16000]), kernels, strides).tolist() == [49]  # 20 ms frames
    with pytest.raises(ValueError):
        conv_frames(np.array([1]), (1, 2), (1,))


def test_conv_frames_equal_wav2vec2_model():
    torch = pytest.importorskip("torch")
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    lengths = np.concatenate([np.arange(0, 3000), [16000, 16001, 123457, 480000]])
    for add_adapter in (False, True):
        config = Wav2Vec2Config(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                                conv_dim=(8,) * 7, num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
                                add_adapter=add_adapter, output_hidden_size=8,
                                num_adapter_layers=3, adapter_stride=2)
        model = Wav2Vec2Model(config)
        expected = model._get_feat_extract_output_lengths(torch.tensor(lengths)).clamp(min=0).numpy()
        rule = frame_rule(config=config)
        assert rule.frames(lengths).tolist() == expected.tolist(), add_adapter


def test_mel_frames_equal_whisper_extractor(speech):
    import librosa
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor()
    clips = [librosa.load(str(p), sr=16000)[0] for p in speech]
    # (the torch STFT needs more than n_fft // 2 = 200 samples, numpy's at least one hop)
    clips += [af.signal(n, 16000)[:, 0] for n in (201, 319, 320, 479, 480, 16037, 160 * 1234 + 159)]
    for y in clips:
        feats = fe(y, sampling_rate=16000, padding="longest", truncation=False, return_tensors="np")["input_features"]
        assert feats.shape[-1] == mel_frames(np.array([len(y)]), 160)[0], len(y)
    # what the extractor does by default: every clip padded (or cut) to 30 s = 3000 frames
    default = fe(clips[0], sampling_rate=16000, return_tensors="np")["input_features"]
    assert default.shape[-1] == frame_rule(feature_extractor=fe).max_frames == 3000


def test_frame_rule_from_local_objects():
    from transformers import (
        BertConfig,
        HubertConfig,
        MambaConfig,
        Wav2Vec2Config,
        Wav2Vec2FeatureExtractor,
        WavLMConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
    )

    default_kernels, default_strides = (10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2)
    w2v = frame_rule(config=Wav2Vec2Config())
    assert (w2v.kind, w2v.sampling_rate, w2v.kernels, w2v.strides) == ("conv", 16000, default_kernels, default_strides)
    assert "Wav2Vec2Config" in w2v.origin and w2v.max_frames is None
    rule = frame_rule(feature_extractor=Wav2Vec2FeatureExtractor(sampling_rate=8000), config=Wav2Vec2Config())
    assert rule.sampling_rate == 8000
    adapter = frame_rule(config=Wav2Vec2Config(add_adapter=True))
    assert adapter.kernels == default_kernels + (1, 1, 1) and adapter.strides == default_strides + (2, 2, 2)
    assert "adapter" in adapter.origin
    for config in (HubertConfig(), WavLMConfig()):
        assert frame_rule(config=config).kernels == default_kernels

    whisper = frame_rule(feature_extractor=WhisperFeatureExtractor())
    assert whisper == FrameRule("mel", 16000, hop_length=160, max_seconds=30.0, origin=whisper.origin)
    assert whisper.max_frames == 3000 and whisper.frames(np.array([16000])).tolist() == [100]
    from_config = frame_rule(config=WhisperConfig())
    assert (from_config.kind, from_config.hop_length, from_config.sampling_rate, from_config.max_seconds) == (
        "mel", 160, 16000, 30.0)
    both = frame_rule(feature_extractor=WhisperFeatureExtractor(hop_length=320), config=WhisperConfig())
    assert both.hop_length == 320

    assert frame_rule(feature_extractor=Wav2Vec2FeatureExtractor()) is None  # no conv stack known
    assert frame_rule(config=BertConfig()) is None
    assert frame_rule(config=MambaConfig()) is None  # conv_kernel is an int there, not a feature encoder
    assert frame_rule() is None


def test_seconds_to_whisper_frames_end_to_end(speech):
    """header seconds -> librosa samples at 16 kHz -> mel frames == the extractor's real output."""
    import librosa
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor()
    rule = frame_rule(feature_extractor=fe)
    infos = read_infos([str(p) for p in speech])
    samples = resampled_length(np.array([i.frames for i in infos]), np.array([i.samplerate for i in infos]),
                               rule.sampling_rate)
    for path, frames in zip(speech, rule.frames(samples)):
        y, _ = librosa.load(str(path), sr=rule.sampling_rate)
        feats = fe(y, sampling_rate=16000, padding="longest", truncation=False, return_tensors="np")["input_features"]
        assert feats.shape[-1] == frames


def test_an_audio_url_is_named_without_its_credentials_or_query():
    info = read_info("https://alice7q:s3cr3tPW@host/clips/a.wav?X-Amz-Signature=SIGdeadbeef")
    assert info.error.startswith("a URL, not a local file: https://***@host/clips/a.wav (")
    assert not any(s in info.error for s in ("alice7q", "s3cr3tPW", "SIGdeadbeef"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("threads", [1, 4])
def test_special_files_are_per_row_reasons_never_opened(tmp_path, threads):
    """A FIFO, socket, folder or device named where audio was expected is flagged unreadable, naming
    what it is, without being opened (a FIFO nobody writes to would block for ever); a broken link
    is a missing file. Run in a thread: a regression fails here instead of hanging the suite."""
    import socket
    import threading

    af.write_audio(tmp_path / "ok.wav", 1600, 16000)
    os.mkfifo(tmp_path / "pipe.wav")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.wav"))
    (tmp_path / "dir.wav").mkdir()
    os.symlink(tmp_path / "gone.wav", tmp_path / "broken.wav")
    names = {"ok.wav": None, "pipe.wav": "a FIFO", "sock.wav": "a socket", "dir.wav": "a directory",
             "broken.wav": None}
    if os.path.exists("/dev/zero"):
        os.symlink("/dev/zero", tmp_path / "zero.wav")
        names["zero.wav"] = "a character device"
    box = {}
    thread = threading.Thread(target=lambda: box.update(infos=read_infos(list(names), base_dir=str(tmp_path),
                                                                         threads=threads)), daemon=True)
    thread.start()
    thread.join(30)
    sock.close()
    assert not thread.is_alive(), "blocked: a special file was opened"
    infos = dict(zip(names, box["infos"]))
    assert infos["ok.wav"].frames == 1600 and infos["ok.wav"].flag is None
    assert infos["broken.wav"].flag == "missing_file" and str(tmp_path / "broken.wav") in infos["broken.wav"].error
    for name, what in names.items():
        if what is not None:
            assert infos[name].flag == "unreadable" and infos[name].seconds is None
            assert infos[name].error == f"not a regular file ({what}): {tmp_path / name}"
