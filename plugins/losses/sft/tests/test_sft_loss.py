"""What --loss sft computes and what --generate sft attaches, on hand-made samples."""

from __future__ import annotations

import math

import plasmid_sft.plugin
import pytest
import torch
from plasmid_sft.generate import SFT_TARGET_KEY

from plasmid import testing
from plasmid.types import GenerationOutput, LossBatch, Sample, SamplingParams, Status

STOP = 99


def make_loss():
    return testing.build("loss", "sft", plasmid_sft.plugin, config=testing.make_config(plasmid_sft.plugin))


def test_the_loss_is_the_step_normalised_negative_log_likelihood():
    loss = make_loss()
    assert (loss.needs_ref, loss.needs_critic, loss.needs_old_logprobs) == (False, False, False)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.01], [0.125, 0.9, 0.9]])).requires_grad_(True)
    batch = LossBatch(rewards=torch.tensor([0.0, 1.0]), group_index=torch.zeros(2, dtype=torch.long),
                      response_mask=mask, old_logprobs=logprobs.detach().clone(), total_tokens=6, total_samples=2)
    batch.advantages, returns = loss.advantages(batch)
    assert returns is None and torch.equal(batch.advantages, mask)           # rewards are ignored
    value, metrics = loss.policy_loss(batch, logprobs, None)
    expected = (math.log(2) + math.log(4) + math.log(8)) / 6                 # the step has 6 tokens
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert metrics == {"sft_nll": pytest.approx(expected, rel=1e-6), "ppo_kl": 0.0}
    value.backward()
    assert torch.allclose(logprobs.grad, -mask / 6)


def sample(target=None, **fields) -> Sample:
    metadata = {} if target is None else {SFT_TARGET_KEY: target}
    return Sample(tokens=[1, 2, 3, 7, 7], response_length=2, loss_mask=[0, 1], rollout_logprobs=[-1.0, -2.0],
                  reward=0.0, status=Status.COMPLETED, metadata=metadata, **fields)


def test_training_samples_are_the_prompts_with_their_demonstrations():
    trained = make_loss().training_samples([sample([4, 5, STOP], index=3)])[0]
    assert trained.tokens == [1, 2, 3, 4, 5, STOP] and trained.response_length == 3
    assert trained.loss_mask == [1, 1, 1] and trained.rollout_logprobs is None and trained.index == 3


def test_a_sample_without_a_demonstration_names_itself_and_the_generate_function():
    with pytest.raises(ValueError, match=r"sample 1 \(index 8, group 2\).*--generate sft"):
        make_loss().training_samples([sample([4]), sample(index=8, group_index=2)])


class CharTokenizer:
    eos_token_id = STOP

    def encode(self, text, add_special_tokens=True):
        return ([0] if add_special_tokens else []) + [ord(c) - ord("0") + 10 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 10 + ord("0")) for i in ids if i >= 10)


class OneTokenEngine:
    async def generate(self, prompt_ids, params):
        return GenerationOutput(token_ids=[13], logprobs=[-0.5], status=Status.COMPLETED, weight_version=4)


class View:
    tokenizer = CharTokenizer()

    def engine_for(self, sample):
        return OneTokenEngine()


def generate(label, max_new_tokens, **options):
    fn = testing.build("generate", "sft", plasmid_sft.plugin, config=testing.make_config(plasmid_sft.plugin,
                                                                                         **options))
    prompt = Sample(tokens=[0, 11, 12], label=label, index=0)
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=(STOP, 98))
    return testing.run(fn(View(), prompt, params))


def test_generate_samples_the_policy_and_attaches_the_label_with_the_stop_token_when_it_fits():
    done = generate("42", max_new_tokens=3)
    assert done.response_tokens == [13] and done.rollout_logprobs == [-0.5] and done.weight_version == 4
    assert done.metadata[SFT_TARGET_KEY] == [14, 12, STOP]
    assert generate("42", max_new_tokens=2).metadata[SFT_TARGET_KEY] == [14, 12]      # no room for the stop
    assert generate("42", max_new_tokens=3, sft_append_stop=False).metadata[SFT_TARGET_KEY] == [14, 12]


@pytest.mark.parametrize("label", [None, "", 7])
def test_a_prompt_without_a_string_label_is_refused_naming_it(label):
    with pytest.raises(ValueError, match=r"--generate sft: sample 0 .* non-empty string"):
        generate(label, max_new_tokens=3)
