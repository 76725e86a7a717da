"""Prompts with images on vLLM: the request and how its streamed answer is read (no I/O here).

vLLM's ``/v1/completions`` takes token ids but no images, and ``/v1/chat/completions`` takes images but
renders the prompt itself. Its token-in, token-out endpoint takes both: ``POST /inference/v1/generate``
(vLLM 0.32's ``GenerateRequest``, served with ``--enable-scale-out``) with ``token_ids`` and
``content_parts`` (``{"type": "image_url", "url": <data URL>}``), which vLLM turns into a
``TokensPrompt`` with ``multi_modal_data``. vLLM's processor then replaces each image token of the ids
by that image's tokens, so the ids sent hold one image token per image
(:meth:`plasmid_serving.images.ServedImages.server_prompt`); ``return_token_ids`` makes the first chunk
carry the expanded ids, which must equal plasmid's prompt (the trainer's), or the engine fails the request.

Sampling is as on ``/v1/completions`` (:func:`plasmid_vllm.engine.completion_body`): the sampled token's
log-prob (``logprobs: 0``, processed: at the request's temperature), ``ignore_eos`` with plasmid's stop
tokens, the seed, stop strings kept in the output.
"""

from __future__ import annotations

import json
from typing import Any

from plasmid.types import SamplingParams

#: vLLM's token-in, token-out endpoint (registered by ``--enable-scale-out``)
GENERATE_PATH = "/inference/v1/generate"


def generate_body(served_model: str, server_ids: list[int], images: list[str],
                  params: SamplingParams) -> dict[str, Any]:
    """The streamed ``/inference/v1/generate`` body: ``server_ids`` (one image token per image) with
    ``images`` (data URLs, in prompt order), sampled as ``params`` says."""
    sampling: dict[str, Any] = {
        "max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0, "logprobs": 0, "ignore_eos": True,
        "stop_token_ids": list(params.stop_token_ids), "skip_special_tokens": False}
    if params.stop:
        sampling["stop"] = list(params.stop)
        sampling["include_stop_str_in_output"] = True
    if params.seed is not None:
        sampling["seed"] = params.seed
    return {"model": served_model, "token_ids": list(server_ids),
            "content_parts": [{"type": "image_url", "url": url} for url in images],
            "sampling_params": sampling, "stream": True, "return_token_ids": True}


class GenerateStream:
    """Reads the streamed answer of one ``/inference/v1/generate`` request, chunk by chunk
    (``data: {...}`` lines): appends the tokens and their log-probs, keeps the expanded prompt ids
    (``prompt_ids``, from the first chunk) and the finish reason."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] | None = None
        self.finish: str | None = None

    def read(self, chunk: dict[str, Any], tokens: list[int], logprobs: list[float]) -> None:
        """Take one decoded chunk; :class:`ValueError` for a chunk vLLM marks as an error or one whose
        tokens and log-probs differ in number."""
        if "error" in chunk:
            raise ValueError(str(chunk["error"])[:500])
        if chunk.get("prompt_token_ids") is not None and self.prompt_ids is None:
            self.prompt_ids = [int(token) for token in chunk["prompt_token_ids"]]
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids") or []
            values = [entry["logprob"] for entry in (choice.get("logprobs") or {}).get("content") or []]
            if len(values) != len(ids):
                raise ValueError(f"sent {len(ids)} tokens with {len(values)} log-probs")
            tokens += [int(token) for token in ids]
            logprobs += [float(value) for value in values]
            self.finish = choice.get("finish_reason") or self.finish

    def read_line(self, line: str, tokens: list[int], logprobs: list[float]) -> bool:
        """Take one line of the stream; ``False`` at ``data: [DONE]``."""
        line = line.strip()
        if not line.startswith("data:"):
            return True
        data = line[5:].strip()
        if data == "[DONE]":
            return False
        self.read(json.loads(data), tokens, logprobs)
        return True
