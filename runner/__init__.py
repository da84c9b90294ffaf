"""Configuration-driven experiment runner for multi-device TensorFlow training (Hydra + MLflow)."""
