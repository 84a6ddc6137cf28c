"""Random-weight Qwen3-ASR checkpoints in the layout of Qwen/Qwen3-ASR-0.6B, built with Qwen's own classes.

The shapes: `0.6b` is the released model's (values from public ports of it, README.md), `tiny` keeps its
architecture, head sizes and special ids with a few small layers. The weights are random (randomize), stored
as the release stores them: bf16 safetensors with the tied lm_head written out beside the embedding.

The tokenizer is synthetic (Qwen's vocab.json and merges.txt are not on this machine): tokenizer.py.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import GenerationConfig, WhisperFeatureExtractor

import official
import tokenizer

# ref: modeling_qwen3_asr.py Qwen3ASRForConditionalGeneration.generate's default eos_token_id.
EOS_IDS = [tokenizer.IM_END, tokenizer.ENDOFTEXT]

# n_window 50 (chunks of 100 mel frames) is the only value the audio tower works with: its
# _get_feat_extract_output_lengths hard-codes 100-frame chunks of 13 outputs, while the package's config default
# is 100 (200-frame chunks), with which the tower fails. n_window_infer 800 (attention windows of 8 chunks, 104
# outputs) is the release's, not the package's default 400.
_AUDIO_0_6B = dict(num_mel_bins=128, encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584,
                   d_model=896, output_dim=1024, downsample_hidden_size=480, n_window=50, n_window_infer=800,
                   max_source_positions=1500, conv_chunksize=500, activation_function="gelu",
                   scale_embedding=False)
# Interleaved MRoPE with the sections of 64 = head_dim / 2 rotary pairs; the three position streams are equal
# in a transcription prompt, so it is plain RoPE in effect. max_position_embeddings is not known here; the
# default rope_type never reads it.
_ROPE = {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True, "mrope_interleaved": True}
_TEXT_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                  max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=_ROPE,
                  tie_word_embeddings=True, attention_bias=False)
# tiny keeps the head sizes (audio 64, text 128: the kernels a port picks by head size, and mrope_section
# unchanged), GQA 2:1, the chunking and the whole vocabulary (so the special ids are the real ones).
SHAPES = {
    "0.6b": (_AUDIO_0_6B, _TEXT_0_6B),
    "tiny": ({**_AUDIO_0_6B, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 256,
              "d_model": 128, "output_dim": 64, "downsample_hidden_size": 32},
             {**_TEXT_0_6B, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}),
}
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def feature_extractor() -> WhisperFeatureExtractor:
    """The front end the processor names: Whisper's log-mel, 128 bins, 25 ms windows every 10 ms."""
    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400,
                                   chunk_length=30, padding_value=0.0, return_attention_mask=True)


def config(shape: str):
    """The official config class filled in as the release's config.json is."""
    classes = official.load()
    audio, text = SHAPES[shape]
    cfg = classes.Qwen3ASRConfig(
        thinker_config=dict(audio_config=audio, text_config=text, audio_token_id=tokenizer.AUDIO_PAD,
                            audio_start_token_id=tokenizer.AUDIO_START, audio_end_token_id=tokenizer.AUDIO_END,
                            user_token_id=tokenizer.WORDS["user"]),
        support_languages=_support_languages())
    cfg.architectures = ["Qwen3ASRForConditionalGeneration"]
    return cfg


def _support_languages() -> list[str]:
    """The package's SUPPORTED_LANGUAGES, read from its source: importing inference/utils.py needs librosa."""
    tree = ast.parse((official.package_dir() / "inference" / "utils.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "SUPPORTED_LANGUAGES":
            return ast.literal_eval(node.value)
    raise RuntimeError("qwen_asr/inference/utils.py has no SUPPORTED_LANGUAGES")


@torch.no_grad()
def randomize(model: nn.Module, seed: int) -> None:
    """Weights under which every stage matters and greedy decoding does not settle on one token (HF's std-0.02
    init makes the logits nearly constant). Matrices N(0, gain^2 / fan_in), gain 2 for the three convolutions
    (each GELU about halves the scale; at gain 1 the stem's output is a tenth of the positional embedding added
    to it); biases N(0, 0.1^2); the embedding N(0, 1 / hidden), rows of about unit norm, small beside the
    layers' outputs as in a trained model (at unit scale per value the tied lm_head mostly repeats the input
    token); norm gains g (1 + N(0, 0.1^2)) with g 8 for the text model's final norm (logits of std ~8, greedy
    choices clear of rounding) and 3 for q_norm and k_norm (attention logits of std ~9, peaked as trained
    models' are: at 1 each token attends to a blur of the prompt and the decoding repeats one token), else 1.
    A tied parameter is drawn once."""
    classes = official.load()
    thinker = model.thinker
    norms = (nn.LayerNorm, classes.modeling.Qwen3ASRTextRMSNorm, classes.modeling.Qwen3ASRThinkerTextRMSNorm)
    tower, text = thinker.audio_tower, thinker.model
    gain = {tower.conv2d1: 2.0, tower.conv2d2: 2.0, tower.conv2d3: 2.0, text.norm: 8.0}
    for layer in text.layers:
        gain.update({layer.self_attn.q_norm: 3.0, layer.self_attn.k_norm: 3.0})
    gen = torch.Generator().manual_seed(seed)

    def normal(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    for module in model.modules():
        g = gain.get(module, 1.0)
        if isinstance(module, norms):
            normal(module.weight, 0.1 * g, g)
            if getattr(module, "bias", None) is not None:
                normal(module.bias, 0.1)
        elif isinstance(module, nn.Embedding):
            normal(module.weight, module.weight.shape[1] ** -0.5)
        elif isinstance(module, (nn.Linear, nn.Conv2d)) and module.weight is not text.embed_tokens.weight:
            normal(module.weight, g * module.weight[0].numel() ** -0.5)  # fan_in: in_features (x kernel area)
            if module.bias is not None:
                normal(module.bias, 0.1)


def make(out: Path, shape: str, seed: int, dtype: str) -> dict[str, tuple[int, ...]]:
    """Writes the checkpoint; returns its tensors' names and shapes."""
    classes = official.load()
    cfg = config(shape)
    cfg.dtype = DTYPES[dtype]
    model = classes.Qwen3ASRForConditionalGeneration(cfg).eval()
    randomize(model, seed)
    out.mkdir(parents=True, exist_ok=True)
    # The release stores thinker.lm_head.weight although it is tied; save_pretrained would drop it, and
    # safetensors refuses two names on one storage, hence the clone.
    tensors = {name: t.detach().to(DTYPES[dtype]).contiguous().clone() for name, t in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out)
    GenerationConfig(do_sample=False, eos_token_id=EOS_IDS, pad_token_id=tokenizer.ENDOFTEXT).save_pretrained(out)
    fe = feature_extractor()
    fe._set_processor_class("Qwen3ASRProcessor")
    fe.save_pretrained(out)
    tokenizer.write(out)
    return {name: tuple(t.shape) for name, t in tensors.items()}


def describe(out: Path) -> str:
    """config.json's thinker_config, for the log."""
    thinker = json.loads((out / "config.json").read_text())["thinker_config"]
    keys = ("encoder_layers", "d_model", "encoder_attention_heads", "encoder_ffn_dim", "output_dim",
            "downsample_hidden_size", "n_window", "n_window_infer")
    text_keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "vocab_size")
    audio = ", ".join(f"{k}={thinker['audio_config'][k]}" for k in keys)
    text = ", ".join(f"{k}={thinker['text_config'][k]}" for k in text_keys)
    return f"audio: {audio}\ntext: {text}"
