"""plasmid-verifiers: an installed ``verifiers`` environment as a plasmid data source, rollout and reward.

``--datasource verifiers --vf-env NAME`` serves the environment's dataset; the recipe makes the
rollout ``--generate agent --agent plasmid_verifiers.rollout:run`` (the environment's own rollout
loop, single-turn, multi-turn or tool, with an OpenAI client pointed at plasmid's agent gateway,
which records the engine's exact token ids and log-probs: nothing is re-tokenised) and the reward
``verifiers`` (its rubric's weighted score).
"""
