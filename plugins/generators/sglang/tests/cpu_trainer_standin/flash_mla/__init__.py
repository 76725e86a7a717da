"""TEST SUPPORT ONLY: hides SGLang's ``flash_mla`` (sgl-flash-mla, a CUDA build) from a CPU trainer process.

The sglang env installs SGLang's CUDA kernels. On a machine without the CUDA runtime,
``import flash_mla`` raises ``OSError`` (its ``cuda.abi3.so`` cannot be loaded), and megatron-core
(``megatron/core/transformer/attention.py``) only catches ``ImportError`` when it probes for
FlashMLA: building the megatron trainer fails. First on the training subprocess's ``PYTHONPATH``
(``test_sglang_megatron_e2e.py``; never the servers'), this package makes the probe see what a
CPU machine has: no FlashMLA. On a GPU machine nothing puts it on the path.
"""

raise ImportError("flash_mla is hidden on the CPU (plasmid-sglang test support: cpu_trainer_standin)")
