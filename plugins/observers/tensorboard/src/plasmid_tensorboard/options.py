"""The options of plasmid-tensorboard."""

from __future__ import annotations

from pathlib import Path

from plasmid.options import Options, option


class TensorboardOptions(Options, group="tensorboard", description="TensorBoard event files of a run's metrics"):
    tensorboard: bool = option(False, "write every step's metrics as TensorBoard event files")
    tensorboard_dir: Path | None = option(None, "where the event files go", metavar="DIR",
                                          default_text="<run dir>/tensorboard")
