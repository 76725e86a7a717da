"""How :meth:`SyncGuard.verify` checks an engine on a verifying sync: read-back where the engine
can, the scored probe where it cannot (a false ``reads_weights_back``, or ``get_weights`` raising
:class:`ReadBackUnsupported`, as SGLang does for a model class without ``get_weights_by_name``), and
what ``--verify-sync-check`` and ``--verify-sync-bound`` change. Stand-in trainer and engines: the
probe on real torchgen/torchtrain runs in the weight-sync contract (``test_the_probe_...``)."""

from __future__ import annotations

import json
import math

import plasmid_sync.plugin
import pytest
import torch

from plasmid import testing
from plasmid_torch.scoring import PROBE_LENGTH, PROBE_PROMPT, PROBE_SEQUENCES, max_difference, probe_sequences
from plasmid_torch.sync_guard import PROBE_BOUNDS, ReadBackUnsupported, SyncError, SyncGuard, SyncMismatch

VOCAB = 16


def logprob(token: int, position: int) -> float:
    """The stand-ins' model: a log-prob that depends on the token and its position."""
    return -0.1 * (token + 1) - 0.01 * position


class Trainer:
    """Exports one tensor; scores every response token with :func:`logprob`."""

    def __init__(self) -> None:
        self.scored = 0

    def export_weights(self, bucket_bytes):
        yield [("w", torch.arange(4, dtype=torch.float32))]

    async def logprobs(self, samples, temperature):
        self.scored += 1
        return [[logprob(t, i) for i, t in enumerate(s.tokens[s.prompt_length:])] for s in samples]


class Engine:
    """Serves the trainer's tensor; ``offset`` shifts every log-prob it gives (an engine serving
    other weights); ``readback`` is what ``get_weights`` does: ``"ok"``, ``"unsupported"``."""

    def __init__(self, offset: float = 0.0, readback: str = "ok", reads_weights_back: bool = True) -> None:
        self.offset, self.readback, self.reads_weights_back = offset, readback, reads_weights_back
        self.read, self.probed = 0, 0

    async def get_weights(self, names):
        self.read += 1
        if self.readback == "unsupported":
            raise ReadBackUnsupported("this stand-in cannot read its weights back")
        return {name: torch.arange(4, dtype=torch.float32).numpy() for name in names}

    async def response_logprobs(self, token_ids, prompt_length, temperature):
        self.probed += 1
        return [logprob(t, i) + self.offset for i, t in enumerate(token_ids[prompt_length:])]


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    return tmp_path


def guard(model, *plugins, **options):
    config = testing.make_config(plasmid_sync.plugin, *plugins, model=str(model), verify_sync_every=1, **options)
    return SyncGuard(config, "stand-in")


def verify(checker, engines, trainer=None):
    return testing.run(checker.verify(trainer or Trainer(), engines, 1 << 20))


def test_an_engine_that_reads_back_is_read_back_and_never_probed(model):
    engine = Engine()
    assert verify(guard(model), [engine]) == {"sync/verified_tensors": 1.0}
    assert (engine.read, engine.probed) == (1, 0)


def test_an_engine_that_says_it_cannot_read_back_is_probed(model):
    engine, trainer = Engine(reads_weights_back=False), Trainer()
    metrics = verify(guard(model), [engine], trainer)
    assert metrics == {"sync/probed_engines": 1.0, "sync/probe_max_diff": 0.0}
    assert (engine.read, engine.probed, trainer.scored) == (0, PROBE_SEQUENCES, 1)


def test_an_engine_whose_read_back_is_unsupported_is_probed_from_then_on(model):
    engine, checker = Engine(readback="unsupported"), guard(model)
    assert verify(checker, [engine])["sync/probed_engines"] == 1.0
    assert verify(checker, [engine])["sync/probed_engines"] == 1.0
    assert engine.read == 1, "the guard asked again for a read-back the engine said it cannot do"
    assert engine.probed == 2 * PROBE_SEQUENCES


def test_the_trainer_scores_the_probe_once_for_all_engines(model):
    trainer, engines = Trainer(), [Engine(reads_weights_back=False), Engine(), Engine(reads_weights_back=False)]
    metrics = verify(guard(model), engines, trainer)
    assert trainer.scored == 1
    assert metrics == {"sync/verified_tensors": 1.0, "sync/probed_engines": 2.0, "sync/probe_max_diff": 0.0}


def test_an_engine_serving_other_weights_fails_the_probe_naming_transport_and_engine(model):
    engines = [Engine(reads_weights_back=False), Engine(offset=0.01, reads_weights_back=False)]
    with pytest.raises(SyncMismatch) as raised:
        verify(guard(model), engines)
    message = str(raised.value)
    assert message.startswith("weight sync 'stand-in': the probe's log-probs from engine 1 (Engine, rank 2) differ "
                              "from the trainer's by up to 0.01"), message
    assert "beyond --verify-sync-bound 0.001" in message


def test_the_bound_is_an_option_and_looser_in_bfloat16(model):
    torchtrain = pytest.importorskip("plasmid_torchtrain.plugin")  # declares --precision

    assert verify(guard(model, verify_sync_bound=0.02), [Engine(offset=0.01, reads_weights_back=False)])
    bf16 = guard(model, torchtrain, verify_sync_check="probe", precision="bf16")
    assert bf16.bound == PROBE_BOUNDS["bf16"] == 5e-2 and PROBE_BOUNDS["fp32"] == 1e-3
    assert verify(bf16, [Engine(offset=0.04)])["sync/probe_max_diff"] == pytest.approx(0.04)
    with pytest.raises(SyncMismatch, match="beyond --verify-sync-bound 0.05"):
        verify(bf16, [Engine(offset=0.06)])


def test_verify_sync_check_forces_either_check(model):
    forced = Engine()
    verify(guard(model, verify_sync_check="probe"), [forced])
    assert (forced.read, forced.probed) == (0, PROBE_SEQUENCES)
    with pytest.raises(ReadBackUnsupported):
        verify(guard(model, verify_sync_check="read-back"), [Engine(readback="unsupported")])


def test_the_probe_without_a_known_vocabulary_is_one_error(tmp_path):
    with pytest.raises(SyncError, match=r"engine 0 \(Engine, rank 1\) cannot read its weights back, and the probe "
                                        r"that checks it instead needs --model's config.json vocab_size"):
        verify(guard(tmp_path), [Engine(reads_weights_back=False)])


def test_probe_sequences_are_fixed_by_the_seed_and_inside_the_vocabulary():
    first = probe_sequences(VOCAB, 7)
    assert first == probe_sequences(VOCAB, 7) != probe_sequences(VOCAB, 8)
    assert len(first) == PROBE_SEQUENCES
    for tokens, prompt_length in first:
        assert len(tokens) == PROBE_LENGTH and prompt_length == PROBE_PROMPT
        assert all(0 <= t < VOCAB for t in tokens)
    with pytest.raises(ValueError, match="vocab_size must be positive"):
        probe_sequences(0, 7)


def test_max_difference_finds_the_worst_token_and_counts_nan_as_infinite():
    assert max_difference([[0.0, -1.0], [-2.0]], [[0.0, -1.5], [-2.1]]) == (0.5, 0, 1)
    assert max_difference([[0.0], [math.nan]], [[0.3], [-1.0]]) == (math.inf, 1, 0)
    with pytest.raises(ValueError, match="sequence 0: the engine scored 1 tokens, the trainer 2"):
        max_difference([[0.0]], [[0.0, 0.0]])
