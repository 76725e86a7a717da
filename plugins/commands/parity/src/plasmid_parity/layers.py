"""Where an engine and a trainer part: the same tokens replayed through each side's Hugging Face
module with forward hooks, compared layer by layer and sublayer by sublayer, and (MoE models) the
experts each side's routers chose.

Which sides can be searched (:func:`hf_module`): those holding the model in this process as a
``torch.nn.Module`` at ``.model`` with a list of decoder layers (torchgen, torchtrain; a LoRA or
other wrapper is looked through). An engine serving from another process (SGLang, vLLM) or a
trainer whose modules are not Hugging Face's (megatron) cannot be: :func:`hf_module` says why.

The replay is one forward pass per sequence without a cache or padding, in each side's compute
precision (its ``place.autocast()`` where it has one, as torchgen and torchtrain do). torchgen
scores with the same Hugging Face forward it is hooked here (its lean decoder runs only decoding
steps), so a divergence found here is one its scores carry.

Points compared, in the order the forward pass reaches them: the embeddings, then for each decoder
layer every direct child module as it returns (input norm, attention, post-attention norm, MLP or
MoE block: whatever the architecture has) and the layer's output, then the final norm. A point
differs when ``max|engine - trainer| / max|trainer|`` (the difference relative to the tensor's
scale) exceeds the bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plasmid_torch.routers import chosen_experts, moe_routers


def hf_module(side: Any, role: str, name: str) -> tuple[torch.nn.Module | None, str]:
    """``(module, "")`` when ``side`` (an engine or trainer) holds a Hugging Face causal LM at
    ``.model`` in this process, else ``(None, why)``: one line naming ``role`` and ``name``."""
    model = getattr(side, "model", None)
    if not isinstance(model, torch.nn.Module):
        return None, (f"{role} '{name}' holds no Hugging Face module in this process (it serves or trains "
                      f"elsewhere, or in its own layout), so its layers cannot be hooked")
    if not callable(getattr(model, "get_input_embeddings", None)) or getattr(model, "config", None) is None:
        return None, (f"the model of {role} '{name}' ({type(model).__name__}) is not a Hugging Face model, so it "
                      f"cannot be replayed beside the other side's")
    if decoder_layers(model) is None:
        return None, f"the model of {role} '{name}' ({type(model).__name__}) has no list of decoder layers to hook"
    return model, ""


def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """``(qualified name, layers)`` of the longest ``ModuleList`` named ``layers`` in ``model`` (the
    decoder layers of a Hugging Face causal LM, also under a LoRA wrapper), or ``None``."""
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers" and len(module)]
    return max(found, key=lambda item: len(item[1])) if found else None


def kind_of(child: str) -> str:
    """What a decoder layer's child is, for the report: attention, MLP, norm, or its own name."""
    lowered = child.lower()
    if "norm" in lowered:
        return "norm"
    if "attn" in lowered or "attention" in lowered:
        return "attention"
    if "mlp" in lowered or "moe" in lowered or "feed_forward" in lowered or "ffn" in lowered:
        return "MLP"
    return child


def first_tensor(output: Any) -> torch.Tensor | None:
    """A module's output tensor: itself, or the first element of a tuple (attention's weights and a
    MoE block's router logits come after the hidden states)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return getattr(output, "last_hidden_state", None)


@dataclass
class Point:
    """One hooked output: ``name`` (``embeddings``, ``layer 3 self_attn``, ``layer 3 output``,
    ``final norm``), its decoder ``layer`` (``None`` outside them) and ``kind``."""

    name: str
    layer: int | None
    kind: str


@dataclass
class Trace:
    """What one replay captured: each point's output (float32, on the CPU) in the order reached,
    and each MoE router's ``[tokens, top_k]`` choices in layer order."""

    points: list[tuple[Point, torch.Tensor]] = field(default_factory=list)
    routes: list[torch.Tensor] = field(default_factory=list)


@contextlib.contextmanager
def hooked(model: torch.nn.Module) -> Iterator[Trace]:
    """Forward hooks on ``model``'s embeddings, decoder layers and their children, final norm and
    MoE routers, filling the yielded :class:`Trace`; removed on exit."""
    trace = Trace()
    handles = []

    def keep(point: Point) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            tensor = first_tensor(output)
            if tensor is not None:
                trace.points.append((point, tensor.detach().float().cpu()))
        return hook

    def route(top_k: int) -> Any:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            trace.routes.append(chosen_experts(output, top_k).detach().cpu())
        return hook

    found = decoder_layers(model)
    assert found is not None, "hooked() needs a model with decoder layers (hf_module)"
    layers_name, layers = found
    try:
        embeddings = model.get_input_embeddings()
        handles.append(embeddings.register_forward_hook(keep(Point("embeddings", None, "embeddings"))))
        for index, layer in enumerate(layers):
            for child_name, child in layer.named_children():
                handles.append(child.register_forward_hook(keep(Point(f"layer {index} {child_name}", index,
                                                                      kind_of(child_name)))))
            handles.append(layer.register_forward_hook(keep(Point(f"layer {index} output", index, "output"))))
        parent = model.get_submodule(layers_name.rpartition(".")[0]) if "." in layers_name else model
        norm = getattr(parent, "norm", None)
        if isinstance(norm, torch.nn.Module):
            handles.append(norm.register_forward_hook(keep(Point("final norm", None, "norm"))))
        handles += [router.register_forward_hook(route(top_k)) for router, top_k in moe_routers(model)]
        yield trace
    finally:
        for handle in handles:
            handle.remove()


