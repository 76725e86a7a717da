"""plasmid-mlflow: a run's options, metrics and header files in MLflow (see :mod:`plasmid_mlflow.plugin`)."""
