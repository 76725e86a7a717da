"""Runs inside vLLM's worker processes: ``PlasmidWorkerExtension``, mixed into each worker with
vLLM's ``--worker-extension-cls plasmid_vllm.worker.PlasmidWorkerExtension`` (plasmid's default),
so that the engine reaches it through the server's ``/collective_rpc`` (development mode).
``/collective_rpc`` passes only strings, so tensors travel as base64 text of a safetensors file.

- :meth:`plasmid_load_weights`: load ``(Hugging Face name, tensor)`` pairs (a subset is fine)
  with the model's own ``load_weights`` (which maps checkpoint names onto vLLM's fused
  parameters: ``q/k/v_proj`` into ``qkv_proj``, ``gate/up_proj`` into ``gate_up_proj``).
- :meth:`plasmid_get_weights`: the served values of Hugging Face names, cut back out of the fused
  parameters (by the layer's ``output_sizes``), for verifying a sync bit for bit (on CPU: see
  :class:`PlasmidWorkerExtension` for why the loaded mirror answers).
- :meth:`plasmid_checksums`: CRC32s of the first rows of served tensors, computed in the worker
  (the weight syncs' loaded checksums).

This module imports torch and vLLM; plasmid's own process never imports it.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def encode_tensors(named: dict[str, Any]) -> str:
    """``{name: torch tensor}`` as base64 text of a safetensors file (CPU copies)."""
    from safetensors.torch import save

    return base64.b64encode(save({name: t.detach().cpu().contiguous() for name, t in named.items()})).decode()


def decode_tensors(text: str) -> dict[str, Any]:
    """The inverse of :func:`encode_tensors`."""
    from safetensors.torch import load

    return load(base64.b64decode(text))


class PlasmidWorkerExtension:
    """Methods added to every vLLM worker (``self`` is the worker; ``self.model_runner`` runs the model).

    On CPU, vLLM repacks every linear layer's weight for oneDNN after loading and drops the
    parameter (``dispatch_cpu_unquantized_gemm``), so a tensor update cannot be written into the
    parameters and they cannot be read back. There the worker keeps a mirror of the checkpoint
    in Hugging Face names (read from the directory it serves, updated by every tensor update),
    reloads all of it through vLLM's in-place ``reload_weights`` (which repacks), and
    ``plasmid_get_weights`` answers from the mirror, i.e. exactly what was loaded. On GPU the
    tensors go straight into the model's ``load_weights`` and are read back from the parameters.
    """

    def _plasmid_model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _plasmid_on_cpu(self) -> bool:
        return next(self._plasmid_model().parameters()).device.type == "cpu"

    def _plasmid_mirror(self) -> dict[str, Any]:
        """The CPU mirror (see the class docstring), read again when the served directory changed."""
        from pathlib import Path

        from safetensors.torch import load_file

        source = str(self.vllm_config.model_config.model)  # type: ignore[attr-defined]
        mirror = getattr(self, "_plasmid_state", None)
        if mirror is None or mirror[0] != source:
            tensors: dict[str, Any] = {}
            for file in sorted(Path(source).glob("*.safetensors")):
                tensors.update(load_file(str(file)))
            mirror = (source, tensors)
            self._plasmid_state = mirror
        return mirror[1]

    def plasmid_load_weights(self, payload: str) -> int:
        """Load the tensors of ``payload`` (:func:`encode_tensors`) into the served model; how many."""
        import torch

        named = decode_tensors(payload)
        if self._plasmid_on_cpu():
            mirror = self._plasmid_mirror()
            for name, tensor in named.items():
                target = "model.embed_tokens.weight" if name == "lm_head.weight" and name not in mirror else name
                mirror[target] = tensor
            self.model_runner.reload_weights(weights_iterator=iter(list(mirror.items())))  # type: ignore[attr-defined]
            _plain_cpu_linears(self._plasmid_model(), mirror)
            return len(named)
        model = self._plasmid_model()
        device = next(model.parameters()).device
        with torch.no_grad():
            model.load_weights(((name, tensor.to(device)) for name, tensor in named.items()))
        return len(named)

    def plasmid_reload_from_disk(self, path: str) -> None:
        """Reload every weight from the checkpoint directory ``path`` (vLLM's in-place reload; on
        CPU the linear layers then compute with the new weights, see :func:`_plain_cpu_linears`)."""
        self.model_runner.reload_weights(weights_path=path)  # type: ignore[attr-defined]
        self._plasmid_state = None  # the mirror is the directory's now (the same path may hold new files)
        if self._plasmid_on_cpu():
            _plain_cpu_linears(self._plasmid_model(), self._plasmid_mirror())

    def plasmid_get_weights(self, names_json: str) -> str:
        """The served values of the Hugging Face names in ``names_json`` (a JSON list), as
        :func:`encode_tensors` text; an unknown name raises ``KeyError`` naming it."""
        return encode_tensors(self._plasmid_served(json.loads(names_json)))

    def plasmid_checksums(self, requests_json: str) -> str:
        """``{name: CRC32}`` as JSON text for the ``[[name, rows], ...]`` of ``requests_json``: the
        :func:`plasmid_torch.sync_guard.loaded_checksum` of the first ``rows`` rows (0: all) of each
        served tensor, computed here in the worker, so only the numbers leave it (the weight syncs'
        loaded checksums, ``--sync-checksums``)."""
        from plasmid_torch.sync_guard import loaded_checksum

        requests = [(str(name), int(rows)) for name, rows in json.loads(requests_json)]
        served = self._plasmid_served([name for name, _ in requests])
        return json.dumps({name: loaded_checksum(served[name][:rows] if rows else served[name])
                           for name, rows in requests})

    def _plasmid_served(self, names: list[str]) -> dict[str, Any]:
        """``{name: served tensor}`` of Hugging Face names (see the class docstring)."""
        if self._plasmid_on_cpu():
            mirror = self._plasmid_mirror()
            out = {}
            for name in names:
                key = "model.embed_tokens.weight" if name == "lm_head.weight" and name not in mirror else name
                if key not in mirror:
                    raise KeyError(f"{name} is not a weight of the served model")
                out[name] = mirror[key]
            return out
        model = self._plasmid_model()
        params = dict(model.named_parameters())
        modules = dict(model.named_modules())
        packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
        return {name: _served(name, params, modules, packed) for name in names}


def _plain_cpu_linears(model: Any, mirror: dict[str, Any]) -> None:
    """Make every CPU linear layer compute ``F.linear`` with the mirror's weights (fused layers:
    their members' weights concatenated in ``packed_modules_mapping`` order). vLLM 0.32's in-place
    reload left the oneDNN handles it built at start-up in place, so a reloaded linear layer kept
    serving its old weights (measured: scores unchanged after an update of a ``down_proj``)."""
    import torch

    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    for module_name, module in model.named_modules():
        if not hasattr(module, "cpu_linear"):
            continue
        weight = getattr(module, "weight", None)
        if weight is not None and weight.numel() > 0:
            module.cpu_linear = torch.nn.functional.linear  # uses the (reloaded) parameter it is given
            continue
        parent, _, leaf = module_name.rpartition(".")
        members = packed.get(leaf, [leaf])
        names = [f"{parent}.{member}.weight" if parent else f"{member}.weight" for member in members]
        if not all(name in mirror for name in names):
            continue
        fused = torch.cat([mirror[name].to(torch.float32 if weight is None else weight.dtype) for name in names], 0)
        module.cpu_linear = lambda x, _weight, bias, _w=fused: torch.nn.functional.linear(x, _w.to(x.dtype), bias)


def _served(name: str, params: dict[str, Any], modules: dict[str, Any], packed: dict[str, list[str]]) -> Any:
    """The served tensor behind Hugging Face ``name`` (see :meth:`PlasmidWorkerExtension.plasmid_get_weights`)."""
    if name in params:
        return params[name].data
    if name == "lm_head.weight" and "model.embed_tokens.weight" in params:  # tied embeddings
        return params["model.embed_tokens.weight"].data
    parts = name.split(".")
    for fused, members in packed.items():
        for index, member in enumerate(members):
            if member in parts:
                position = parts.index(member)
                fused_name = ".".join(parts[:position] + [fused] + parts[position + 1:])
                if fused_name not in params:
                    continue
                layer = modules[".".join(parts[:position] + [fused])]
                sizes = list(getattr(layer, "output_sizes", []))
                if len(sizes) != len(members):
                    raise KeyError(f"{name}: cannot cut it out of {fused_name} (output sizes {sizes})")
                start = sum(sizes[:index])
                return params[fused_name].data.narrow(0, start, sizes[index])
    raise KeyError(f"{name} is not a weight of the served model")
