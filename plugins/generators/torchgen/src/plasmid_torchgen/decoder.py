"""The forward passes of the engine: prefill, one decoding step, and scoring.

Everything here runs on the engine's single worker thread (see :mod:`.engine`), under
``torch.inference_mode``; nothing here knows about asyncio beyond carrying requests.

On a GPU (``--device``): the model and the KV cache live there (the cache in the compute dtype:
bfloat16 with ``--precision bf16`` or ``bf16-autocast``); each forward pass moves its ids, mask
and positions there, and the ``[rows, vocab]`` logits of the last column are sampled there too
(with generators on the GPU, see :mod:`.sampling`): only each row's token and log-prob come back.
With ``--torchgen-cuda-graphs`` the lean decoding steps replay captured CUDA graphs over a
:class:`plasmid_torchgen.kv_cache.FixedKV` (:mod:`.graphs`).

Decoding steps (``--torchgen-decoder``): ``lean`` runs :class:`plasmid_torchgen.lean.LeanStep`
over a :class:`plasmid_torchgen.kv_cache.StaticKV` (prefills still run the Hugging Face forward,
whose cache is then copied into preallocated buffers); ``hf``, and every model the lean step does
not support, runs the Hugging Face forward with its ``DynamicCache``.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch

from plasmid_torch.device import Placement
from plasmid_torch.hf import cache_argument
from plasmid_torch.lm_head import HIDDEN_ONLY, LMHead, last_hidden, token_logprobs
from plasmid_torch.ops import logprobs_from_logits
from plasmid_torch.prompts import shared_prompts
from plasmid_torchgen import kv_cache
from plasmid_torchgen.batch import DecodeBatch, Request
from plasmid_torchgen.graphs import DecodeGraphs
from plasmid_torchgen.lean import LeanStep, unsupported_reason
from plasmid_torchgen.routing import RoutingCapture
from plasmid_torchgen.sampling import sample_tokens
from plasmid_torchgen.stats import EngineStats


class Decoder:
    """Runs a Hugging Face causal LM over :class:`DecodeBatch` es.

    :param model: a causal LM in eval mode (its ``forward`` takes ``input_ids``, a 2-D
        ``attention_mask``, ``position_ids`` and a KV cache).
    :param shared_generator: noise of sampled rows without a seed.
    :param place: the device and autocast of forward passes (default: the CPU, float32).
    :param decoder: ``lean`` or ``hf`` (see the module docs); ``lean`` on a model it does not
        support decodes with ``hf`` (:attr:`decoder` says which runs, :attr:`lean_unsupported` why).
    :param graphs: run the lean steps through :class:`plasmid_torchgen.graphs.DecodeGraphs`,
        recording CUDA graphs when ``place`` is a GPU (on the CPU: the same fixed-shape path,
        eagerly; what the tests run).
    """

    def __init__(self, model: Any, shared_generator: torch.Generator, place: Placement | None = None,
                 decoder: str = "lean", graphs: bool = False) -> None:
        if decoder not in ("lean", "hf"):
            raise ValueError(f"torchgen Decoder: decoder must be 'lean' or 'hf', got {decoder!r}")
        self.model = model
        #: why the lean step cannot serve this model (``None``: it can)
        self.lean_unsupported = unsupported_reason(model)
        self._lean = LeanStep(model) if decoder == "lean" and self.lean_unsupported is None else None
        #: the decoding step that runs: ``lean`` or ``hf``
        self.decoder = "lean" if self._lean is not None else "hf"
        self.place = place if place is not None else Placement(torch.device("cpu"))
        self._graphs = DecodeGraphs(self._lean, capture=self.place.is_cuda) if graphs and self._lean else None
        self._spare: kv_cache.FixedKV | None = None
        self.shared_generator = shared_generator
        #: the counts of the step in progress (returned by :meth:`step`).
        self.stats = EngineStats()
        self.pad_token_id = 0  # any id: padded columns are masked out
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = cache_argument(model)
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        #: MoE routing capture (``--return-routed-experts``, set by the engine); ``None``: off
        self.routing: RoutingCapture | None = None

    def step(self, batch: DecodeBatch | None, admitted: list[Request],
             drop_abandoned: bool = False) -> tuple[DecodeBatch | None, list[Request], EngineStats]:
        """One decoding step of ``batch``, then the prefill of ``admitted`` joined into it.

        ``drop_abandoned``: first remove rows whose caller stopped waiting (the engine says
        when some did, so that the common step does not look at every row).

        :returns: the batch still decoding (``None`` when empty), the requests that finished, and
            what the step did (for the engine's counters).
        """
        started = time.perf_counter()
        self.stats = EngineStats()
        finished: list[Request] = []
        with torch.inference_mode():
            if batch is not None:
                if drop_abandoned:
                    batch.drop_abandoned()
                batch, done = self.decode(batch)
                finished += done
            if admitted:
                newcomers, done = self.prefill(admitted)
                finished += done
                if batch is None:
                    batch = newcomers
                    if batch is not None and self._graphs is not None:
                        self._fix(batch)
                elif newcomers is not None:
                    batch.join(newcomers)
        self.stats.busy_seconds += time.perf_counter() - started
        return batch, finished, self.stats

    def prefill(self, requests: list[Request]) -> tuple[DecodeBatch | None, list[Request]]:
        """Run the prompts (left-padded to the longest) and sample each first token.

        Requests with the same prompt (a GRPO group's samples, sent together) share one row of
        the pass: the row's last logits and its KV cache are copied to each of them before
        sampling, so a group of ``n`` costs one prompt's prefill, not ``n``. Each request's
        log-probs equal an unshared prefill's up to float rounding (a pass of fewer rows may round
        its matrix products differently; the tests compare them within 1e-5)."""
        prompts, rows = [r.prompt_ids for r in requests], None
        shared = shared_prompts(prompts)
        if shared is not None:  # one row per distinct prompt; ``rows`` maps each request to its row
            prompts, rows = [prompts[first] for first in shared[0]], shared[1]
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in prompts])
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
        cache = kv_cache.new_cache(self.model.config)
        logits = self._forward(input_ids, attention_mask, positions, cache)
        if self.routing is not None:
            self.routing.prefilled(requests, attention_mask, rows)
        room = max(r.params.max_new_tokens for r in requests) - 1  # tokens a row may still feed
        if self._lean is not None and room > 0:  # (room 0: every row ends with its first token, no copy)
            cache = kv_cache.StaticKV.from_dynamic(cache, min(room, kv_cache.RESERVE_COLUMNS))
        prompt_tokens = int(attention_mask.sum())
        if rows is not None:  # one row per request from here on
            index = torch.tensor(rows, dtype=torch.int64)
            kv_cache.select_rows(cache, index)
            logits, input_ids, attention_mask = logits[index.to(logits.device)], input_ids[index], attention_mask[index]
            self.stats.shared_prompt_tokens += int(attention_mask.sum()) - prompt_tokens
        batch = DecodeBatch(requests, cache, attention_mask, next_tokens=input_ids[:, -1:],
                            next_positions=attention_mask.sum(1, keepdim=True))
        self.stats.batches += 1
        self.stats.prompt_tokens += prompt_tokens
        return self._sample(batch, logits)

    def decode(self, batch: DecodeBatch) -> tuple[DecodeBatch | None, list[Request]]:
        """Feed each row's pending token and sample the next one."""
        if not len(batch):
            return None, []
        attention_mask = torch.cat([batch.attention_mask, torch.ones((len(batch), 1), dtype=torch.int64)], 1)
        if isinstance(batch.cache, kv_cache.StaticKV):
            logits = self._lean_step(batch, attention_mask)
        else:
            logits = self._forward(batch.next_tokens, attention_mask, batch.next_positions, batch.cache)
        if self.routing is not None:
            self.routing.decoded(batch.requests)
        batch.attention_mask = attention_mask
        batch.next_positions = batch.next_positions + 1
        self.stats.decode_steps += 1
        return self._sample(batch, logits)

    def weights_moved(self) -> None:
        """The served weights now live in other storage (shared with a trainer): recorded CUDA graphs,
        which read the old storage, are dropped. Called by the engine on its worker thread."""
        if self._graphs is not None:
            self._graphs.forget()

    def score(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        """Log-probs of ``token_ids[prompt_length:]`` from one forward pass without a cache."""
        return self.score_batch([(token_ids, prompt_length, temperature)])[0]

    def score_batch(self, rows: list[tuple[list[int], int, float]]) -> list[list[float]]:
        """Log-probs of each ``(token_ids, prompt_length, temperature)`` row's ``token_ids[prompt_length:]``,
        from ONE forward pass without a cache over the rows left-padded to the longest (as in
        :meth:`prefill`: padded columns are masked out, positions count only real tokens); the LM
        head runs on the scored positions only, a bounded number at a time
        (:func:`plasmid_torch.lm_head.token_logprobs`: no ``[rows, width, vocab]`` logits). Equal to
        scoring each row alone up to float rounding (the padded rows' matrix products differ in
        shape only). Every row needs ``1 <= prompt_length < len(token_ids)``."""
        with torch.inference_mode():
            width = max(len(tokens) for tokens, _, _ in rows)
            input_ids = torch.tensor([[self.pad_token_id] * (width - len(tokens)) + tokens for tokens, _, _ in rows])
            attention_mask = torch.tensor([[0] * (width - len(tokens)) + [1] * len(tokens) for tokens, _, _ in rows])
            place = self.place
            arguments: dict[str, Any] = {"input_ids": place.to_device(input_ids), "use_cache": False}
            if len(rows) > 1:  # one row alone keeps the exact single-sequence pass
                arguments["attention_mask"] = place.to_device(attention_mask)
                arguments["position_ids"] = place.to_device((attention_mask.cumsum(1) - 1).clamp(min=0))
            head = LMHead.of(self.model)
            scored: list[list[float]] = []
            with place.autocast():
                output = self.model(**arguments, **({} if head is None else HIDDEN_ONLY))
                outputs = output.logits if head is None else last_hidden(output)     # [rows, width, V or H]
                for row, (tokens, prompt_length, temperature) in enumerate(rows):
                    start = width - len(tokens) + prompt_length  # the column of the first scored token
                    picked, targets = outputs[row, start - 1:-1], input_ids[row, start:].to(outputs.device)
                    values = (logprobs_from_logits(picked, targets, temperature) if head is None
                              else token_logprobs(head, picked, targets, temperature)[0])
                    scored.append(values.tolist())
            return scored

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                 cache: kv_cache.DynamicCache) -> torch.Tensor:
        """``[rows, vocab]`` logits of the last input column, on the model's device; appends the inputs
        to ``cache``."""
        place = self.place
        with place.autocast():
            output = self.model(input_ids=place.to_device(input_ids), attention_mask=place.to_device(attention_mask),
                                position_ids=place.to_device(positions), use_cache=True,
                                **{self._cache_argument: cache}, **self._last_logits_only)
        self.stats.forward_rows += len(input_ids)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(input_ids))
        return output.logits[:, -1]

    def _lean_step(self, batch: DecodeBatch, attention_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`_forward` of one decoding step by :class:`LeanStep` (same logits, same counters)."""
        cache = batch.cache
        if cache.columns >= cache.capacity:
            room = max(r.params.max_new_tokens - len(r.token_ids) for r in batch.requests)
            cache.reserve(min(max(room, 1), kv_cache.RESERVE_COLUMNS))
        place = self.place
        graphs = self._graphs if isinstance(cache, kv_cache.FixedKV) else None
        step = self._lean if graphs is None else graphs
        counts = (graphs.captures, graphs.replays) if graphs is not None else (0, 0)
        with place.autocast():
            logits = step(place.to_device(batch.next_tokens), place.to_device(batch.next_positions),
                          place.to_device(attention_mask), cache)
        if graphs is not None:
            self.stats.graph_captures += graphs.captures - counts[0]
            self.stats.graph_replays += graphs.replays - counts[1]
        self.stats.forward_rows += len(batch)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch))
        return logits

    def _fix(self, batch: DecodeBatch) -> None:
        """Move a new batch's lean cache into fixed buffers (:class:`kv_cache.FixedKV`) for the
        graphs: the last finished batch's buffers when there are any (the graphs recorded for them
        stay valid), else new ones."""
        if type(batch.cache) is not kv_cache.StaticKV:
            return
        spare, self._spare = self._spare, None
        if spare is None:
            batch.cache = kv_cache.FixedKV.of(batch.cache)
        else:
            spare.refill(batch.cache)
            batch.cache = spare

    def _sample(self, batch: DecodeBatch, logits: torch.Tensor) -> tuple[DecodeBatch | None, list[Request]]:
        tokens, logprobs = sample_tokens(logits, batch.sampling, self.shared_generator)
        if tokens.device.type != "cpu":  # the rows' tokens and log-probs only, never the logits
            tokens, logprobs = tokens.cpu(), logprobs.cpu()
        self.stats.generated_tokens += len(batch)
        finished = batch.record(tokens, logprobs)
        if not len(batch) and isinstance(batch.cache, kv_cache.FixedKV):
            self._spare = batch.cache                    # the next batch's buffers (see _fix)
        return (batch if len(batch) else None), finished
