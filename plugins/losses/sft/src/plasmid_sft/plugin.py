"""Hook implementations of plasmid-sft (torch is imported only when the loss is chosen)."""

from __future__ import annotations

from typing import Any

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid_sft.options import SFTMixOptions, SFTOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(SFTOptions)
    parser.add_options(SFTMixOptions)


@hookimpl
def plasmid_defaults(config: Config) -> None:
    """``--loss sft`` and ``--loss sft-mix`` train on the demonstrations ``--generate sft`` attaches: its default."""
    if getattr(config.option, "loss", None) in ("sft", "sft-mix"):
        config.set_default("generate", "sft")


@hookimpl
def plasmid_losses(register: Any) -> None:
    register("sft", "plasmid_sft.loss:SFTLoss")
    register("sft-mix", "plasmid_sft.mixed:SFTMixLoss")


@hookimpl
def plasmid_generate_fns(register: Any) -> None:
    register("sft", "plasmid_sft.generate:SFTGenerate")
