"""What plasmid sends to SGLang's ``/generate`` and how it reads the answers (no I/O here).

Sampling, as :class:`plasmid.types.SamplingParams` defines it, maps onto SGLang's
``sampling_params`` one to one (``top_k`` 0 is SGLang's -1, "off"; a seed is SGLang's
``sampling_seed``, which SGLang honours only with ``--enable-deterministic-inference``), with two
differences that this module bridges:

- **stop tokens.** SGLang always stops on the model's end-of-sequence ids (``eos_token_id`` of
  ``config.json`` and ``generation_config.json``) as well as on ``stop_token_ids``, and its
  ``ignore_eos`` switch disables both. plasmid stops on exactly ``stop_token_ids``: a request
  without stop tokens is sent with ``ignore_eos``; a response that SGLang ended on an
  end-of-sequence id the request did not list is continued (:func:`needs_continuation`) by a
  new request for prompt + response so far, until a listed stop token or the length limit.
- **stop strings.** ``params.stop`` is SGLang's ``stop``, with ``no_stop_trim`` so that the answer
  keeps the tokens through the one that completed the string (the sample's tokens stay the
  engine's); SGLang reports the string as ``finish_reason.matched``, and such a stop is never
  continued. A continuation (above) matches stop strings on its own new text only.
- **images.** A prompt with images sends them as ``image_data`` beside ``input_ids`` holding one
  image token per image; SGLang expands them, and the engine checks that the expanded prompt has
  plasmid's length (:func:`generate_request`).
- **log-probs at a temperature.** The log-probs SGLang reports for generated tokens are those of
  ``softmax(logits / T)`` before top-p/top-k (greedy: ``T = 1``), as plasmid's. For *given*
  tokens (``score``), SGLang reports ``softmax(logits)`` at ``T = 1`` whatever the request's
  temperature; at another temperature :func:`score_request` asks for every token's log-prob at
  each position and :func:`logprobs_at_temperature` rescales them exactly:
  ``log softmax(l / T)_x = lp_x / T - logsumexp_y(lp_y / T)`` with ``lp = log softmax(l)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plasmid.types import SamplingParams, Status
from plasmid_serving.logprobs import logprob_at_temperature as logprobs_at_temperature

#: SGLang's ``finish_reason.type`` -> the sample's status.
FINISH_STATUS = {"length": Status.TRUNCATED, "stop": Status.COMPLETED, "abort": Status.ABORTED}


@dataclass
class Generated:
    """One ``/generate`` answer, parsed.

    :ivar token_ids: generated tokens. :ivar logprobs: their log-probs.
    :ivar status: COMPLETED, TRUNCATED or ABORTED. :ivar matched: the stop token SGLang matched.
    :ivar matched_text: the stop string SGLang matched ('' when it stopped otherwise).
    :ivar weight_version: the version the server reported (``"default"`` reads as 0).
    :ivar routed_experts: ``meta_info["routed_experts"]`` as sent (base64), when there is one.
    """

    token_ids: list[int]
    logprobs: list[float]
    status: Status
    matched: int | None
    weight_version: int
    routed_experts: str | None = None
    matched_text: str = ""


def generate_request(prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
                     routed_experts: bool = False, image_data: list[str] | None = None) -> dict[str, Any]:
    """The ``/generate`` body for ``prompt_ids`` (the whole context, including a response being
    continued) and ``max_new_tokens`` more tokens; ``routed_experts``: ask for the MoE routing of
    every token (:mod:`plasmid_sglang.routing`).

    ``image_data``: the prompt's images (data URLs, in prompt order), SGLang's own multimodal field.
    With ``input_ids``, SGLang's multimodal processor finds each image token in the ids and replaces
    it by that image's tokens, so ``prompt_ids`` must then hold *one* image token per image
    (:meth:`plasmid_serving.images.ServedImages.server_prompt`); ``meta_info.prompt_tokens`` of the
    answer counts the expanded prompt."""
    sampling: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
    }
    if params.stop_token_ids:
        sampling["stop_token_ids"] = list(params.stop_token_ids)
    else:
        sampling["ignore_eos"] = True
    if params.stop:
        sampling["stop"] = list(params.stop)
        sampling["no_stop_trim"] = True
    if params.seed is not None:
        sampling["sampling_seed"] = params.seed
    body: dict[str, Any] = {"input_ids": list(prompt_ids), "sampling_params": sampling, "return_logprob": True}
    if routed_experts:
        body["return_routed_experts"] = True
    if image_data:
        body["image_data"] = list(image_data)
    return body


def parse_generate(answer: dict[str, Any]) -> Generated:
    """Read a ``/generate`` answer (one request, not streamed)."""
    meta = answer.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    token_ids = [int(t) for t in answer.get("output_ids", [])]
    logprobs = [float(pair[0]) for pair in pairs]
    if len(logprobs) != len(token_ids):
        raise ValueError(f"SGLang answered {len(token_ids)} tokens with {len(logprobs)} log-probs; was "
                         f"return_logprob ignored? answer meta_info: {meta}")
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else str(finish)
    if kind not in FINISH_STATUS:
        raise ValueError(f"SGLang answered an unknown finish reason {finish!r}")
    matched = finish.get("matched") if isinstance(finish, dict) else None
    routed = meta.get("routed_experts")
    return Generated(token_ids, logprobs, FINISH_STATUS[kind], matched if isinstance(matched, int) else None,
                     parse_version(meta.get("weight_version")), routed if isinstance(routed, str) else None,
                     matched if isinstance(matched, str) else "")


def needs_continuation(generated: Generated, params: SamplingParams) -> bool:
    """Whether SGLang stopped on an end-of-sequence token that the request did not ask to stop on (not
    on a stop token or a stop string it asked for)."""
    return (generated.status is Status.COMPLETED and bool(generated.token_ids) and not generated.matched_text
            and generated.token_ids[-1] not in params.stop_token_ids)


def parse_version(reported: Any) -> int:
    """SGLang's weight version string as plasmid's integer (``"default"`` or none: 0)."""
    try:
        return int(str(reported))
    except (TypeError, ValueError):
        return 0


def score_request(token_ids: list[int], prompt_length: int, temperature: float, vocab_size: int) -> dict[str, Any]:
    """The ``/generate`` body that returns the log-probs of ``token_ids[prompt_length:]`` (no
    tokens generated). SGLang's first input log-prob (at ``logprob_start_len``) is always empty,
    so the request starts one position early. Away from temperature 1, every token's log-prob at
    each position is asked for (``top_logprobs_num = vocab_size``), for the exact rescaling."""
    body: dict[str, Any] = {"input_ids": list(token_ids),
                            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
                            "return_logprob": True, "logprob_start_len": prompt_length - 1}
    if not _at_temperature_one(temperature):
        body["top_logprobs_num"] = vocab_size
    return body


def parse_score(answer: dict[str, Any], token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
    """The log-probs of ``token_ids[prompt_length:]`` at ``temperature`` from a
    :func:`score_request` answer."""
    meta = answer.get("meta_info", {})
    wanted = token_ids[prompt_length:]
    if _at_temperature_one(temperature):
        pairs = (meta.get("input_token_logprobs") or [])[1:]
        values = [float(pair[0]) for pair in pairs]
    else:
        rows = (meta.get("input_top_logprobs") or [])[1:]
        values = [logprobs_at_temperature({int(p[1]): float(p[0]) for p in row}, token, temperature)
                  for row, token in zip(rows, wanted, strict=False)]
    if len(values) != len(wanted):
        raise ValueError(f"SGLang returned {len(values)} input log-probs for {len(wanted)} scored tokens")
    return values


def _at_temperature_one(temperature: float) -> bool:
    return temperature == 0 or temperature == 1.0


#: How SGLang answers (HTTP 400) ``/get_weights_by_name`` when the served model class cannot read a
#: weight back: its model runner calls the model's own ``get_weights_by_name`` (Llama has one, Qwen2
#: in 0.5.23 not), logs the exception and answers nothing, which the HTTP server turns into this.
READBACK_REFUSED = "Get parameter by name failed"


def weights_request(name: str, rows: int) -> dict[str, Any]:
    """The body of ``/get_weights_by_name`` for tensor ``name`` (Hugging Face name) with its first
    ``rows`` rows (SGLang truncates the first dimension to ``truncate_size``: ask for all of them)."""
    return {"name": name, "truncate_size": rows}


def readback_refused(status: int, text: str) -> bool:
    """Whether a ``/get_weights_by_name`` answer says the model class cannot read weights back
    (:data:`READBACK_REFUSED`), as opposed to a failure of the server."""
    return status == 400 and READBACK_REFUSED in text
