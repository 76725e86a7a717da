"""The options of plasmid-hf-datasets, declared once: flags, help, checks and typed values.

The flags carry an ``hf-`` prefix so that they never clash with the jsonl source's
(``--input-key``, ``--num-epochs``...), which may be installed alongside."""

from __future__ import annotations

from plasmid.errors import UsageError
from plasmid.options import Options, option
from plasmid.records import Keys

#: The default of ``--hf-max-image-pixels`` (:data:`plasmid_torch.vision.MAX_IMAGE_PIXELS`, not imported:
#: the options load without torch).
MAX_IMAGE_PIXELS = 4096 * 4096


class HfDatasetOptions(Options, group="hf-datasets",
                       description="prompts from Hugging Face datasets files or saved datasets (--datasource hf)"):
    hf_path: str | None = option(None, "what datasets opens: a saved dataset directory (load_from_disk), a data "
                                       "file or directory of files, or a builder name (json, parquet, csv) with "
                                       "--hf-data-files", metavar="PATH")
    hf_data_files: tuple[str, ...] = option((), "data files for --hf-path's builder (repeat the flag; globs as "
                                                "datasets takes them)", metavar="FILE")
    hf_split: str = option("train", "the split of training prompts")
    hf_eval_split: str | None = option(None, "the split of evaluation prompts", default_text="none")
    hf_input_key: str = option("prompt", "the column holding the prompt; dotted (extra_info.question) reads nested "
                                         "columns (structs)")
    hf_label_key: str = option("label", "the column holding the label (given to rewards); dotted for nested columns "
                                        "(reward_model.ground_truth). Every row must have it, except that with the "
                                        "default a dataset without any 'label' column has no labels")
    hf_metadata_key: str = option("metadata", "the column holding a metadata object (dotted for nested columns)")
    hf_image_column: str | None = option(None, "the column of each row's images (a datasets Image feature or a list "
                                               "of them; bytes, paths or {bytes, path} structs) for a vision-language "
                                               "--model: they fill the prompt's {'type': 'image'} placeholders, or "
                                               "go first in its first user message; needs --hf-apply-chat-template",
                                         metavar="COLUMN", default_text="none")
    hf_max_image_pixels: int = option(MAX_IMAGE_PIXELS, "refuse at start-up an image (in the prompts or the image "
                                                        "column) of more pixels (width x height) than this", min=1)
    hf_apply_chat_template: bool = option(False, "prompts are chat messages (or strings, as one user message) "
                                                 "encoded with the model's chat template and a generation prompt")
    hf_max_prompt_tokens: int | None = option(None, "drop the rows whose encoded prompt has more tokens than this",
                                              min=1, default_text="keep all")
    hf_shuffle: bool = option(False, "shuffle the prompts each epoch (--seed + epoch)")
    hf_num_epochs: int | None = option(None, "passes over the training split", min=1, default_text="unlimited")

    def check(self) -> None:
        if self.hf_data_files and self.hf_path is None:
            raise UsageError("--hf-data-files needs --hf-path (the builder: json, parquet or csv)")
        if self.hf_image_column is not None and not self.hf_apply_chat_template:
            raise UsageError(f"--hf-image-column {self.hf_image_column}: images go into chat messages; add "
                             f"--hf-apply-chat-template")

    @property
    def keys(self) -> Keys:
        """Which column of a row holds what (``--hf-input-key``, ``--hf-label-key``,
        ``--hf-metadata-key``)."""
        return Keys(input=self.hf_input_key, label=self.hf_label_key, metadata=self.hf_metadata_key)
