"""Errors a user can fix. The command line reports each as one `error:` line and exits with status 2."""

from __future__ import annotations

import re


class UserError(Exception):
    """Something the user can fix (input, environment); the message is one line saying what and how."""


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message is one line naming the key, the value and what is allowed."""


# What TensorFlow wraps around an op's own message: the function and node it ran in (`{{function_node ...}}`,
# `[[{{node decode_image/DecodeImage}}]]`, `[Op:SaveV2] name: `), and the preamble of an error in a graph
# ("Graph execution error:", then per node "Detected at node X ..." and its stack, indented, or "Node: 'X'").
TF_MARK = re.compile(r"\{\{(function_)?node |\[Op:|\AGraph execution error:")
TF_WRAPPING = re.compile(r"\{\{function_node [^}]*\}\}|\[\[[^\]]*\]\]|\[Op:[^\]]*\]( name:[^\n]*)?")
TF_PREAMBLE = re.compile(r"Graph execution error:|Detected at node .* defined at \(most recent call last\):|"
                         r"<stack traces unavailable>|Node: .*|\s.*|")


def _without_graph_internals(text: str) -> str:
    """A TensorFlow error's own message: `text` without the graph's preamble and the function and node names
    wrapped around it (a text without them unchanged): what it says is the op's, where it ran is noise to a user."""
    if not TF_MARK.search(text):
        return text
    lines = text.splitlines()
    if lines[0] == "Graph execution error:":
        while lines and TF_PREAMBLE.fullmatch(lines[0]):  # the preamble's lines, its stack frames indented
            lines.pop(0)
    return "\n".join(kept for line in lines if (kept := TF_WRAPPING.sub("", line).strip()))


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception as one short line, for an `error:` line, a warning or a tag: a UserError's own line; else the OS
    error behind a failed request or a database driver's own message when the text holds one (a store wraps them in
    pages of SQL), else the first lines of its first paragraph (a TensorFlow error's without its graph internals)."""
    text = str(e).strip()
    if isinstance(e, UserError):  # worded for the user already: one line by contract
        return (text.splitlines() or [type(e).__name__])[0]
    text = _without_graph_internals(text)
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


def last_line(output: str, otherwise: str) -> str:
    """A failed process's last line that says something (its error, as it stands), or `otherwise` if none does."""
    return next((line for line in reversed(output.splitlines()) if line.strip()), otherwise)
