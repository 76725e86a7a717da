"""The token ids that end a response in a run: the model's end-of-sequence ids, then
``--stop-token-ids``; one rule for training rollouts and evaluation (both sample with
:attr:`plasmid.context.RolloutContext.sampling`'s ids).

The model's ids are the tokenizer's: ``eos_ids`` where it has them
(:class:`~plasmid.protocols.SupportsEosIds`; the ``hf`` tokenizer lists ``eos_token_id`` and
every ``eos_token_id`` of the model's ``config.json`` and ``generation_config.json``), else its
``eos_token_id``. The tokenizer's ``eos_token_id`` comes first: what appends one EOS to a
response (the ``sft`` loss's labels) takes the first.
"""

from __future__ import annotations

from pathlib import Path

from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.model_limits import read_model_limits
from plasmid.options import HoldsOptions
from plasmid.protocols import SupportsEosIds, Tokenizer


def stop_token_ids(config: HoldsOptions, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The run's stop ids (module docstring), each once, in order; ``--stop-token-ids`` past the
    model's vocabulary is a :class:`UsageError` (:func:`check_stop_token_ids`)."""
    check_stop_token_ids(config)
    if isinstance(tokenizer, SupportsEosIds):
        model_ids = [tokenizer.eos_token_id, *tokenizer.eos_ids]
    else:
        model_ids = [tokenizer.eos_token_id]
    ids = [int(token) for token in model_ids if token is not None]
    return tuple(dict.fromkeys([*ids, *RolloutOptions.of(config).extra_stop_ids]))


def check_stop_token_ids(config: HoldsOptions) -> None:
    """Every ``--stop-token-ids`` id is below the ``vocab_size`` of ``--model``'s ``config.json``
    (when the directory exists and says); else one :class:`UsageError` line naming the id."""
    extra = RolloutOptions.of(config).extra_stop_ids
    model = GeneralOptions.of(config).model
    if not extra or not model or not Path(model).is_dir():
        return
    vocab = read_model_limits(model).vocab_size
    for token in extra:
        if vocab is not None and token >= vocab:
            raise UsageError(f"--stop-token-ids: {token} is not a token id of the model at {model}, whose "
                             f"vocabulary has ids 0..{vocab - 1} (vocab_size in config.json)")
