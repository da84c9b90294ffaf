"""Benchmarks: every measurement in a fresh process; runner jobs are normal runs, read back from MLflow.

Commands: `python -m runner.bench --help`; what each measures and prints, and how BENCHMARKS.md is made:
docs/benchmarks.md. Runner jobs land in the MLflow experiment `bench_<command>` with their config and devices.
"""
