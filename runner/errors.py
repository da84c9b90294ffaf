"""Errors a user can fix. The command line reports each as one `error:` line and exits with status 2."""

from __future__ import annotations

import re


class UserError(Exception):
    """Something the user can fix (input, environment); the message is one line saying what and how."""


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message is one line naming the key, the value and what is allowed."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one short line, for an `error:` line, a warning or a tag.

    A UserError's own line (worded for the user already). For any other exception: the OS error behind a failed
    request (`[Errno 111] Connection refused`) or a database driver's own message when the text holds one (a
    store's failures wrap them in pages of SQL and traceback); else the first lines of the first paragraph (Hydra's
    messages run on for pages); the exception's type if it says nothing.
    """
    text = str(e).strip()
    if isinstance(e, UserError):  # worded for the user already: one line by contract
        return (text.splitlines() or [type(e).__name__])[0]
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    database = re.search(r"\((sqlite3\.\w+|psycopg2?\.\w+|pymysql\.\w+)\) ([^\n]+)", text)
    if errno:
        line = errno.group(0).strip()
    elif database:
        line = f"{database.group(1)}: {database.group(2)}"
    else:
        line = " ".join(" ".join(part.split()) for part in text.split("\n\n")[0].splitlines()[:2] if part.strip())
    line = line or type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
