"""Benchmarks: every measurement in a fresh process; runner jobs are normal runs, read back from MLflow.

    python -m runner.bench grid          every model/variant x strategy x pipeline x N beside the runner's single
                                         device and Keras fit, one table per model/variant, then the targets
    python -m runner.bench strategies    the same for one model on 2 and 4 devices, the data-parallel strategies
    python -m runner.bench floors        each built-in model's step against its floor at 1, 2, 4 devices, MFU and
                                         Keras fit, in rounds
    python -m runner.bench settings      each speed setting's values side by side, as ratios to the group's default
    python -m runner.bench pipelines     the input pipeline alone against the training step, batches/s
    python -m runner.bench predicted     the cost model's predictions beside an experiment's measured runs
    python -m runner.bench published     spec-sheet predictions against published tables (runner/bench/published/)
    python -m runner.bench peers         a user's ResNet-20 against tf_cnn_benchmarks' (--peer DIR), or with --gpt
                                         the GPT against nanoGPT (--nanogpt DIR --python VENV/bin/python)

What each measures and prints, and how BENCHMARKS.md is made: docs/benchmarks.md. Runner jobs land in the MLflow
experiment `bench_<command>` with their config and devices.
"""
