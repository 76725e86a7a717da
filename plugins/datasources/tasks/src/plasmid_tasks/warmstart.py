"""The supervised warm start the tasks' recipes give a freshly built tiny model before RL
(``--task toolcalc``'s demonstrations of the tool call, ``--task colours``' answer form): plain
next-token cross-entropy on chosen tokens, the same loop for every task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: one row of a warm-start batch: ``(input ids, targets)``, targets ``-100`` where nothing is learnt
Row = tuple[list[int], list[int]]
#: the forward call's extra keywords for a batch's padded ``[B, L]`` input ids (a VLM's images), or None
Extra = Callable[[Any], dict[str, Any]] | None


def supervised_steps(model: Any, next_batch: Callable[[], tuple[list[Row], Extra]], *, steps: int, lr: float,
                     pad_id: int) -> list[float]:
    """``steps`` AdamW steps (constant ``lr``, betas 0.9/0.99, gradients clipped to norm 1) of
    next-token cross-entropy on the batches ``next_batch()`` makes, right-padded with ``pad_id``;
    leaves ``model`` in eval mode. :returns: each step's loss."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99))
    model.train()
    losses = []
    for _ in range(steps):
        rows, extra = next_batch()
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in rows])
        labels = torch.tensor([targets + [-100] * (width - len(targets)) for _, targets in rows])
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels,
                     **(extra(input_ids) if extra is not None else {})).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
