"""Export to whisper.cpp's ggml .bin: the header and tensor table read back, and (where pywhispercpp is
available, in this interpreter or in bench/.venv) whisper.cpp itself transcribing JFK with the file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest

from aural.engine.errors import ModelError
from aural.engine.models.export_ggml import GGML_MAGIC, export_ggml, ggml_tensor_name, main, read_ggml
from aural.engine.models.store import model_info

REPO = Path(__file__).resolve().parents[1]
JFK_WORDS = ("and so my fellow americans ask not what your country can do for you "
             "ask what you can do for your country").split()

F32, F16, Q8_0 = 0, 1, 8  # ggml type ids


@pytest.fixture(scope="module")
def exported(tiny_gguf, tmp_path_factory) -> Path:
    return export_ggml(tiny_gguf, tmp_path_factory.mktemp("ggml") / "ggml-tiny.en.bin")


@pytest.fixture(scope="module")
def parsed(exported):
    return read_ggml(exported)


def test_header_matches_the_model(parsed, tiny_gguf):
    info = model_info(tiny_gguf)
    assert parsed.hparams == {k: info[k] for k in parsed.hparams}
    assert parsed.hparams["n_vocab"] == 51864 and parsed.hparams["n_audio_layer"] == 4
    assert (parsed.ftype, parsed.qnt_version) == (1, 0)  # mostly F16


def test_magic_is_ggml(exported):
    assert exported.read_bytes()[:4] == GGML_MAGIC.to_bytes(4, "little") == b"lmgg"


def test_mel_filters_are_the_models_own(parsed, tiny_gguf):
    reader = gguf.GGUFReader(tiny_gguf)
    stored = next(t for t in reader.tensors if t.name == "mel_filters")
    assert parsed.mel_filters.shape == (80, 201)
    np.testing.assert_array_equal(parsed.mel_filters, np.asarray(stored.data).reshape(80, 201))


def test_vocabulary_is_the_text_tokens_as_bytes(parsed):
    # whisper.cpp adds <|endoftext|> and the other specials itself, from n_vocab.
    assert len(parsed.tokens) == 50256
    assert parsed.tokens[0] == b"!"
    assert parsed.tokens[262] == b" the"  # GPT-2 byte-level BPE: 'Ġthe'
    assert parsed.tokens[198] == b"\n"  # 'Ċ' maps back to a newline byte
    assert all(parsed.tokens)


def test_tensor_table_is_what_whisper_cpp_expects(parsed):
    names = [t.name for t in parsed.tensors]
    # whisper_model_load: 7 encoder + 15 per encoder block + 4 decoder + 24 per decoder block.
    assert len(names) == len(set(names)) == 7 + 15 * 4 + 4 + 24 * 4
    t = {x.name: x for x in parsed.tensors}
    assert (t["encoder.conv1.weight"].ggml_type, t["encoder.conv1.weight"].ne) == (F16, (3, 80, 384))
    assert (t["encoder.conv1.bias"].ggml_type, t["encoder.conv1.bias"].ne) == (F32, (1, 384))
    assert (t["encoder.conv2.bias"].ggml_type, t["encoder.conv2.bias"].ne) == (F32, (1, 384))
    assert (t["encoder.positional_embedding"].ggml_type, t["encoder.positional_embedding"].ne) == (F32, (384, 1500))
    assert (t["decoder.positional_embedding"].ggml_type, t["decoder.positional_embedding"].ne) == (F32, (384, 448))
    assert (t["decoder.token_embedding.weight"].ggml_type,
            t["decoder.token_embedding.weight"].ne) == (F16, (384, 51864))
    assert (t["encoder.blocks.0.mlp.0.weight"].ggml_type, t["encoder.blocks.0.mlp.0.weight"].ne) == (F16, (384, 1536))
    assert t["decoder.blocks.3.cross_attn.value.weight"].ggml_type == F16
    for x in parsed.tensors:
        if len(x.ne) == 1:
            assert x.ggml_type == F32, x.name
    # Whisper's key projections have no bias, and whisper.cpp would refuse an unknown tensor.
    assert not [n for n in names if n.endswith("key.bias")]
    assert "decoder.blocks.0.cross_attn_ln.weight" in t and "encoder.ln_post.bias" in t


def test_records_cover_the_whole_file(parsed, exported):
    last = max(parsed.tensors, key=lambda x: x.offset)
    assert last.offset + last.n_bytes == exported.stat().st_size


def test_weights_are_copied_exactly(parsed, exported, tiny_gguf):
    reader = {t.name: t for t in gguf.GGUFReader(tiny_gguf).tensors}
    for ours, theirs in (("dec.tok_emb", "decoder.token_embedding.weight"),
                         ("enc.blk.2.attn.q.weight", "encoder.blocks.2.attn.query.weight"),
                         ("dec.blk.1.cross.out.bias", "decoder.blocks.1.cross_attn.out.bias")):
        np.testing.assert_array_equal(parsed.tensor_data(exported, theirs), np.asarray(reader[ours].data))
    bias = parsed.tensor_data(exported, "encoder.conv2.bias")
    assert bias.shape == (384, 1)
    np.testing.assert_array_equal(bias[:, 0], np.asarray(reader["enc.conv2.bias"].data))


def test_tensor_names():
    assert ggml_tensor_name("enc.blk.0.attn.q.weight") == "encoder.blocks.0.attn.query.weight"
    assert ggml_tensor_name("dec.blk.3.cross_ln.bias") == "decoder.blocks.3.cross_attn_ln.bias"
    assert ggml_tensor_name("dec.blk.2.cross.k.weight") == "decoder.blocks.2.cross_attn.key.weight"
    assert ggml_tensor_name("dec.blk.0.mlp.2.bias") == "decoder.blocks.0.mlp.2.bias"
    assert ggml_tensor_name("enc.pos") == "encoder.positional_embedding"
    with pytest.raises(ModelError):
        ggml_tensor_name("enc.blk.0.attn.rotary.weight")


def test_type_mismatch_is_refused(tiny_gguf, tmp_path):
    # An f16 GGUF cannot become a q8_0 ggml file by copying: the matrices would have the wrong type.
    with pytest.raises(ModelError, match="Q8_0"):
        export_ggml(tiny_gguf, tmp_path / "q8.bin", wtype="q8_0")
    assert not list(tmp_path.iterdir())  # nothing half-written is left behind


def test_f32_export_stores_conv_kernels_as_f32(tmp_path):
    # whisper.cpp's all-F32 models keep the conv kernels in F32 too; Aural's GGUF stores them F16.
    parsed = read_ggml(export_ggml("tiny.en", tmp_path / "f32.bin", wtype="f32"))
    t = {x.name: x for x in parsed.tensors}
    assert parsed.ftype == 0
    assert t["encoder.conv1.weight"].ggml_type == F32
    assert t["decoder.token_embedding.weight"].ggml_type == F32


def test_read_rejects_other_files(tmp_path, exported):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelError, match="magic"):
        read_ggml(bad)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(exported.read_bytes()[:5_000_000])
    with pytest.raises(ModelError, match="truncated"):
        read_ggml(cut)


def test_command_line(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "cli.bin"
    assert main([str(tiny_gguf), str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert read_ggml(out).hparams["n_text_layer"] == 4


# -- whisper.cpp itself ----------------------------------------------------------------------------

_TRANSCRIBE = textwrap.dedent("""
    import json, sys
    from pywhispercpp.model import Model
    model = Model(sys.argv[1], n_threads=2, print_progress=False, print_realtime=False,
                  redirect_whispercpp_logs_to=None)
    print(json.dumps(" ".join(s.text for s in model.transcribe(sys.argv[2]))))
""")


def _whisper_cpp_python() -> str | None:
    """This interpreter if it has pywhispercpp, else bench/.venv's (bench/setup.sh), else None."""
    try:
        import pywhispercpp.model  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    bench = REPO / "bench" / ".venv" / "bin" / "python"
    if bench.exists() and subprocess.run([str(bench), "-c", "import pywhispercpp.model"],
                                         capture_output=True).returncode == 0:
        return str(bench)
    return None


@pytest.mark.slow
def test_whisper_cpp_transcribes_jfk_with_the_export(exported, jfk_wav):
    python = _whisper_cpp_python()
    if python is None:
        pytest.skip("pywhispercpp is not installed here nor in bench/.venv (run bench/setup.sh)")
    proc = subprocess.run([python, "-c", _TRANSCRIBE, str(exported), str(jfk_wav)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = json.loads(proc.stdout.strip().splitlines()[-1])
    assert re.findall(r"[a-z']+", text.lower()) == JFK_WORDS, text
