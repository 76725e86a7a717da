"""The options of plasmid-verifiers, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from typing import Literal

from plasmid.errors import UsageError
from plasmid.options import Options, option


class VerifiersOptions(Options, group="verifiers",
                       description="an installed verifiers environment (--datasource verifiers, --reward verifiers)"):
    vf_env: str | None = option(None, "the verifiers environment to load (verifiers.load_environment(NAME): the "
                                      "installed module NAME with '-' read as '_')", metavar="NAME")
    vf_env_args: str = option("{}", "keyword arguments of the environment's load_environment, a JSON object",
                              metavar="JSON")
    vf_seed: int | None = option(None, "seed of the training dataset's shuffle (each epoch is shuffled)", min=0,
                                 default_text="--seed")
    vf_arch: Literal["qwen2", "llama"] = option("qwen2", "architecture of the tiny model built when --model is "
                                                         "not given")

    def check(self) -> None:
        from plasmid_verifiers.vf import parse_env_args

        parse_env_args(self.vf_env_args)
        if self.vf_env is not None and not self.vf_env.strip():
            raise UsageError("--vf-env: give the name of an installed verifiers environment")
