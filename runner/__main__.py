"""`python -m runner`: the same command as the `runner` console script (runner/cli/main.py)."""

from runner.cli.main import cli

if __name__ == "__main__":
    cli()
