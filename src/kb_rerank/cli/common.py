"""What the `kb-rerank` command groups share: the registration helper, argument types, table cells
aligned by terminal columns, and the app connection."""

from __future__ import annotations

import argparse
import unicodedata
from uuid import UUID

from kb_rerank.core import session
from kb_rerank.core.settings import Settings


TENANT_HELP = "the tenant's UUID"


def command(subparsers, name: str, help: str, **kwargs) -> argparse.ArgumentParser:
    """A sub-command whose own --help starts with the line `kb-rerank --help` shows for it."""
    return subparsers.add_parser(name, help=help, description=help, **kwargs)


def command_group(subparsers, name: str, help: str, dest: str):
    """A command of sub-commands (`kb-rerank guard list`): its subparsers, whose choice is
    ``args.<dest>``."""
    return command(subparsers, name, help=help).add_subparsers(dest=dest, required=True)


def uuid_arg(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {value!r}") from None


def language_code(value: str) -> str:
    """``--language``: the ISO 639-1 code of *value* (argparse names the option in its error)."""
    from kb_rerank.core.language import normalize_language_code

    try:
        return normalize_language_code(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def display_width(text: str) -> int:
    """Terminal columns of ``text``: two for an East Asian wide or fullwidth character (CJK),
    none for a combining mark, one otherwise."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def fit(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` columns and padded to exactly ``width``."""
    out, used = [], 0
    for ch in text:
        w = display_width(ch)
        if used + w > width:
            break
        out.append(ch)
        used += w
    return "".join(out) + " " * (width - used)


def app_conn(settings: Settings):
    from kb_rerank.db import database as db

    conn = db.connect_app(settings)
    session.configure_connection(conn)
    db.check_embedding_dim(conn, settings)
    return conn
