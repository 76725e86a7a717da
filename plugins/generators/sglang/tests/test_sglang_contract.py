"""The ``sglang`` engine against the kernel's generator contract, on a real SGLang server.

The contract builds an engine per test; here every test gets the session's first engine (a
server start costs tens of seconds on a CPU machine), put back to the checkpoint's weights at
version 0 after the test. The contract's model is the session's tiny Llama (same shape as the
contract's own, which is a Qwen2: SGLang's Qwen2 cannot read weights back).
"""

from __future__ import annotations

import plasmid_sglang.plugin
import pytest
from sglang_test_support import gpu_available, reset

from plasmid.testing import GeneratorContract


class TestSGLangEngineContract(GeneratorContract):
    plugin = plasmid_sglang.plugin
    provider = "sglang"

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tiny_llama):
        return tiny_llama

    @pytest.fixture
    def engine_factory(self, engines, tiny_llama):
        def factory(model_dir, **options):
            assert str(model_dir) == str(tiny_llama) and not options, "the session engine serves tiny_llama only"
            return engines[0]

        yield factory
        reset(engines[0], tiny_llama)

    def test_same_seed_gives_the_same_response_and_other_seeds_differ(self, engine):
        if not gpu_available():
            pytest.skip("SGLang honours per-request sampling seeds only with --enable-deterministic-inference, which "
                        "needs a GPU attention backend (fa3, flashinfer, triton); CPU servers sample unseeded")
        super().test_same_seed_gives_the_same_response_and_other_seeds_differ(engine)
