"""plasmid-sync: weight transports from the trainer to the rollout engines (``--weight-sync``).

- ``inprocess`` (the default): the trainer's exported tensors handed straight to engines in the
  same process, bucket by bucket (:mod:`plasmid_sync.inprocess`);
- ``objectstore``: buckets through Ray's object store (:mod:`plasmid_sync.objectstore`; Ray runtime);
- ``broadcast``: a ``torch.distributed`` group of trainer rank 0 and the engines
  (:mod:`plasmid_sync.broadcast`; Ray runtime);
- ``disk``: versioned safetensors directories in Hugging Face layout (:mod:`plasmid_torch.disk_sync`);
- ``delta``: compressed XOR deltas against the previous sync, checksummed (:mod:`plasmid_sync.delta`).

Each does the work on the trainer's and the engines' side through :func:`plasmid.remote.run_on`,
so it runs wherever the runtime placed them.
"""
