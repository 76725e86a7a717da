"""The ``vllm`` engine against the kernel's generator contract, on a real vLLM server.

The contract builds an engine per test; here every test gets the session's engine (a server start
costs tens of seconds on a CPU machine), put back to the checkpoint's weights at version 0 after
the test. The CPU server's context is 1024 tokens (plasmid's CPU default), so the generation that
``abort_all`` interrupts is 900 tokens long.
"""

from __future__ import annotations

import plasmid_vllm.plugin
import pytest
from vllm_test_support import reset

from plasmid.testing import GeneratorContract


class TestVLLMEngineContract(GeneratorContract):
    plugin = plasmid_vllm.plugin
    provider = "vllm"
    long_generation_tokens = 900

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tiny_qwen):
        return tiny_qwen

    @pytest.fixture
    def engine_factory(self, engine, tiny_qwen):
        def factory(model_dir, **options):
            assert str(model_dir) == str(tiny_qwen) and not options, "the session engine serves tiny_qwen only"
            return engine

        yield factory
        reset(engine, tiny_qwen)
