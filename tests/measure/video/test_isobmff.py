"""MP4 and MOV headers read without decoding (``measure/video/isobmff.py``) against what PyAV
finds by decoding the same real files: frames, coded size, rotation, duration."""

from __future__ import annotations

import os

import pytest

from lengthscan.measure.images.reader import ImageError
from lengthscan.measure.video.headers import video_info, video_info_from
from lengthscan.measure.video.info import VideoError
from tests.support.video import decoded, make_clip

pytest.importorskip("av")

CLIPS = {
    "h264-30": dict(suffix="mp4", codec="libx264", rate=30, frames=45, size=(320, 240)),
    "h264-29.97-odd-rotated": dict(suffix="mp4", codec="libx264", rate="30000/1001", frames=50, size=(322, 182),
                                   rotation=90),
    "mov-mpeg4-25": dict(suffix="mov", codec="mpeg4", rate=25, frames=30, size=(176, 144)),
    "hevc-rotated-270": dict(suffix="mp4", codec="hevc", rate=30, frames=20, size=(128, 72), rotation=-90),
    "h264-180": dict(suffix="mp4", codec="libx264", rate=24, frames=20, size=(128, 72), rotation=180),
    "fragmented": dict(suffix="mp4", codec="libx264", rate=24, frames=100, size=(160, 96),
                       options={"movflags": "frag_keyframe+empty_moov"}),
    "variable-rate": dict(suffix="mp4", codec="libx264", rate=30, frames=40, size=(96, 64),
                          pts_ms=[i * 33 + (i % 3) * 11 for i in range(40)]),
}


def _clip(tmp_path, name):
    spec = dict(CLIPS[name])
    suffix, rate = spec.pop("suffix"), spec.pop("rate")
    if isinstance(rate, str):
        from fractions import Fraction

        rate = Fraction(rate)
    return make_clip(tmp_path / f"{name}.{suffix}", rate=rate, **spec)


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_headers_give_what_decoding_finds(tmp_path, name):
    path = _clip(tmp_path, name)
    info, truth = video_info_from(path), decoded(path)
    assert info.frames == truth["frames"]
    assert (info.width, info.height, info.rotation) == (truth["width"], truth["height"], truth["rotation"])
    assert info.duration == pytest.approx(truth["duration"], abs=1e-9)
    assert info.fps == pytest.approx(info.frames / info.duration)
    assert info.container == ("mov" if name.startswith("mov") else "mp4")
    assert info.oriented() == ((info.height, info.width) if info.rotation in (90, 270) else (info.width, info.height))
    assert video_info(path.read_bytes()) == info


def test_bad_files_are_errors_naming_the_problem(tmp_path):
    good = _clip(tmp_path, "h264-30").read_bytes()
    with pytest.raises(VideoError, match="not a video container"):
        video_info(os.urandom(4096))
    moov_last = good  # PyAV writes the description after the frames: cut, the description is gone
    with pytest.raises(VideoError, match="no moov box"):
        video_info(moov_last[: len(moov_last) // 2])
    faststart = make_clip(tmp_path / "fast.mp4", frames=60, options={"movflags": "faststart"}).read_bytes()
    with pytest.raises(VideoError, match="cut short"):
        video_info(faststart[: len(faststart) // 3])
    huge = bytearray(good)
    at = huge.find(b"moov") - 4
    huge[at:at + 4] = (0x7FFFFFF0).to_bytes(4, "big")  # a moov box of 2 GB in a file of a few KB
    with pytest.raises(VideoError, match="past the file"):
        video_info(bytes(huge))
    audio_only = bytearray(good)
    at = audio_only.find(b"hdlr") + 12  # the handler type, after version, flags and pre_defined
    assert audio_only[at:at + 4] == b"vide"
    audio_only[at:at + 4] = b"soun"
    with pytest.raises(VideoError, match="no video track"):
        video_info(bytes(audio_only))


def test_a_fifo_is_refused_unread(tmp_path):
    fifo = tmp_path / "clip.mp4"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match="FIFO"):
        video_info_from(fifo)
