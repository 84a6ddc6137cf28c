"""WhisperTokenizer on the real tiny.en vocabulary (from the GGUF) and on a tiny multilingual one."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from aural.engine.models import store as models
from aural.engine.text.tokenizer import LANGUAGES, WhisperTokenizer, normalize_language


@pytest.fixture(scope="module")
def info(tiny_gguf):
    return models.model_info(tiny_gguf)


@pytest.fixture(scope="module")
def tok(info):
    return WhisperTokenizer.from_gguf_json(info["tokenizer_json"], multilingual=info["multilingual"])


@pytest.mark.parametrize("text", [
    " And so my fellow Americans, ask not what your country can do for you.",
    " naïve café — 1813, 42% (really?)",
    " 広州市房地产中介协会分析",
    "no leading space",
])
def test_round_trip(tok, text):
    tokens = tok.encode(text)
    assert tokens and all(t < tok.eot for t in tokens)
    assert tok.decode(tokens) == text


def test_encode_adds_no_special_tokens(tok):
    # tokenizer.json's post-processor would wrap the text in <|startoftranscript|>...<|endoftext|>.
    assert tok.encode(" hello world") == [23748, 995]
    assert tok.encode(" ") == [220]


def test_special_ids_of_tiny_en(tok, info):
    assert not tok.multilingual and info["n_vocab"] == 51864
    assert tok.eot == 50256
    assert tok.sot == 50257
    assert tok.translate == 50357
    assert tok.transcribe == 50358
    assert tok.sot_lm == 50359
    assert tok.sot_prev == 50360
    assert tok.no_speech == 50361  # <|nocaptions|> in English-only vocabularies
    assert tok.no_timestamps == 50362
    assert tok.timestamp_begin == 50363
    # 1501 timestamps, <|0.00|> .. <|30.00|>, fill the rest of the model's vocabulary.
    assert info["n_vocab"] - tok.timestamp_begin == 1501


def test_sot_sequences_of_tiny_en(tok):
    assert tok.language is None and tok.task is None
    assert tok.sot_sequence == (50257,)
    assert tok.sot_sequence_including_notimestamps == (50257, 50362)
    assert tok.language_codes_to_tokens == {}
    with pytest.raises(ValueError):
        tok.language_token


def test_decode_drops_specials_and_timestamps(tok):
    text = tok.encode(" Hello.")
    assert tok.decode([tok.sot, tok.timestamp_begin, *text, tok.timestamp_begin + 50, tok.eot]) == " Hello."


def test_decode_with_timestamps(tok):
    tokens = [tok.timestamp_begin, *tok.encode(" Hi"), tok.timestamp_begin + 54, tok.eot]
    assert tok.decode_with_timestamps(tokens) == "<|0.00|> Hi<|1.08|>"


def test_suppress_minus_one_matches_the_models_list(tok, info):
    # The GGUF carries the suppress list openai-whisper derives for this vocabulary (via CTranslate2):
    # the non-speech symbols plus the task/start/no-speech tokens.
    assert tok.suppress_tokens("-1") == tuple(sorted(info["suppress_tokens"]))
    assert len(tok.non_speech_tokens) == 84
    assert tok.encode(" -")[0] in tok.non_speech_tokens and tok.encode(" '")[0] in tok.non_speech_tokens
    assert tok.encode(",")[0] not in tok.non_speech_tokens


def test_suppress_token_specs(tok):
    always = {tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_speech}
    assert set(tok.suppress_tokens("5,7")) == {5, 7} | always
    assert set(tok.suppress_tokens([5])) == {5} | always
    assert set(tok.suppress_tokens("-1,5")) == {5} | always | set(tok.non_speech_tokens)


def _tiny_multilingual() -> WhisperTokenizer:
    """A word-level vocabulary laid out like a multilingual Whisper one (text, then specials)."""
    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|zh|>", "<|de|>", "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    vocab = {"hello": 0, "[UNK]": 1}
    vocab.update({s: 2 + i for i, s in enumerate(specials)})
    hf = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    return WhisperTokenizer.from_gguf_json(hf.to_str(), multilingual=True, language="German", task="translate")


def test_multilingual_sequences_and_languages():
    tok = _tiny_multilingual()
    assert tok.language == "de" and tok.task == "translate"
    assert tok.sot_sequence == (tok.sot, tok.language_token, tok.translate) == (3, 6, 7)
    assert tok.sot_sequence_including_notimestamps == (3, 6, 7, 12)
    assert tok.timestamp_begin == 13
    assert tok.no_speech == 11
    assert tok.language_codes_to_tokens == {"en": 4, "zh": 5, "de": 6}
    assert tok.language_tokens_to_codes[5] == "zh"
    english = tok.with_options(language=None, task=None)
    assert english.sot_sequence == (3, 4, 8)  # defaults: English, transcribe


def test_language_names():
    assert len(LANGUAGES) == 100
    assert normalize_language("English") == "en"
    assert normalize_language("castilian") == "es"
    assert normalize_language("iw") == "he"
    assert normalize_language(None) is None
    with pytest.raises(ValueError):
        normalize_language("klingon")
