"""A real ``openai`` client sends images to the gateway in a real ``plasmid train`` run on the tiny
vision-language model (``--task colours``, CPU, two small steps): the prompt's image in the user
message, and in a second call a tool's image (a square the agent's tool drew) in a ``tool`` message.

The run exits 0 and trains; each sample carries the images its calls had (the second call's sample
both), the tool image's tokens are in the response with ``loss_mask`` 0, every model turn the client
was sent is a trained run of a saved sample, token for token and log-prob for log-prob, and the
trainer's log-probs (computed with the recorded images) are the engine's."""

from __future__ import annotations

import pytest

pytest.importorskip("PIL")
pytest.importorskip("openai")

from test_agent_clients_train import train, trained_runs

from plasmid_torch.tiny_vision import IMAGE_PAD_ID, vision_tokenizer
from plasmid_torch.vision import VISION_KEY


@pytest.mark.timeout(300)
def test_an_openai_client_sends_a_prompt_image_and_a_tool_image_and_the_run_trains_on_exactly_them(tmp_path):
    metrics, samples, client = train(tmp_path, "colours_with_square",
                                     ("--task", "colours", "--colours-warmup-steps", "10"), steps=(2, 2, 2),
                                     max_new_tokens=6)
    assert len(metrics) == 2
    for step in metrics:
        assert step["rollout/agent/errors_fraction"] == 0.0
        assert step["train/train_rollout_logprob_abs_diff"] <= 1e-4, "the trainer's log-probs are the engine's"
    # per session (4 a step): the first call's two choices make two samples (the second a branch); the
    # second call continues the sample of the choice it extends, or starts one of its own when the reply's
    # text as the client read it does not render back to the model's tokens (a special token it wrote)
    with_tool_image = [s for s in samples if len(s["metadata"][VISION_KEY]["images"]) == 2]
    assert len(with_tool_image) == 2 * 4 and len(samples) in range(2 * 8, 2 * 12 + 1)
    continued = 0
    for sample in samples:
        prompt_length = len(sample["tokens"]) - sample["response_length"]
        prompt, response = sample["tokens"][:prompt_length], sample["tokens"][prompt_length:]
        images = sample["metadata"][VISION_KEY]["images"]
        assert images[0]["image"] == sample["prompt"][0]["content"][0]["image_url"]["url"]
        assert sample["tokens"].count(IMAGE_PAD_ID) == 4 * len(images), "each 32x32 image is 4 image tokens"
        in_response = [mask for token, mask in zip(response, sample["loss_mask"], strict=True) if token == IMAGE_PAD_ID]
        assert prompt.count(IMAGE_PAD_ID) + len(in_response) == 4 * len(images)
        assert not any(in_response), "a tool image's tokens in the response are loss-masked"
        if len(images) == 2:
            assert images[1]["image"].startswith("data:image/png;base64,")
            continued += len(in_response) == 4
    assert continued >= 4, "most second calls continue their first call's sample, the tool's image in its response"
    vocab = vision_tokenizer().get_vocab()
    turns = sorted((tuple(vocab[token] for token in turn["tokens"]), tuple(turn["logprobs"])) for turn in client)
    runs = sorted(run for sample in samples for run in trained_runs(sample))
    assert len(client) == 2 * 4 * 3
    assert turns == runs, "each model turn the client read is a trained run, token for token, bit for bit"
