"""Errors a user can fix. The command line reports each as one `error:` line and exits with status 2."""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix (input, environment); the message is one line saying what and how."""


class ConfigError(UserError, ValueError):
    """A config value is wrong; the message is one line naming the key, the value and what is allowed."""
