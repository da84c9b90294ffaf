"""The command line: the thin `@hydra.main` entry and its subcommands (report, check, predict, replay); one-line errors
and exit status."""
