"""Fixtures the torchtrain tests share: one torch thread per test (the CI machine has 2 cores and
tox runs two envs at once), and a tiny model directory per test module."""

import pytest
import torch

from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The quickstart's tiny model (seed 0), built once per test module."""
    return build_tiny_model(tmp_path_factory.mktemp("torchtrain") / "tiny")
