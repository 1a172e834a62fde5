"""fedexp's Hydra plugins: the Optuna study sweeper (`hydra/sweeper=optuna_study`)."""
