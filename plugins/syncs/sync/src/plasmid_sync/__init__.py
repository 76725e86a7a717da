"""plasmid-sync: weight transports from the trainer to the rollout engines (``--weight-sync``).

``inprocess`` (the default) hands the trainer's exported tensors straight to engines living in
the same process, bucket by bucket (:mod:`plasmid_sync.inprocess`).
"""
