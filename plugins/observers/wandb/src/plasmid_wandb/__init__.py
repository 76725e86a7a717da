"""plasmid-wandb: a run's metrics in Weights & Biases (see :mod:`plasmid_wandb.plugin`)."""
