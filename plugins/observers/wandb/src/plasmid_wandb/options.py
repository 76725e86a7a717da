"""The options of plasmid-wandb."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class WandbOptions(Options, group="wandb", description="Weights & Biases tracking of a run (offline by default)"):
    wandb: bool = option(False, "log the run's config and every step's metrics to Weights & Biases")
    wandb_project: str = option("plasmid", "the W&B project")
    wandb_entity: str | None = option(None, "the W&B entity (team or user)", default_text="your default entity")
    wandb_name: str | None = option(None, "the W&B run name", default_text="the run directory's name")
    wandb_mode: Literal["offline", "online"] | None = option(
        None, "offline: written under <run dir>/wandb only, no network (upload later with `wandb sync`); online: "
        "streamed to the server", default_text="$WANDB_MODE, else online when WANDB_API_KEY is set, else offline")
