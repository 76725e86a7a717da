"""vLLM's engine arguments as ``--vllm-<field>`` options, generated from the installed version.

vLLM's ``EngineArgs`` (``vllm/engine/arg_utils.py``, a dataclass; ``AsyncEngineArgs`` adds a few
fields) lists every engine setting the OpenAI server takes on its command line. Importing it
pulls in torch and takes seconds, which ``plasmid_addoption`` (run by every ``plasmid`` command)
must not do, so the fields are read from the source files with :mod:`plasmid_serving.native_options`.

Every field whose name does not start with ``_`` becomes an option:

- a plain scalar annotation (``bool``, ``int``, ``float``, ``str``, a ``Literal``, ``X | None``)
  gets that type (``--vllm-max-num-seqs 8``, ``--vllm-enforce-eager``,
  ``--vllm-enable-prefix-caching false``);
- anything else (lists, dicts, vLLM's own type aliases such as ``ModelDType``) is ``text``: the
  string goes to vLLM's own command-line parser in the server process
  (``--vllm-dtype float32`` becomes ``--dtype float32``).

Values default to ``None``: "not given". Fields plasmid sets itself when not given are listed in
:data:`PLASMID_DEFAULTS` (values in :func:`plasmid_vllm.server.server_argv`); ``model`` is
``--model`` and is not an option.
"""

from __future__ import annotations

import functools
from pathlib import Path

from plasmid_serving.native_options import NativeField, class_fields, native_fields_of, package_directory

PREFIX = "vllm-"
ARG_UTILS = "engine/arg_utils.py"
CLASSES = ("AsyncEngineArgs",)  # its fields and EngineArgs's (its base)

#: Fields that are not ``--vllm-*`` options, with where the value comes from.
NOT_NATIVE = {"model": "--model"}

#: Fields plasmid fills in when not given, and why.
PLASMID_DEFAULTS = {
    "seed": "--seed plus the server's number in this process",
    "dtype": "the checkpoint's dtype (float32 checkpoints are served in float32)",
    "max_model_len": "1024 on cpu (the KV cache is sized for it)",
    "skip_tokenizer_init": "true: plasmid sends and reads token ids (false for a vision-language model: "
                           "vLLM's image processor needs the tokenizer; such a server also gets "
                           "--enable-scale-out, for /inference/v1/generate)",
    "logprobs_mode": "processed_logprobs: log-probs of the distribution sampled from (temperature applied)",
    "max_logprobs": "-1: score() away from temperature 1 reads every token's log-prob",
    "worker_extension_cls": "plasmid_vllm.worker.PlasmidWorkerExtension (tensor weight updates, get_weights)",
    "enable_sleep_mode": "true with --placement colocate on a GPU",
}


def vllm_source_root() -> Path | None:
    """The installed ``vllm/`` package directory (found without importing it), or ``None``."""
    return package_directory("vllm", marker=ARG_UTILS)


@functools.lru_cache(maxsize=4)
def native_fields(root: Path | None = None) -> tuple[NativeField, ...]:
    """Every ``AsyncEngineArgs`` field of the vLLM at ``root`` (default: the installed one) as an
    option, in declaration order (``EngineArgs``'s first); empty when vLLM is not installed."""
    root = root or vllm_source_root()
    if root is None:
        return ()
    sources = ((name, source) for name in CLASSES
               for source in class_fields(root / ARG_UTILS, name, root=root, package="vllm"))
    return native_fields_of(sources, PREFIX, skip=NOT_NATIVE)