def replay(side: Any, model: torch.nn.Module, token_ids: Sequence[int]) -> Trace:
    """One forward pass of ``token_ids`` (no cache, no padding) through ``model`` with the hooks of
    :func:`hooked`, in ``side``'s precision (``side.place.autocast()`` where it has one)."""
    device = next(model.parameters()).device
    place = getattr(side, "place", None)
    autocast = place.autocast() if place is not None and hasattr(place, "autocast") else contextlib.nullcontext()
    with hooked(model) as trace, torch.no_grad(), autocast:
        model(input_ids=torch.tensor([list(token_ids)], device=device), use_cache=False)
    return trace


def relative_difference(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """``max|ours - theirs| / max|theirs|`` (``inf`` for a NaN, different shapes, or a difference
    against an all-zero tensor)."""
    if ours.shape != theirs.shape:
        return float("inf")
    gap = float((ours - theirs).abs().max()) if ours.numel() else 0.0
    if gap != gap:
        return float("inf")
    scale = float(theirs.abs().max()) if theirs.numel() else 0.0
    if gap == 0.0:
        return 0.0
    return gap / scale if scale > 0 else float("inf")


@dataclass
class LayerSearch:
    """Per point, the largest relative difference over the replayed sequences (in the order the
    forward pass reaches the points), and the MoE routing decisions compared.

    :ivar mismatch: set when the two sides reached different points (different architectures or
        module layouts): the first pair of names that differ.
    :ivar decisions: ``(token, MoE layer)`` routing decisions compared; :ivar differing: of those,
        how many chose a different set of experts.
    """

    points: list[Point] = field(default_factory=list)
    differences: list[float] = field(default_factory=list)
    mismatch: str = ""
    decisions: int = 0
    differing: int = 0

    def add(self, engine: Trace, trainer: Trace) -> None:
        """Fold in the traces of one sequence."""
        names = [point.name for point, _ in engine.points], [point.name for point, _ in trainer.points]
        if names[0] != names[1]:
            at = next((i for i, (a, b) in enumerate(zip(*names, strict=False)) if a != b), min(map(len, names)))
            pick = [side[at] if at < len(side) else "(nothing)" for side in names]
            self.mismatch = f"the two models run different modules: at point {at} the engine's is {pick[0]!r}, " \
                            f"the trainer's {pick[1]!r}"
            return
        if not self.points:
            self.points = [point for point, _ in engine.points]
            self.differences = [0.0] * len(self.points)
        for index, ((_, ours), (_, theirs)) in enumerate(zip(engine.points, trainer.points, strict=True)):
            self.differences[index] = max(self.differences[index], relative_difference(ours, theirs))
        for ours, theirs in zip(engine.routes, trainer.routes, strict=False):
            if ours.shape != theirs.shape:
                continue
            self.decisions += ours.shape[0]
            self.differing += int((ours.sort(-1).values != theirs.sort(-1).values).any(-1).sum())

    def first_divergence(self, bound: float) -> tuple[Point, float] | None:
        """The first point (in forward order) whose difference exceeds ``bound``, with it; ``None``
        when every point is within."""
        for point, difference in zip(self.points, self.differences, strict=True):
            if difference > bound:
                return point, difference
        return None

    def lines(self, bound: float) -> list[str]:
        """The report: the first divergence (or that there is none), then each layer's output."""
        if self.mismatch:
            return [f"layer search: {self.mismatch}"]
        first = self.first_divergence(bound)
        if first is None:
            out = [f"layer search: every layer and sublayer output agrees within {bound:g} (relative); the "
                   f"difference arises after the final norm (the LM head or the log-softmax) or in how each side "
                   f"batches its scoring pass"]
        else:
            point, difference = first
            where = f"layer {point.layer}, {point.name.split(' ', 2)[-1]} ({point.kind})" if point.layer is not None \
                else point.name
            if point.kind == "output" and point.layer is not None:
                where = f"layer {point.layer} (its output; no sublayer before it differs)"
            out = [f"first divergence: {where}: relative difference {difference:.3e} > {bound:g}; every point "
                   f"before it agrees"]
        out.append("  per layer output (max |engine - trainer| / max |trainer|):")
        out += [f"  {point.name:>24} {difference:.3e}" for point, difference in zip(self.points, self.differences,
                                                                                      strict=True)
                if point.kind in ("output", "embeddings") or point.name == "final norm"]
        return out


__all__ = ["LayerSearch", "Point", "Trace", "decoder_layers", "hf_module", "hooked", "relative_difference",
           "replay"]
