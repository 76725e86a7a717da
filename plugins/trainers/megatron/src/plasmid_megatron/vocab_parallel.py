"""Log-probs and entropy from vocabulary-parallel logits, without gathering the vocabulary.

Each tensor-parallel rank holds the logits of its slice ``[start, start + V_local)`` of the
(padded) vocabulary. With ``z = logits / temperature`` (float32; temperature 0 counts as 1, as in
:mod:`plasmid_torch.ops`) and the padding rows (ids ``>= vocab_size``) left out of the softmax:

- ``m = max_v z`` (all-reduce MAX over the tensor-parallel group; a constant for autograd),
- ``S = sum_v exp(z_v - m)`` (all-reduce SUM),
- ``log p(y) = z_y - m - log S`` (``z_y`` from the rank that holds ``y``, all-reduce SUM),
- ``H = m + log S - sum_v exp(z_v - m) z_v / S`` (all-reduce SUM).

The sums go through megatron's ``reduce_from_tensor_model_parallel_region`` (all-reduce forward,
identity backward), so gradients are those of the full-vocabulary computation. With one rank this
is exactly ``plasmid_torch.ops.logprobs_from_logits`` / ``entropy_from_logits`` up to float rounding.
Only ``[..., V_local]`` tensors and ``[...]`` reductions are communicated.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

#: a logit that exp() turns into exactly 0 in float32, without the nan gradients of -inf
MASKED_LOGIT = -1e30


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float, vocab_start: int,
                            vocab_size: int, tp_group: object = None, tp_size: int = 1,
                            with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` and (optionally) the entropy, from this rank's logits slice.

    :param logits: ``[..., V_local]`` this rank's vocabulary slice, any float dtype.
    :param targets: ``[...]`` int64 global token ids.
    :param temperature: sampling temperature (0 is treated as 1).
    :param vocab_start: the global id of this slice's first column.
    :param vocab_size: the real vocabulary size; columns at or beyond it are padding.
    :param tp_group: the tensor-parallel process group (``None`` with ``tp_size == 1``).
    :returns: ``([...] float32 log-probs, [...] float32 entropy or None)``.
    """
    scaled = logits.float()
    if temperature and temperature != 1.0:
        scaled = scaled / temperature
    local_vocab = scaled.shape[-1]
    ids = torch.arange(vocab_start, vocab_start + local_vocab, device=scaled.device)
    if vocab_start + local_vocab > vocab_size:
        scaled = torch.where(ids < vocab_size, scaled, torch.full_like(scaled, MASKED_LOGIT))

    peak = scaled.detach().max(dim=-1).values
    if tp_size > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = scaled - peak.unsqueeze(-1)
    exps = shifted.exp()
    sum_exp = _reduce(exps.sum(dim=-1), tp_group, tp_size)

    local_target = targets - vocab_start
    here = (local_target >= 0) & (local_target < local_vocab)
    picked = shifted.gather(-1, local_target.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1)
    target_shifted = _reduce(torch.where(here, picked, torch.zeros_like(picked)), tp_group, tp_size)
    log_sum_exp = sum_exp.log()
    logprobs = target_shifted - log_sum_exp

    entropy = None
    if with_entropy:
        weighted = _reduce((exps * shifted).sum(dim=-1), tp_group, tp_size)
        entropy = log_sum_exp - weighted / sum_exp
    return logprobs, entropy


def _reduce(tensor: torch.Tensor, group: object, size: int) -> torch.Tensor:
    if size == 1:
        return tensor
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor, group)
