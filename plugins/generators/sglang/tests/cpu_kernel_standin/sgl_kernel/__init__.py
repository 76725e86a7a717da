"""TEST SUPPORT ONLY, never shipped: a pure-PyTorch stand-in for the CPU build of ``sgl_kernel``.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``) imports a few ``*_cpu`` ops
from ``sgl_kernel`` unconditionally, and that CPU kernel package is not on PyPI. The tests put
this directory first on the ``PYTHONPATH`` of the SGLang servers they launch (through
``--sglang-server-env``), so that SGLang 0.5.23 can serve the tiny test models with the
``torch_native`` attention backend; model layers fall back to torch code on their own when the
AMX kernels are absent. Only the op that a tiny Llama/Qwen2 actually calls is implemented; any
other ``*_cpu`` op imports (SGLang imports several) and raises when called, naming itself.

On a GPU, or with a real CPU build of ``sgl_kernel``, none of this is used.
"""

__version__ = "0.0.0+plasmid-test-standin"


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """For each request ``i``: ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` gets the next
    ``end[i] - start[i]`` entries of ``out_cache_loc`` (the KV slots given to its new tokens)."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        req_to_token[row, start:end] = out_cache_loc[taken:taken + end - start]
        taken += end - start


def __getattr__(name):
    if name.endswith("_cpu"):
        def missing(*args, **kwargs):
            raise NotImplementedError(f"sgl_kernel test stand-in: {name} is not implemented (plasmid-sglang tests "
                                      f"serve tiny models that do not need it)")

        missing.__name__ = name
        return missing
    raise AttributeError(name)
