"""A synthetic Qwen2 byte-level BPE tokenizer with Qwen3-ASR's special tokens at their real ids.

Qwen's vocab.json (151,643 entries) and merges.txt are not on this machine, so these files keep the real one's
layout and the ids that matter, and fill the rest:
- ids 0-255: the 256 byte tokens in GPT-2's byte-to-unicode order, as in Qwen2's vocabulary ("Ċ" = 198, "Ġ" = 220);
- the words of the transcription prompt at their real ids (WORDS), reached by chains of merges whose
  intermediate tokens take free ids;
- every other id below 151,643 a filler "[id]" that no merge produces;
- tokenizer_config.json's added_tokens_decoder: 151,643-151,704 without a gap, as HF assigns added ids.
Sources of the ids: the ChatML and Qwen3 specials (151643-151668) are Qwen3's; <|audio_start|>, <|audio_end|>,
<|audio_pad|> and <asr_text> are Qwen3-ASR's as public ports of the release read them (its config.json holds
audio_token_id 151676 and audio_start_token_id 151669; the package's config defaults, 151646 and 151647, are
Qwen2-Audio's and not what the release uses); the words' ids are Qwen2's. The names of 151671-151675 and
151677-151703 are not known here: "<|reserved_ID|>".
"""

from __future__ import annotations

import json
from pathlib import Path

ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
AUDIO_START, AUDIO_END, AUDIO_PAD, ASR_TEXT = 151669, 151670, 151676, 151704
N_VOCAB = 151643  # vocab.json's entries; the model's vocab_size (151936) leaves the ids after the added ones unused
WORDS = {"user": 872, "ĠEnglish": 6364, "system": 8948, "language": 11528, "assistant": 77091}

_QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
_QWEN3_TEXT = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
_ASR = {AUDIO_START: "<|audio_start|>", AUDIO_END: "<|audio_end|>", AUDIO_PAD: "<|audio_pad|>"}

# What the official code renders for Qwen3ASRModel._build_messages (inference/qwen3_asr.py): a system turn with
# the context, a user turn whose one part is the audio, then the assistant's turn. The release's own template
# is not here; this one gives the prompt public ports of the release document.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' -%}{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def byte_alphabet() -> list[str]:
    """The 256 byte tokens in id order (GPT-2's bytes_to_unicode: printable bytes as themselves, first)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]


def _added() -> dict[int, tuple[str, bool]]:
    """id -> (content, special)."""
    added = {ENDOFTEXT + i: (t, True) for i, t in enumerate(_QWEN3_SPECIAL)}
    added.update({ENDOFTEXT + len(_QWEN3_SPECIAL) + i: (t, False) for i, t in enumerate(_QWEN3_TEXT)})
    for i in range(AUDIO_START, ASR_TEXT):
        added[i] = (_ASR.get(i, f"<|reserved_{i}|>"), True)
    added[ASR_TEXT] = ("<asr_text>", False)  # not special: decoding with skip_special_tokens keeps it for the parser
    return added


def write(out: Path) -> None:
    """vocab.json, merges.txt, tokenizer_config.json and chat_template.json."""
    vocab = {t: i for i, t in enumerate(byte_alphabet())}
    merges = []
    free = (i for i in range(256, N_VOCAB) if i not in WORDS.values())
    for word, word_id in WORDS.items():
        for end in range(2, len(word) + 1):
            merges.append(f"{word[:end - 1]} {word[end - 1]}")
            vocab[word[:end]] = word_id if end == len(word) else next(free)
    for i in free:
        vocab[f"[{i}]"] = i
    assert sorted(vocab.values()) == list(range(N_VOCAB))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges), encoding="utf-8")
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": special} for i, (t, special) in sorted(_added().items())}
    config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        # Qwen3ASRProcessor reads these three from the tokenizer (processing_qwen3_asr.py __init__).
        "extra_special_tokens": {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                                 "audio_eos_token": "<|audio_end|>"},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2))
