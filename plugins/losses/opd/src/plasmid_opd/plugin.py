"""Hook implementations of plasmid-opd (torch is imported only when the loss is chosen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid_opd.options import OPDOptions
from plasmid_torch.loss_options import PolicyGradientOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(OPDOptions)
    parser.add_options(PolicyGradientOptions)


@hookimpl
def plasmid_defaults(config: Config) -> None:
    """``--loss opd`` learns from the teacher's scores that ``--generate opd`` attaches: its default."""
    if getattr(config.option, "loss", None) == "opd":
        config.set_default("generate", "opd")


@hookimpl
def plasmid_configure(config: Config) -> None:
    """``--loss opd`` and ``--generate opd`` need ``--teacher-model``, an existing directory, and
    teacher engine options that :func:`plasmid_opd.generate.teacher_options` accepts (checked here,
    at start-up, rather than at the first generation)."""
    option = config.option
    if getattr(option, "loss", None) != "opd" and getattr(option, "generate", None) != "opd":
        return
    teacher = OPDOptions.of(config).teacher_model
    if not teacher:
        raise UsageError("--loss opd / --generate opd: --teacher-model is not set; give the teacher's local Hugging "
                         "Face model directory")
    if not Path(teacher).is_dir():
        raise UsageError(f"--teacher-model {teacher}: no such directory")
    if OPDOptions.of(config).teacher_engine or getattr(option, "engine", None):   # else no engine to check yet
        from plasmid_opd.generate import teacher_options

        teacher_options(config)


@hookimpl
def plasmid_losses(register: Any) -> None:
    register("opd", "plasmid_opd.loss:OPDLoss")


@hookimpl
def plasmid_generate_fns(register: Any) -> None:
    register("opd", "plasmid_opd.generate:OPDGenerate")
