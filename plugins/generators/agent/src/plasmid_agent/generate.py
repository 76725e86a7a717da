"""The ``agent`` generate function: each prompt sample is one run of the user's agent function
against the gateway; its recorded calls become the sample(s), its return value the reward (and,
when it gives one reward per call, each sample's per-turn rewards)."""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import numbers
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import ProviderError, UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid.model_limits import read_model_limits
from plasmid.options import Options
from plasmid.protocols import RolloutView
from plasmid.types import Sample, SamplingParams, Status
from plasmid_agent.gateway import Gateway, Rollout
from plasmid_agent.httpserver import Limits
from plasmid_agent.loader import load_agent
from plasmid_agent.options import AgentOptions
from plasmid_agent.recorder import Call, RecordedSample, record_samples
from plasmid_agent.session import AgentSession
from plasmid_agent.toolcalls import parsers_of
from plasmid_serving.images import takes_images
from plasmid_serving.parsers.options import ParserOptions
from plasmid_serving.turns import TURN_REWARDS_KEY, checked_turn_rewards

#: Where a finished sample carries the agent's reward (read by the ``agent`` reward).
REWARD_KEY = "agent_reward"
#: How many model calls the agent made for the sample (metadata).
CALLS_KEY = "agent_calls"
#: Why the agent failed, on the samples of a failed agent under ``--agent-errors zero`` (metadata).
ERROR_KEY = "agent_error"
#: Per-sample metric values, averaged by the rollout driver into ``rollout/<name>`` (see :func:`session_metrics`).
METRICS_KEY = "rollout_metrics"
#: The entry of an agent's dict reward that holds one reward per model call (see :func:`checked_reward`);
#: the same name as the samples' metadata key of per-turn rewards (:mod:`plasmid_serving.turns`).
TURNS_KEY = TURN_REWARDS_KEY

#: What an agent function may return, once checked (:func:`checked_reward`).
AgentValue = float | list[float] | dict[str, float | list[float]]


def session_metrics(calls: Sequence[Call], samples: int, seconds: float, failed: bool,
                    capped: bool = False) -> dict[str, float]:
    """The metric values each sample of one agent session carries (``metadata["rollout_metrics"]``),
    which the rollout driver averages over the step's kept samples into ``rollout/<name>``:

    - ``agent/calls_mean``: model calls the session made through the gateway;
    - ``agent/prompt_tokens_mean``, ``agent/completion_tokens_mean``: prompt and completion token
      ids of those calls, summed over the session (what the engine read and wrote; a prompt that
      extends an earlier call's counts whole, as OpenAI's ``usage`` does);
    - ``agent/samples_mean``: samples the session made; ``agent/branches_mean``: those beyond the
      first (branching calls, edited histories);
    - ``agent/seconds_mean``: wall-clock seconds the agent function ran;
    - ``agent/errors_fraction``: 1.0 for a session whose agent failed (``--agent-errors zero``);
    - ``agent/max_calls_fraction``: 1.0 for a session that hit ``--agent-max-calls``.

    A session's values are on each of its samples, so a session that made ``k`` samples weighs ``k``."""
    return {"agent/calls_mean": float(len(calls)),
            "agent/prompt_tokens_mean": float(sum(len(call.prompt_ids) for call in calls)),
            "agent/completion_tokens_mean": float(sum(len(call.completion_ids) for call in calls)),
            "agent/samples_mean": float(samples), "agent/branches_mean": float(max(samples - 1, 0)),
            "agent/seconds_mean": float(seconds), "agent/errors_fraction": float(failed),
            "agent/max_calls_fraction": float(capped)}


def prompt_messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sample's prompt as chat messages: a string is one user message; messages are copied."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return copy.deepcopy(list(prompt))


