"""Hook implementations of plasmid-hf (transformers is imported only when the tokenizer is built)."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions


@hookimpl(specname="plasmid_defaults", tryfirst=True)
def resolve_hub_model(config: Config) -> None:
    """A ``--model`` the user gave that is not a path but a hub id (``Qwen/Qwen2.5-0.5B``) is
    replaced by its snapshot directory in the Hugging Face cache (downloaded first when the
    network is allowed; :func:`plasmid_hf.hub.resolve_model`), before every other defaults hook
    and every check, so all of them, and every provider, see a directory. An id that cannot be
    resolved is one ``UsageError`` line naming it, before anything of the run is written. Done
    whichever tokenizer is chosen: a hub id names a Hugging Face model for every consumer."""
    model = config.option.model
    if not config.is_given("model") or not isinstance(model, str):
        return
    from plasmid_hf.hub import looks_like_hub_id, resolve_model

    if looks_like_hub_id(model):
        config.option.model = resolve_model(model)


@hookimpl
def plasmid_configure(config: Config) -> None:
    """When ``hf`` is the chosen tokenizer, a ``--model`` directory without tokenizer files is
    refused now, before anything is built or written (transformers would load an empty one)."""
    model = GeneralOptions.of(config).model
    if config.option.tokenizer == "hf" and model:
        from plasmid_hf.tokenizer import check_tokenizer_files

        check_tokenizer_files(model)


@hookimpl
def plasmid_tokenizers(register: Callable[..., None]) -> None:
    register("hf", "plasmid_hf.tokenizer:model_tokenizer", default=True)
