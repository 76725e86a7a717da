"""Log-probs and entropy of chosen tokens from a causal LM's last hidden states, in bounded memory
(imports torch).

A forward pass that returns ``[tokens, vocab]`` logits for every position of a micro-batch is
what runs RL trainers out of memory on real models: at a 49,152-token vocabulary, 32 samples of
230 tokens hold 1.4 GB of float32 logits, and the log-softmax, its exponential and their
gradients hold several times that. Here the model runs without its LM head
(:data:`HIDDEN_ONLY`: the head is applied to the last position only, and the last hidden states
come back), the caller picks the positions it needs (the response tokens), and
:func:`token_logprobs` applies the head to them :data:`LOGITS_CHUNK_ELEMENTS` logits at a time.
Under autograd each chunk is recomputed in the backward pass (``torch.utils.checkpoint``), so at
most one chunk's logits exist at once, forward and backward. A batch that fits one chunk (the
tiny quickstart models) is computed in one piece, as before.

The numbers are those of :mod:`plasmid_torch.ops` on the model's own logits, to float rounding:
the head's matrix product runs over fewer rows, which may round differently.

Callers: plasmid-torchtrain's policy and reference passes, torchgen's scoring pass (OPD teachers).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from plasmid_torch import ops

#: Float32 logits held at once per chunk: 16M elements, 64 MiB (341 tokens at a 49,152 vocabulary,
#: 110 at 151,936). The log-softmax and entropy hold about three times that while a chunk runs.
LOGITS_CHUNK_ELEMENTS = 1 << 24

#: What to pass to a Hugging Face causal LM's forward so that it computes the LM head for one
#: position only and returns every layer's hidden states (the last one: the final norm's output,
#: what the head reads).
HIDDEN_ONLY: dict[str, Any] = {"logits_to_keep": 1, "output_hidden_states": True}


def last_hidden(output: Any) -> torch.Tensor:
    """``[B, L, H]``: the hidden states the LM head reads, from an output of a forward pass made
    with :data:`HIDDEN_ONLY`."""
    hidden: torch.Tensor = output.hidden_states[-1]
    return hidden


class LMHead:
    """The output layer of a Hugging Face causal LM (or a peft model around one) as a function of
    its last hidden states: ``[n, H] -> [n, V]`` float32 logits, with the model's own logit
    transforms (Gemma's ``final_logit_softcapping``, Granite's ``logits_scaling``, Cohere's
    ``logit_scale``). :meth:`of` returns ``None`` for a model without an output embedding."""

    def __init__(self, module: torch.nn.Module, config: Any, scale: float = 1.0) -> None:
        self.module = module
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.softcap = getattr(text, "final_logit_softcapping", None)
        scaling = getattr(text, "logits_scaling", None)
        self.scale = scale / scaling if scaling else scale
        weight = module.weight
        assert isinstance(weight, torch.Tensor)
        self.vocab_size = int(weight.shape[0])

    _cache: weakref.WeakKeyDictionary[Any, LMHead | None] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, model: Any) -> LMHead | None:
        """``model``'s head (cached per model object): a causal LM, a peft model, or a wrapper with
        a ``model`` attribute (plasmid-torchtrain's ``AdaptersDisabled``); ``None`` when it has no
        ``get_output_embeddings``."""
        target = model
        while not callable(getattr(target, "get_output_embeddings", None)) and hasattr(target, "model"):
            target = target.model
        try:
            return cls._cache[target]
        except (KeyError, TypeError):
            pass
        module = target.get_output_embeddings() if callable(getattr(target, "get_output_embeddings", None)) else None
        base = target.get_base_model() if callable(getattr(target, "get_base_model", None)) else target
        head = None if module is None else cls(module, target.config, float(getattr(base, "logit_scale", 1.0)))
        cls._cache[target] = head
        return head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` hidden states -> ``[n, V]`` float32 logits."""
        logits: torch.Tensor = self.module(hidden).float()
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk at ``vocab_size``: :data:`LOGITS_CHUNK_ELEMENTS` logits, at least one token."""
    return max(1, LOGITS_CHUNK_ELEMENTS // max(1, vocab_size))


def token_logprobs(head: LMHead, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float, *,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``tokens`` (and the entropy of each distribution) under ``softmax(head(hidden)
    / temperature)``, :func:`chunk_tokens` tokens at a time.

    Runs under the caller's grad mode and autocast; under autograd a batch of several chunks
    recomputes each chunk's logits in the backward pass instead of keeping them.

    :param hidden: ``[N, H]`` last hidden states, the one at position ``p`` predicting
        ``tokens[p]``.
    :param tokens: ``[N]`` int64 on ``hidden``'s device.
    :param temperature: as :func:`plasmid_torch.ops.logprobs_from_logits` (0 is taken as 1).
    :returns: ``([N] float32 log-probs, [N] float32 entropy in nats or None)``.
    """
    size = chunk_tokens(head.vocab_size)
    count = int(hidden.shape[0])
    if count <= size:
        return _chunk(head, hidden, tokens, temperature, with_entropy)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(
        parameter.requires_grad for parameter in head.module.parameters()))
    logprobs: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for start in range(0, count, size):
        part = (head, hidden[start:start + size], tokens[start:start + size], temperature, with_entropy)
        logprob, entropy = checkpoint(_chunk, *part, use_reentrant=False) if recompute else _chunk(*part)
        logprobs.append(logprob)
        if entropy is not None:
            entropies.append(entropy)
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None


def _chunk(head: LMHead, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
           with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = head.logits(hidden)
    logprobs = ops.logprobs_from_logits(logits, tokens, temperature)
    return logprobs, ops.entropy_from_logits(logits, temperature) if with_entropy else None