def checked_number(value: Any, where: str) -> float:
    """``value`` as a finite float; anything else is a ``TypeError``/``ValueError`` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} returned {type(value).__name__} {value!r}; return the reward: a float, a list of "
                        f"one float per model call, or a dict of named floats")
    if not math.isfinite(float(value)):
        raise ValueError(f"{where} returned the non-finite reward {value!r}")
    return float(value)


def checked_call_rewards(value: Any, where: str) -> list[float]:
    """``value`` as a non-empty list of finite floats (one per model call), or an error naming ``where``."""
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"{where} returned {value!r}; per-call rewards are a non-empty list of floats, one per model "
                        f"call")
    return [checked_number(item, f"{where}[{position}]") for position, item in enumerate(value)]


def checked_reward(value: Any, where: str) -> AgentValue:
    """The agent's return value as a reward, one of:

    - a finite real number: the reward of each of the session's samples;
    - a non-empty list of finite numbers, one per model call the gateway recorded for the session,
      in the order they were made (a request with ``n`` choices is ``n`` calls): per-call rewards
      (see :func:`sample_turn_rewards`);
    - a non-empty dict of named finite numbers, except the entry :data:`TURNS_KEY`
      (``"turn_rewards"``), which when present is such a list.

    Anything else is a ``TypeError``/``ValueError`` naming ``where`` (and the entry or position)."""
    if isinstance(value, dict):
        if not value or not all(isinstance(key, str) for key in value):
            raise TypeError(f"{where} returned {value!r}; a dict reward needs string keys and at least one entry")
        return {key: (checked_call_rewards(item, f"{where}[{key!r}]") if key == TURNS_KEY
                      else checked_number(item, f"{where}[{key!r}]")) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return checked_call_rewards(value, where)
    return checked_number(value, where)


def call_rewards_of(reward: AgentValue) -> list[float] | None:
    """The per-call rewards in a checked agent value, or ``None`` when it gives none."""
    if isinstance(reward, list):
        return reward
    if isinstance(reward, dict) and TURNS_KEY in reward:
        return reward[TURNS_KEY]  # type: ignore[return-value]
    return None


def sample_turn_rewards(recorded: RecordedSample, calls: Sequence[Call],
                        call_rewards: Sequence[float]) -> list[list[float]]:
    """``[[offset, reward], ...]`` of one sample (``metadata["turn_rewards"]``, :mod:`plasmid_serving.turns`):
    the reward of each call the sample holds, at the response position where its completion starts.
    A call that produced no token has no turn of its own: its reward joins the turn before it (the
    following turn when it comes first), so the turns add up to the rewards of the sample's calls."""
    turns: list[list[float]] = []
    pending = 0.0
    for position, offset in zip(recorded.calls, recorded.offsets, strict=True):
        reward = call_rewards[position]
        if not calls[position].completion_ids:
            if turns:
                turns[-1][1] += reward
            else:
                pending += reward
            continue
        turns.append([offset, reward + pending])
        pending = 0.0
    return turns


def sample_reward(reward: AgentValue, turns: list[list[float]] | None) -> float | dict[str, float]:
    """What one sample stores as ``metadata["agent_reward"]``: ``reward`` with its per-call rewards
    replaced by the sum of the sample's turns (a list becomes that float; a dict keeps its other
    entries, its :data:`TURNS_KEY` entry becomes the sum)."""
    total = math.fsum(turn_reward for _, turn_reward in turns) if turns is not None else 0.0
    if isinstance(reward, list):
        return total
    if isinstance(reward, dict):
        return {key: (total if key == TURNS_KEY else float(item)) for key, item in reward.items()}  # type: ignore[arg-type]
    return float(reward)


