"""plasmid-tensorboard: a run's metrics as TensorBoard event files (see :mod:`plasmid_tensorboard.plugin`)."""
