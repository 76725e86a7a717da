"""The options of plasmid-reasoning-gym, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class ReasoningGymOptions(Options, group="reasoning-gym",
                          description="reasoning-gym tasks (--datasource reasoning-gym, --reward reasoning-gym)"):
    rg_dataset: tuple[str, ...] = option(("basic_arithmetic",), "a reasoning-gym dataset NAME[:WEIGHT], repeatable: "
                                                                "the training prompts are a weighted mixture",
                                         metavar="NAME[:WEIGHT]")
    rg_size: int = option(10000, "training entries per epoch (each dataset is generated with this size)", min=1)
    rg_eval_size: int = option(100, "held-out eval entries, generated with a seed of their own", min=1)
    rg_seed: int | None = option(None, "seed of the generated entries and of the mixture", min=0,
                                 default_text="--seed")
    rg_config: tuple[str, ...] = option((), "a dataset's config field NAME.KEY=VALUE, repeatable (VALUE is JSON "
                                            "when it parses as JSON, @PATH a YAML or JSON file, else a string); "
                                            "composite's mixture: composite.datasets=[{\"name\": ..., \"weight\": "
                                            "..., \"config\": {...}}, ...] or =@mix.yaml",
                                        metavar="NAME.KEY=VALUE")
    rg_system_prompt: str = option("default", "reasoning-gym system prompt put before each question (a key of "
                                              "reasoning_gym.utils.SYSTEM_PROMPTS, or 'none')")
    rg_answer_format: Literal["tags", "last-line", "none"] = option(
        "tags", "what the reward scores: the last <TAG>...</TAG> of the response (no tags: no answer), its last "
                "non-empty line, or the whole response")
    rg_answer_tag: str = option("answer", "the tag of --rg-answer-format tags")
    rg_arch: Literal["qwen2", "llama"] = option("qwen2", "architecture of the tiny model built when --model is "
                                                         "not given")
