"""The ``verifiers`` reward: the environment's rubric, as verifiers computes it."""

from __future__ import annotations

from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import RewardParts, Sample
from plasmid_verifiers import vf
from plasmid_verifiers.options import VerifiersOptions
from plasmid_verifiers.rollout import TOTAL_KEY

#: Where ``--generate agent`` puts what the agent function returned (plasmid-agent's contract).
AGENT_REWARD_KEY = "agent_reward"


class VerifiersReward:
    """Reward ``verifiers``: the rubric's weighted score (verifiers' ``state["reward"]``), with
    every rubric function's own score as a part (:class:`plasmid.types.RewardParts`: logged as
    ``rollout/reward/verifiers.<function>``, not added).

    A sample made by the environment's rollout (``--generate agent`` with
    :func:`plasmid_verifiers.rollout.run`) carries the score of its whole rollout state in
    ``metadata["agent_reward"]["reward"]``, which is returned (with the sum of the sample's per-step
    rewards, when the environment gave some, as the part ``turn_rewards``). Any other sample (another generate
    function, ``plasmid score``) is scored as a one-turn conversation: its response as the one
    assistant message of the completion, with the dataset row of its label
    (``{"env", "env_args", "row"}``, as the ``verifiers`` data source makes it). A label that is
    not such a row is a ``ValueError`` saying so.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (VerifiersOptions,)

    def __init__(self, config: Config) -> None:
        """Checks the verifiers version, imports what scoring needs and loads ``--vf-env`` (when
        given) now, so that no first call stalls its reward worker."""
        vf.check_version()
        vf.warm()
        options = VerifiersOptions.of(config)
        if options.vf_env is not None:
            vf.load_env(options.vf_env, vf.canonical_args(vf.parse_env_args(options.vf_env_args)))

    async def __call__(self, sample: Sample) -> RewardParts:
        recorded = sample.metadata.get(AGENT_REWARD_KEY)
        if isinstance(recorded, dict) and TOTAL_KEY in recorded:
            return RewardParts(float(recorded[TOTAL_KEY]),
                               {name: value for name, value in recorded.items() if name != TOTAL_KEY})
        label: Any = sample.label
        if not isinstance(label, dict) or "row" not in label or "env" not in label:
            raise ValueError(f"sample {sample.index}'s label is not a verifiers dataset row ({{'env', 'env_args', "
                             f"'row'}}): reward 'verifiers' scores the prompts of --datasource verifiers")
        env = vf.load_env(label["env"], vf.canonical_args(label.get("env_args") or {}))
        if vf.is_v1(env):
            raise ValueError(f"sample {sample.index}: --vf-env {label['env']} is a verifiers v1 taskset, whose "
                             f"tasks are scored on the trace of their own episode; make its samples with "
                             f"--generate agent --agent plasmid_verifiers.rollout:run (the recipe's default)")
        total, parts = await vf.score_completion(env, label["row"], [{"role": "assistant", "content": sample.response}])
        return RewardParts(total, {name: value for name, value in parts.items() if name != TOTAL_KEY})
