"""Qwen's official Qwen3-ASR code (the qwen-asr wheel's core/transformers_backend), loaded without the package's
__init__.py: that imports the inference wrapper, whose audio loading needs librosa, soundfile and nagisa, none of
which the modelling, configuration and processing modules use."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from pathlib import Path


def _spec():
    spec = importlib.util.find_spec("qwen_asr")
    if spec is None:
        raise SystemExit("qwen_asr is not installed: run this with build/qwen-reference/bin/python (make qwen-reference)")
    return spec


def package_dir() -> Path:
    return Path(_spec().submodule_search_locations[0])


@functools.cache
def load() -> types.SimpleNamespace:
    """The classes, with the Auto* registrations inference/qwen3_asr.py makes, so from_pretrained works as there."""
    # The package's module, made from its spec but not executed: its submodules import as usual.
    sys.modules.setdefault("qwen_asr", importlib.util.module_from_spec(_spec()))
    backend = importlib.import_module("qwen_asr.core.transformers_backend")
    from transformers import AutoConfig, AutoModel, AutoProcessor

    AutoConfig.register("qwen3_asr", backend.Qwen3ASRConfig)
    AutoModel.register(backend.Qwen3ASRConfig, backend.Qwen3ASRForConditionalGeneration)
    AutoProcessor.register(backend.Qwen3ASRConfig, backend.Qwen3ASRProcessor)
    return types.SimpleNamespace(
        Qwen3ASRConfig=backend.Qwen3ASRConfig,
        Qwen3ASRForConditionalGeneration=backend.Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor=backend.Qwen3ASRProcessor,
        modeling=importlib.import_module("qwen_asr.core.transformers_backend.modeling_qwen3_asr"),
        processing=importlib.import_module("qwen_asr.core.transformers_backend.processing_qwen3_asr"),
    )
