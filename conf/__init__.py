"""The configs (YAML): installed as the package data `runner.conf`, which is how the runner finds them."""
