"""``--model`` as a Hugging Face hub id: resolved to its snapshot directory in the local cache.

Why here: the kernel has no huggingface_hub dependency, and plasmid-hf (the default tokenizer)
already depends on transformers, hence on huggingface_hub. Every consumer of ``--model`` (the
tokenizer, trainers, engines, data sources) reads a directory; this module turns an id into one
at start-up, once, before anything is built or written, so none of them needs to know about ids.
"""

from __future__ import annotations

import os
from pathlib import Path

from plasmid.errors import UsageError

#: Values of ``HF_HUB_OFFLINE`` that mean "no network" (huggingface_hub's own set).
_TRUE = {"1", "ON", "YES", "TRUE"}


def looks_like_hub_id(model: str) -> bool:
    """Whether ``model`` reads as a hub id (``name`` or ``org/name``, as huggingface_hub's
    ``validate_repo_id`` accepts) and not as a path: nothing exists at it and it does not start
    with ``.``, ``/`` or ``~`` (``./model``, ``runs/x/model`` stay paths for the kernel's check)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not model or Path(model).exists() or model[0] in "./~" or model.count("/") > 1:
        return False
    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def network_allowed() -> bool:
    """False when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set true, read now (not at
    huggingface_hub's import), so a command line's environment is what counts."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() not in _TRUE


def cache_dir() -> str | None:
    """``HF_HUB_CACHE`` read now, or ``None`` for huggingface_hub's default (``HF_HOME``/hub)."""
    return os.environ.get("HF_HUB_CACHE") or None


def resolve_model(model: str) -> str:
    """The local snapshot directory of hub id ``model`` (``models--org--name/snapshots/<rev>``
    under the Hugging Face cache, the revision that ``refs/main`` names).

    From the cache only when the network is not allowed (``HF_HUB_OFFLINE=1``); otherwise
    downloaded (or brought up to date) with ``snapshot_download``. Refused with one
    :class:`UsageError` line naming the id when it is neither cached nor downloadable.
    """
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    offline = not network_allowed()
    try:
        return str(huggingface_hub.snapshot_download(model, cache_dir=cache_dir(), local_files_only=offline))
    except (LocalEntryNotFoundError, HfHubHTTPError, HFValidationError, OSError, ValueError) as exc:
        where = cache_dir() or huggingface_hub.constants.HF_HUB_CACHE
        if offline:
            raise UsageError(
                f"--model {model}: not a directory, and not in the Hugging Face cache {where} (HF_HUB_OFFLINE=1: "
                f"no download); give a local model directory, or download it first (huggingface-cli download "
                f"{model}) or unset HF_HUB_OFFLINE"
            ) from exc
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(
            f"--model {model}: not a directory, not in the Hugging Face cache {where}, and it could not be "
            f"downloaded ({type(exc).__name__}: {reason[:300]})"
        ) from exc
