"""Hook implementations of plasmid-jsonl: its options, their checks, the ``jsonl`` source."""

from __future__ import annotations

from pathlib import Path

from plasmid import hookimpl
from plasmid.errors import UsageError


@hookimpl
def plasmid_addoption(parser):
    group = parser.getgroup("jsonl", "prompts from .jsonl/.parquet files (--datasource jsonl)")
    group.addoption("--prompt-data", default=None, metavar="PATH", help="training prompts (.jsonl or .parquet)")
    group.addoption("--eval-prompt-data", default=None, metavar="PATH", help="evaluation prompts (default: none)")
    group.addoption("--input-key", default="prompt", help="the field holding the prompt")
    group.addoption("--label-key", default="label", help="the field holding the label (given to rewards)")
    group.addoption("--metadata-key", default="metadata", help="the field holding a metadata object")
    group.addoption("--apply-chat-template", action="store_true",
                    help="prompts are chat messages (or strings, as one user message) encoded with the "
                         "model's chat template and a generation prompt")
    group.addoption("--rollout-shuffle", action="store_true", help="shuffle the prompts each epoch (--seed + epoch)")
    group.addoption("--num-epochs", type=int, default=None, help="passes over --prompt-data (default: unlimited)")


@hookimpl
def plasmid_configure(config):
    option = config.option
    if option.datasource != "jsonl":
        return
    if not option.prompt_data:
        raise UsageError("--datasource jsonl needs --prompt-data PATH (a .jsonl or .parquet file)")
    for flag, path in (("--prompt-data", option.prompt_data), ("--eval-prompt-data", option.eval_prompt_data)):
        if path is not None and not Path(path).is_file():
            raise UsageError(f"{flag} {path}: no such file")
    if option.num_epochs is not None and option.num_epochs < 1:
        raise UsageError(f"--num-epochs must be >= 1, got {option.num_epochs}")


@hookimpl
def plasmid_datasources(register):
    register("jsonl", "plasmid_jsonl.source:JsonlSource")
