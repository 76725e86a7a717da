"""The options of plasmid-jsonl, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from pathlib import Path

from plasmid.errors import UsageError
from plasmid.options import Options, option
from plasmid_jsonl.reader import Keys


class JsonlOptions(Options, group="jsonl", description="prompts from .jsonl/.parquet files (--datasource jsonl)"):
    prompt_data: Path | None = option(None, "training prompts (.jsonl or .parquet)", metavar="PATH")
    eval_prompt_data: Path | None = option(None, "evaluation prompts", metavar="PATH", default_text="none")
    input_key: str = option("prompt", "the field holding the prompt; a dotted key (extra_info.question) reads "
                                      "nested objects")
    label_key: str = option("label", "the field holding the label (given to rewards); dotted for nested objects "
                                     "(verl: reward_model.ground_truth). Every row must have it, except that with "
                                     "the default a file without any 'label' field has no labels")
    metadata_key: str = option("metadata", "the field holding a metadata object (dotted for nested objects)")
    image_key: str | None = option(None, "the field holding each row's images for a vision-language --model (one "
                                         "image or a list: a path relative to the file, a data URL, bytes or a "
                                         "{bytes, path} struct, as datasets writes an Image column to parquet); "
                                         "they fill the prompt's {'type': 'image'} placeholders, or go first in "
                                         "its first user message; needs --apply-chat-template", metavar="KEY",
                                   default_text="none")
    max_image_pixels: int = option(4096 * 4096, "refuse at start-up an image (in the prompts or under --image-key) "
                                                "of more pixels (width x height) than this", min=1)
    apply_chat_template: bool = option(False, "prompts are chat messages (or strings, as one user message) encoded "
                                              "with the model's chat template and a generation prompt")
    rollout_shuffle: bool = option(False, "shuffle the prompts each epoch (--seed + epoch)")
    num_epochs: int | None = option(None, "passes over --prompt-data", min=1, default_text="unlimited")

    def check(self) -> None:
        if self.image_key is not None and not self.apply_chat_template:
            raise UsageError(f"--image-key {self.image_key}: images go into chat messages; add --apply-chat-template")

    @property
    def keys(self) -> Keys:
        """Which field of a row holds what (``--input-key``, ``--label-key``, ``--metadata-key``);
        the data source requires the label in every row when ``--label-key`` is given."""
        return Keys(input=self.input_key, label=self.label_key, metadata=self.metadata_key)
