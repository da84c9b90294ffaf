"""`runner replay JOURNAL`: send the writes a run kept in its journal (runner/tracking/journal.py) to the store."""

from __future__ import annotations

import sys
from pathlib import Path

from runner.cli.arguments import Parser
from runner.errors import one_line
from runner.tracking.journal import NAME, replay


def main(argv: list[str]) -> int:
    """`runner replay JOURNAL [--tracking-uri URI]`: send what a run could not write to its store."""
    parser = Parser(prog="runner replay", description=main.__doc__)
    parser.add_argument("journal", type=Path, help=f"a run's {NAME} (in its output folder)")
    parser.add_argument("--tracking-uri", default=None, help="the store to send to (default: the run's own)")
    args = parser.parse_args(argv)
    try:
        count, run_id = replay(args.journal, args.tracking_uri)
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"error: {args.journal} is not a readable run journal ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the store's failure, whatever it is, is the one line
        if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":  # trying again would never help
            print(f"error: the journal's run is not in {args.tracking_uri or 'its store'} (the store was deleted, "
                  "or is another one): a journal adds writes to the run it was opened in, and has not the writes "
                  "already sent; nothing was replayed", file=sys.stderr)
            return 2
        print(f"error: the store refused the replay ({type(e).__name__}: {one_line(e)}); nothing acknowledged is sent "
              "twice, run the same command again once it works", file=sys.stderr)
        return 2
    print(f"replayed {count} writes of run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
