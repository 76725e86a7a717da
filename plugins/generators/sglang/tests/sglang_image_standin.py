"""TEST SUPPORT ONLY, never shipped: a stand-in for an SGLang server serving a vision-language model.

The real-server tests run SGLang's CPU engine with a stand-in ``sgl_kernel`` that implements only the
op a tiny Llama or Qwen2 calls; a Qwen2-VL (vision tower, multimodal rotary positions, SGLang's
multimodal processor) is not served that way, so the image tests of the ``sglang`` engine attach
(``--sglang-external-addrs``) to this server instead, which needs no SGLang at all. It speaks the
part of SGLang's native HTTP API that the engine uses for generation, the way SGLang 0.5 does:

- ``GET /server_info`` (``tp_size``, ``device``), ``GET /health_generate``, ``POST /flush_cache``,
  ``POST /abort_request``;
- ``POST /generate`` with ``input_ids``, ``sampling_params``, ``return_logprob`` and SGLang's
  multimodal field ``image_data`` (a list of images: data URLs here). As SGLang's multimodal processor
  does, each image is decoded and run through the model's image processor, and each image token of
  ``input_ids`` (one per image) is replaced by that image's tokens (``grid t * h * w / merge**2``); a
  count of image tokens other than the count of images is HTTP 400. The answer has SGLang's shape:
  ``output_ids``, ``meta_info`` with ``output_token_logprobs`` (``[logprob, token, None]``),
  ``finish_reason`` (``{"type": "stop", "matched": id}`` or ``{"type": "length", "length": n}``),
  ``prompt_tokens`` (the expanded prompt's length) and ``weight_version``.

Responses are sampled by :func:`plasmid_torch.vision.generate` (transformers' ``generate`` of the model
in ``model_dir``): the stand-in's log-probs are those of the Hugging Face model at the request's
temperature, as SGLang reports them. Every ``/generate`` body is kept in ``bodies`` for the tests.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class SGLangImageStandIn:
    """TEST SUPPORT: the stand-in server (see the module docstring) on 127.0.0.1, in a daemon thread."""

    def __init__(self, model_dir: str) -> None:
        import torch
        import transformers

        from plasmid_torch.vision import ImageInputs

        torch.set_num_threads(1)
        self.model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir).eval()
        self.images = ImageInputs(model_dir)
        self.image_token_id = int(self.model.config.image_token_id)
        self.bodies: list[dict[str, Any]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-image-standin", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> SGLangImageStandIn:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=30)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _listen(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/health_generate", self._empty)
        app.router.add_post("/flush_cache", self._empty)
        app.router.add_post("/abort_request", self._empty)
        app.router.add_post("/generate", self._generate)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"tp_size": 1, "device": "cpu", "enable_memory_saver": False})

    async def _empty(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        try:
            prompt, vision = self._expand(list(body["input_ids"]), body.get("image_data") or [])
        except ValueError as error:
            return web.json_response({"error": {"message": str(error)}}, status=400)
        loop = asyncio.get_running_loop()
        return web.json_response(await loop.run_in_executor(None, self._answer, prompt, vision,
                                                            body.get("sampling_params") or {}))

    def _expand(self, input_ids: list[int], image_data: list[str]) -> tuple[list[int], Any]:
        """SGLang's multimodal preprocessing: the images decoded and processed, each image token expanded."""
        from plasmid_torch.vision import decode_image

        places = [i for i, token in enumerate(input_ids) if token == self.image_token_id]
        if len(places) != len(image_data):
            raise ValueError(f"{len(places)} image tokens in input_ids for {len(image_data)} images in image_data")
        if not image_data:
            return input_ids, None
        vision = self.images.process([decode_image({"type": "image", "image": url}) for url in image_data])
        counts = (vision.image_grid_thw.prod(dim=1) // self.images.merge ** 2).tolist()
        for place, count in zip(reversed(places), reversed(counts), strict=True):
            input_ids[place:place + 1] = [self.image_token_id] * count
        return input_ids, vision

    def _answer(self, prompt: list[int], vision: Any, sampling: dict[str, Any]) -> dict[str, Any]:
        from plasmid.types import SamplingParams
        from plasmid_torch.vision import generate

        stops = tuple(sampling.get("stop_token_ids") or ())
        params = SamplingParams(temperature=float(sampling.get("temperature", 1.0)),
                                top_p=float(sampling.get("top_p", 1.0)),
                                top_k=max(int(sampling.get("top_k", -1)), 0),
                                max_new_tokens=int(sampling["max_new_tokens"]), stop_token_ids=stops,
                                seed=sampling.get("sampling_seed"))
        tokens, logprobs, stopped = generate(self.model, prompt, vision, params)
        finish = {"type": "stop", "matched": tokens[-1]} if stopped else {"type": "length", "length": len(tokens)}
        return {"output_ids": tokens, "meta_info": {
            "finish_reason": finish, "prompt_tokens": len(prompt), "weight_version": "default",
            "output_token_logprobs": [[lp, token, None] for lp, token in zip(logprobs, tokens, strict=True)]}}