class AgentGenerate:
    """Generate function ``agent``: for each prompt sample, ``await FUNC(session)`` (a plain
    ``def`` runs in a thread) with an :class:`AgentSession` of its own, at most
    ``--agent-concurrency`` at once and each for at most ``--agent-timeout`` seconds.

    Returns the samples :func:`plasmid_agent.recorder.record_samples` makes of the agent's calls
    (one, or more when the agent branched; all in the prompt's group), each with the agent's
    reward in ``metadata["agent_reward"]`` and the session's metrics in
    ``metadata["rollout_metrics"]`` (:func:`session_metrics`). When the agent returns one reward
    per call (a list, or a dict's ``"turn_rewards"`` entry: :func:`checked_reward`), each sample
    gets ``metadata["turn_rewards"]`` (:func:`sample_turn_rewards`: the rewards of its calls at
    their completions' offsets), and its reward is their sum: ``metadata["agent_reward"]`` holds
    that sum in place of the list (:func:`sample_reward`). A list whose length is not the number
    of recorded calls is a failed agent. When the driver aborts the step
    (``ctx.aborting``, see :class:`plasmid.protocols.GenerateFn`) the agent is cancelled at once,
    and the gateway refuses its later calls, as it does once an engine call comes back aborted;
    the sample comes back as its prompt with status ``ABORTED``, to be run again from the start
    (an agent's own state cannot be resumed mid-conversation).

    An agent that raises, times out, returns no valid reward or makes no model call that produced
    a token is a *failed* agent. With ``--agent-errors raise`` (the default) it stops the run with
    a :class:`ProviderError` naming ``--agent`` and the sample (and what the gateway refused).
    With ``--agent-errors zero`` the run goes on: the samples of the calls it made get reward 0,
    ``metadata["agent_error"]`` (the one-line reason) and ``agent/errors_fraction`` 1.0; when it
    made no usable call, its one sample is the prompt followed by the EOS token with ``loss_mask``
    0 (nothing is trained on it, the group keeps its size); the first failure is printed once.
    A session that hit ``--agent-max-calls`` keeps the samples of its calls; if its agent then
    fails (it raised on the refused call, say), it is handled as under ``--agent-errors zero``
    whatever that option says: reward 0, not a stopped run (a cap is the run's limit, not an
    agent's bug).

    The gateway starts on the first call, on the rollout's event loop (again on a new loop).
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (AgentOptions, GeneralOptions, ParserOptions)

    def __init__(self, config: Config) -> None:
        options = AgentOptions.of(config)
        if options.agent is None:
            raise UsageError("--generate agent needs --agent MODULE:FUNC (or ./file.py:FUNC): the agent function "
                             "to run for each prompt")
        self.spec = options.agent
        self.func = load_agent(options.agent)
        self.concurrency = options.agent_concurrency
        self.timeout = options.agent_timeout
        self.model = options.agent_model
        model_dir = GeneralOptions.of(config).model
        #: the model's context, which the gateway refuses calls past (plasmid.model_limits)
        self.context = read_model_limits(model_dir).context if model_dir and Path(model_dir).is_dir() else None
        self.errors = options.agent_errors
        self.limits = Limits(max_body=options.agent_max_body, max_header_bytes=options.agent_max_header_bytes,
                             max_headers=options.agent_max_headers, idle_timeout=options.agent_idle_timeout)
        self.max_calls = options.agent_max_calls
        self.tool_parser, self.reasoning_parser = parsers_of(config)
        #: the policy's image processor when --model is a vision-language model (image parts are read)
        self.vision: Any = None
        self.image_limits: Any = None
        #: where a sample's images go in its metadata (plasmid_torch.vision.VISION_KEY), with ``vision``
        self.images_key: str | None = None
        self.policy = f"--model {model_dir}" if model_dir else "the policy"
        if model_dir and takes_images(str(model_dir)):
            from plasmid_torch.chat_images import ChatImages, ImageLimits
            from plasmid_torch.vision import VISION_KEY

            self.vision, self.images_key = ChatImages(model_dir), VISION_KEY
            self.image_limits = ImageLimits(options.agent_max_images, options.agent_max_image_pixels,
                                            options.agent_image_paths)
        self.reported = False
        self.gateway: Gateway | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._starting: asyncio.Lock | None = None

    async def _gateway_for(self, ctx: RolloutView) -> Gateway:
        loop = asyncio.get_running_loop()
        if self.gateway is not None and self.gateway.loop is loop:
            return self.gateway
        if self._starting is None or getattr(self._starting, "_plasmid_loop", None) is not loop:
            self._starting = asyncio.Lock()
            self._starting._plasmid_loop = loop  # type: ignore[attr-defined]
            self._semaphore = asyncio.Semaphore(self.concurrency)
        async with self._starting:
            if self.gateway is None or self.gateway.loop is not loop:
                gateway = Gateway(ctx.tokenizer, self.model, self.context, self.limits, self.max_calls,
                                  self.tool_parser, self.reasoning_parser, self.vision, self.image_limits,
                                  self.policy)
                await gateway.start()
                self.gateway = gateway
        return self.gateway

    async def shutdown(self) -> None:
        """Stop the gateway (it is also dropped with its event loop)."""
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample | list[Sample]:
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            return sample
        gateway = await self._gateway_for(ctx)
        assert self._semaphore is not None
        failure: ProviderError | None = None
        value: Any = None
        async with self._semaphore:
            rollout = gateway.open(ctx.engine_for(sample), params, aborting=ctx.aborting)
            began = time.perf_counter()
            try:
                value = await self._run(gateway, rollout, sample)
            except ProviderError as exc:
                failure = exc
            finally:
                gateway.close(rollout)
            seconds = time.perf_counter() - began
        if rollout.aborted:
            return self._aborted(sample)
        where = f"agent {self.spec} (--agent) on sample {sample.index}"
        reward: AgentValue = 0.0
        if failure is None:
            try:
                reward = checked_reward(value, where)
            except (TypeError, ValueError) as exc:
                failure = ProviderError(str(exc), provider="agent", plugin="plasmid-agent")
        call_rewards = call_rewards_of(reward)
        if failure is None and call_rewards is not None and len(call_rewards) != len(rollout.calls):
            failure = ProviderError(f"{where} returned {len(call_rewards)} per-call rewards for the "
                                    f"{len(rollout.calls)} model calls the gateway recorded; return one reward per "
                                    f"call, in the order made (a request with n choices is n calls)",
                                    provider="agent", plugin="plasmid-agent")
        recorded = record_samples(sample, rollout.calls,
                                  lambda ids: ctx.tokenizer.decode(ids, skip_special_tokens=True), self.images_key)
        samples = [made.sample for made in recorded]
        if not samples and failure is None:
            failure = ProviderError(f"{where} made no model call through the gateway that produced a token, so "
                                    f"there is nothing to train on; call session.base_url with session.api_key"
                                    + self._refused(rollout), provider="agent", plugin="plasmid-agent")
        if failure is not None:
            if self.errors == "raise" and not rollout.capped:
                raise failure
            reward = 0.0
            if not rollout.capped:  # a capped session is counted in rollout/agent/max_calls_fraction
                self._report(failure)
            if not samples:
                samples = [self._nothing_to_train(sample, ctx.tokenizer, ctx.engine_for(sample).weight_version)]
        metrics = session_metrics(rollout.calls, len(samples), seconds, failure is not None, rollout.capped)
        for position, out in enumerate(samples):
            turns = None
            if failure is None and call_rewards is not None:
                turns = sample_turn_rewards(recorded[position], rollout.calls, call_rewards)
                checked_turn_rewards(turns, out.response_length, where)
                out.metadata[TURN_REWARDS_KEY] = turns
            out.metadata[REWARD_KEY] = sample_reward(reward, turns)
            out.metadata[CALLS_KEY] = len(rollout.calls)
            out.metadata[METRICS_KEY] = dict(metrics)
            if failure is not None:
                out.metadata[ERROR_KEY] = str(failure)
        return samples if len(samples) > 1 else samples[0]

    def _report(self, failure: ProviderError) -> None:
        """Print the first failure of the run (``--agent-errors zero``), once."""
        if not self.reported:
            self.reported = True
            print(f"plasmid: {failure} (--agent-errors zero: its samples get reward 0, counted in "
                  f"rollout/agent/errors_fraction; later failures are not printed)", file=sys.stderr)

    @staticmethod
    def _nothing_to_train(sample: Sample, tokenizer: Any, weight_version: int) -> Sample:
        """The one sample of a failed agent that made no usable call: the prompt, then EOS with
        ``loss_mask`` 0 (the trainer needs one response token; none is trained on)."""
        eos = tokenizer.eos_token_id
        end = int(eos) if eos is not None else int(sample.prompt_tokens[-1])
        return replace(sample, tokens=[*sample.prompt_tokens, end], response="", response_length=1, loss_mask=[0],
                       rollout_logprobs=[0.0], status=Status.COMPLETED, weight_version=weight_version, reward=None,
                       reward_components={}, metadata=dict(sample.metadata))

    async def _run(self, gateway: Gateway, rollout: Rollout, sample: Sample) -> Any:
        session = AgentSession(base_url=gateway.base_url(rollout.key), api_key=rollout.key, model=self.model,
                               messages=prompt_messages(sample.prompt), label=copy.deepcopy(sample.label),
                               metadata=copy.deepcopy(sample.metadata), index=sample.index,
                               group_index=sample.group_index)
        where = f"agent {self.spec} (--agent) on sample {sample.index}"
        try:
            if inspect.iscoroutinefunction(self.func):
                pending = self.func(session)
            else:
                pending = asyncio.to_thread(self.func, session)
            value = await self._unless_aborted(rollout, asyncio.wait_for(pending, self.timeout))
            if inspect.isawaitable(value) and not rollout.aborted:
                value = await self._unless_aborted(rollout, asyncio.wait_for(value, self.timeout))
            return None if rollout.aborted else value
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            if rollout.aborted:
                return None
            raise ProviderError(f"{where} ran past --agent-timeout {self.timeout:g}s" + self._refused(rollout),
                                provider="agent", plugin="plasmid-agent") from None
        except Exception as exc:
            if rollout.aborted:
                return None
            raise ProviderError(f"{where} raised {type(exc).__name__}: {exc}" + self._refused(rollout),
                                provider="agent", plugin="plasmid-agent") from exc

    @staticmethod
    async def _unless_aborted(rollout: Rollout, work: Any) -> Any:
        """``work``'s result; when the step's abort (``rollout.aborting``) comes first, the agent is
        cancelled (a plain ``def`` agent's thread cannot be: it runs on, its calls refused), the
        rollout marked aborted and ``None`` returned."""
        task = asyncio.ensure_future(work)
        if rollout.aborting is None:
            return await task
        stop = asyncio.ensure_future(rollout.aborting.wait())
        try:
            await asyncio.wait((task, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            rollout.aborted = True
            return None
        return task.result()

    @staticmethod
    def _refused(rollout: Rollout) -> str:
        return f" (the gateway's last error: {rollout.errors[-1]})" if rollout.errors else ""

    @staticmethod
    def _aborted(sample: Sample) -> Sample:
        """The sample as its prompt, ``ABORTED``, with an empty response (mask and log-probs ``[]``,
        consistent as :class:`~plasmid.protocols.GenerateFn` asks), to be run again from the start."""
        return replace(sample, tokens=sample.prompt_tokens, response="", response_length=0, loss_mask=[],
                       rollout_logprobs=[], status=Status.ABORTED,
                       metadata={k: v for k, v in sample.metadata.items()
                                 if k not in (REWARD_KEY, CALLS_KEY, ERROR_KEY, METRICS_KEY, TURN_REWARDS_KEY)})
