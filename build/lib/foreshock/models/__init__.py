"""Labels, LightGBM training, evaluation, baselines, MLflow registry I/O and reliability maths."""
