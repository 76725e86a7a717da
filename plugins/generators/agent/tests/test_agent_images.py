"""Image parts at the gateway with a scripted engine and the real ``openai`` client: what is refused
(one-line 400s naming the field, the limit's option or the model, before the engine runs) and what is
recorded (the image tokens expanded, the model inputs handed to ``generate_with_images``, the sample's
reference to its images)."""

from __future__ import annotations

import base64
import io

import openai
import pytest
from conftest import ScriptedEngine
from openai import AsyncOpenAI
from test_agent_protocol import run_agent

from plasmid.types import GenerationOutput, SamplingParams

PIL = pytest.importorskip("PIL.Image")

from plasmid_torch.tiny_vision import IMAGE_PAD_ID, build_tiny_vlm  # noqa: E402 (after the skip)
from plasmid_torch.vision import VISION_KEY, ImageInputs  # noqa: E402

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(2,), seed=7)
QUESTION = "which colour?"


def png(side: int = 32, colour: tuple[int, int, int] = (220, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    PIL.new("RGB", (side, side), colour).save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def user(*urls: str, role: str = "user") -> dict:
    return {"role": role, "content": [*({"type": "image_url", "image_url": {"url": url}} for url in urls),
                                      {"type": "text", "text": QUESTION}]}


class ImageEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` that also takes images; ``images`` holds the inputs of each such call."""

    def __init__(self, tokenizer, texts, model_dir):
        super().__init__(tokenizer, texts)
        #: the engine's image inputs of a sample (torchgen's kind)
        self.images = ImageInputs(str(model_dir))
        self.received = []

    async def generate_with_images(self, prompt_ids, images, params) -> GenerationOutput:
        self.received.append(images)
        return await self.generate(prompt_ids, params)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-vlm", seed=0)


@pytest.fixture(scope="module")
def vlm_tokenizer(vlm_dir):
    from plasmid_torch.hf import load_tokenizer

    return load_tokenizer(str(vlm_dir))


def run(tmp_path, model_dir, tokenizer, engine, agent, **options):
    """The samples of one rollout of ``agent`` (an async function of the session) on ``--model model_dir``."""
    # the agents send their own prompts
    return run_agent(tmp_path, agent, tokenizer, engine, prompt="2", label="red", params=PARAMS,
                     model=str(model_dir), **options)


def refusal(tmp_path, model_dir, tokenizer, messages, **options) -> str:
    """The message of the 400 the gateway answers ``messages`` with (the engine never runs)."""
    engine, seen = ScriptedEngine(tokenizer, []), {}

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model=session.model, messages=messages)
        seen["message"] = caught.value.body["message"]
        return 1.0

    with pytest.raises(Exception, match="made no model call"):
        run(tmp_path, model_dir, tokenizer, engine, agent, **options)
    assert engine.seen == []
    assert "\n" not in seen["message"]
    return seen["message"]


def test_an_undecodable_image_is_a_400_naming_its_field(tmp_path, vlm_dir, vlm_tokenizer):
    message = refusal(tmp_path, vlm_dir, vlm_tokenizer, [user(data_url(png()), data_url(b"not an image"))])
    assert message.startswith("'messages[0].content[1].image_url': cannot decode the image")


def test_an_image_over_the_pixel_limit_is_a_400_naming_the_option(tmp_path, vlm_dir, vlm_tokenizer):
    message = refusal(tmp_path, vlm_dir, vlm_tokenizer, [user(data_url(png(64)))], agent_max_image_pixels=32 * 32)
    assert message == ("'messages[0].content[0].image_url': image of 64x64 pixels is over the limit of 1024 pixels "
                       "(--agent-max-image-pixels)")


def test_too_many_images_are_a_400_naming_the_option(tmp_path, vlm_dir, vlm_tokenizer):
    messages = [user(data_url(png())), {"role": "assistant", "content": "red"},
                user(data_url(png()), role="tool")]
    message = refusal(tmp_path, vlm_dir, vlm_tokenizer, messages, agent_max_images=1)
    assert message == "'messages': 2 images, over the limit of 1 (--agent-max-images)"


def test_an_image_for_a_text_only_policy_is_a_400_naming_the_model(tmp_path, tiny_model, tool_tokenizer):
    message = refusal(tmp_path, tiny_model, tool_tokenizer, [user(data_url(png()))])
    assert message == (f"'messages[0].content[0]' is an image, but the model 'plasmid' (--model {tiny_model}) is not "
                       f"a vision-language model; send text only")


@pytest.mark.parametrize(("url", "options", "expected"), [
    ("https://example.com/cat.png", {}, "is not read (no downloads): send the image as a data URL"),
    ("/tmp/cat.png", {}, "is a local file, and local files are not read here: send the image as a data URL "
                         "(data:image/png;base64,...) (or start the run with --agent-image-paths)"),
    ("file:///tmp/cat.png", {}, "is a local file"),
    ("cat.png", {"agent_image_paths": True}, "is a relative path; give an absolute path or a data URL"),
    ("/nonexistent/cat.png", {"agent_image_paths": True}, "cannot read image /nonexistent/cat.png"),
    ("data:image/png,abc", {}, "is not base64"),
])
def test_an_image_url_the_gateway_does_not_read_is_a_400_naming_its_field(tmp_path, vlm_dir, vlm_tokenizer, url,
                                                                         options, expected):
    message = refusal(tmp_path, vlm_dir, vlm_tokenizer, [user(url)], **options)
    assert message.startswith("'messages[0].content[0].image_url': ") and expected in message


def test_images_reach_the_engine_expanded_and_the_sample_records_them(tmp_path, vlm_dir, vlm_tokenizer):
    """A data URL and, with --agent-image-paths, an absolute path: the prompt holds 4 image tokens per
    32x32 image, the engine gets both images' inputs, the sample's reference names both."""
    path = tmp_path / "green.png"
    path.write_bytes(png(colour=(30, 180, 30)))
    engine = ImageEngine(vlm_tokenizer, ["red<eos>"], vlm_dir)

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        reply = await client.chat.completions.create(model=session.model,
                                                     messages=[user(data_url(png()), str(path))])
        return float(reply.choices[0].message.content == "red")

    sample = run(tmp_path, vlm_dir, vlm_tokenizer, engine, agent, agent_image_paths=True)
    (prompt, _), = engine.seen
    assert prompt.count(IMAGE_PAD_ID) == 8 and prompt == sample.prompt_tokens
    (inputs,) = engine.received
    assert inputs.image_grid_thw.tolist() == [[1, 4, 4], [1, 4, 4]]
    assert sample.metadata[VISION_KEY] == {"images": [{"type": "image", "image": data_url(png())},
                                                      {"type": "image", "image": str(path)}]}
    assert sample.metadata["agent_reward"] == 1.0


def test_a_call_with_other_images_behind_the_same_text_starts_a_sample_of_its_own(tmp_path, vlm_dir, vlm_tokenizer):
    """Image tokens are the same ids whatever the image: a second call whose text extends the first's but
    whose image differs is not the first's continuation (its sample holds its own image)."""
    engine = ImageEngine(vlm_tokenizer, ["red<eos>", "blue<eos>"], vlm_dir)
    red, blue = data_url(png()), data_url(png(colour=(30, 60, 220)))

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        await client.chat.completions.create(model=session.model, messages=[user(red)])
        await client.chat.completions.create(model=session.model, messages=[
            user(blue), {"role": "assistant", "content": "red"}, {"role": "user", "content": "sure?"}])
        return 1.0

    samples = run(tmp_path, vlm_dir, vlm_tokenizer, engine, agent)
    assert [s.metadata[VISION_KEY]["images"][0]["image"] for s in samples] == [red, blue]
    assert [len(s.metadata[VISION_KEY]["images"]) for s in samples] == [1, 1]


def test_images_for_an_engine_that_takes_none_are_a_400_naming_the_engine(tmp_path, vlm_dir, vlm_tokenizer):
    message = refusal(tmp_path, vlm_dir, vlm_tokenizer, [user(data_url(png()))])
    assert message == ("'messages' holds images, but the rollout engine ScriptedEngine takes no images (torchgen, "
                       "sglang and vllm serving a vision-language model do)")


def test_responses_input_images_in_a_user_message_and_a_function_call_output_reach_the_engine(tmp_path, vlm_dir,
                                                                                              vlm_tokenizer):
    """/v1/responses (the OpenAI Agents SDK's default): ``input_image`` parts as chat image parts, errors
    naming the ``input`` field."""
    engine = ImageEngine(vlm_tokenizer, ["red<eos>"], vlm_dir)
    red, blue = data_url(png()), data_url(png(colour=(30, 60, 220)))
    seen = {}

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        items = [{"role": "user", "content": [{"type": "input_image", "image_url": red},
                                              {"type": "input_text", "text": QUESTION}]},
                 {"type": "function_call", "call_id": "c0", "name": "look", "arguments": "{}"},
                 {"type": "function_call_output", "call_id": "c0",
                  "output": [{"type": "input_text", "text": "look:"}, {"type": "input_image", "image_url": blue}]}]
        response = await client.responses.create(model=session.model, input=items)
        bad = [*items[:2], {**items[2], "output": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=session.model, input=bad)
        seen["bad"] = caught.value.body["message"]
        return float(response.output_text == "red")

    sample = run(tmp_path, vlm_dir, vlm_tokenizer, engine, agent)
    (prompt, _), = engine.seen
    assert prompt.count(IMAGE_PAD_ID) == 8 and engine.received[0].image_grid_thw.tolist() == [[1, 4, 4]] * 2
    assert [part["image"] for part in sample.metadata[VISION_KEY]["images"]] == [red, blue]
    assert sample.metadata["agent_reward"] == 1.0
    assert seen["bad"].startswith("'input[2].output[0].image_url': data URL 'data:image/png;base64,AA'...: bad base64")
