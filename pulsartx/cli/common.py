"""What every ``pulsartx`` command shares: the client built from the global options, one output
path (:func:`emit`: a table, or JSON with ``--json``) and PulsarException → ``error: ...`` on
stderr with exit code 2.

Command modules (``topics``, ``subscriptions``, ``transactions``, ``ops``) import from here, never
from ``main``, so ``main`` can import them without a cycle.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import click
from click.core import ParameterSource

from pulsartx.client import Client
from pulsartx.exceptions import PulsarException, StorageError
from pulsartx.storage.cli_command import cli_command
from pulsartx.storage.presence import root_missing
from pulsartx.storage.retry import StorageUnavailable
from pulsartx.storage.root import StorageRoot

ERROR_EXIT_CODE = 2


class PulsarTxError(click.ClickException):
    """A PulsarException as the CLI reports it: ``error: <message>`` on stderr, exit code 2."""

    exit_code = ERROR_EXIT_CODE

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class RootGroup(click.Group):
    """The root group: turns a PulsarException raised by any command into :class:`PulsarTxError`,
    so the same message and exit code come out of ``main()`` and of ``CliRunner``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StorageError as e:
            raise PulsarTxError(f"{e}{object_store_hint(ctx, e)}") from e
        except PulsarException as e:
            raise PulsarTxError(str(e)) from e
        except BrokenPipeError:
            raise
        except OSError as e:  # a local root that is a file, or that cannot be created: not a traceback
            obj = ctx.find_root().obj or {}
            if not _about_the_root(obj, e):  # e.g. a --out file: the root is not to blame
                raise PulsarTxError(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from e
            raise PulsarTxError(
                f"{e.strerror or e}: {e.filename or obj.get('service_url')}: the storage root "
                f"{obj.get('service_url') or '$PULSARTX_SERVICE_URL or ./pulsartx-data'} must be a directory this user can "
                "create and write (or s3://bucket/prefix); check --service-url") from e


def _about_the_root(obj: dict[str, Any], e: OSError) -> bool:
    """Whether an OSError concerns the storage root: one naming no file, or a path at, below or
    above a local root."""
    if not isinstance(e.filename, str | bytes | os.PathLike) or not e.filename:
        return True
    try:
        root = StorageRoot.resolve(obj.get("service_url"), obj.get("storage_options") or {})
    except PulsarException:
        return True
    if not root.is_local:
        return False
    path, base = os.path.abspath(os.fsdecode(e.filename)), os.path.abspath(root.url)
    return os.path.commonpath([path, base]) in (path, base)


def object_store_hint(ctx: click.Context, e: StorageError) -> str:
    """What to check when an object store refuses a command: its own message names an HTTP call
    (a credentials lookup at 169.254.169.254 when none are configured), not the CLI's options."""
    obj = ctx.find_root().obj or {}
    try:
        root = StorageRoot.resolve(obj.get("service_url"), obj.get("storage_options") or {})
    except PulsarException:
        return ""
    if root.is_local or isinstance(e, StorageUnavailable):  # unreachable: the message names the retry budget
        return ""
    return (f" (storage root {root.url}: check the bucket name in --service-url, the endpoint "
            "(--storage-option AWS_ENDPOINT_URL=...), the region (AWS_REGION=...) and credentials "
            "(AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=..., as --storage-option or environment variables))")


def parse_pairs(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments of a repeatable ``option`` as a dict."""
    out = {}
    for p in pairs:
        if "=" not in p:
            raise click.BadParameter(f"{p!r}: use KEY=VALUE", param_hint=option)
        k, v = p.split("=", 1)
        out[k] = v
    return out


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    return parse_pairs(pairs, "--storage-option")


# pulsar-admin's relative times (``1s``, ``2m``); a bare number stays milliseconds, as it always was here.
DURATION = re.compile(r"(\d+)(ms|s|m|h)?")
DURATION_UNIT_MS = {None: 1, "ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
DURATION_FORMS = "milliseconds (500), or a whole number with ms, s, m or h (500ms, 1s, 2m, 1h)"


def parse_duration_ms(text: str) -> int:
    """``500``, ``500ms``, ``1s``, ``2m``, ``1h`` in milliseconds; ValueError naming the accepted forms."""
    m = DURATION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a duration: use {DURATION_FORMS}")
    return int(m.group(1)) * DURATION_UNIT_MS[m.group(2)]


class Duration(click.ParamType):
    """A click option that takes :func:`parse_duration_ms`'s forms, so every duration option reads
    them alike and a bad value is reported with the option's name."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_duration_ms(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


def get_client(ctx: click.Context, creates: bool = False):
    """A Client on the root given by the global ``--service-url`` / ``--storage-option``. Only a
    command that ``creates`` something may run on a local root that does not exist yet."""
    obj = ctx.find_root().obj
    if not creates:
        require_root(ctx)
    return Client(obj["service_url"], obj["storage_options"])


def require_root(ctx: click.Context) -> None:
    """Refuse a local root that does not exist, naming it, where it came from and the fix."""
    root_ctx = ctx.find_root()
    obj = root_ctx.obj
    root = StorageRoot.resolve(obj["service_url"], obj["storage_options"])
    if not root_missing(root):
        return
    source = root_ctx.get_parameter_source("service_url")
    if source is ParameterSource.ENVIRONMENT:
        given = f"$PULSARTX_SERVICE_URL={obj['service_url']}"
    elif obj["service_url"]:
        given = f"--service-url {obj['service_url']}"
    else:
        given = "the default root, as neither --service-url nor $PULSARTX_SERVICE_URL is set"
    raise PulsarTxError(f"storage root {root.url} does not exist ({given}): check --service-url, or create a "
                        f"topic there first with `{cli_command(root, 'topics', 'create', 'TOPIC')}`")


def json_mode(ctx: click.Context) -> bool:
    return bool(ctx.find_root().obj["json"])


def header(column: str) -> str:
    """``markDeletePosition`` and ``mark_delete_position`` both become ``MARK_DELETE_POSITION``."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", column).upper()


# Line breaks and tabs in a value would split its row or shift its columns: a table shows them
# escaped (JSON output keeps the value as it is).
_CELL_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def cell(value: Any) -> str:
    """One table cell: None is empty, lists are comma-joined, mappings are ``k=v`` pairs, and
    line breaks and tabs are escaped (``\\n``), so one row stays one line."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return ",".join(f"{cell(k)}={cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value)
    return str(value).translate(_CELL_ESCAPES)


# A row's error (e.g. a TC whose log cannot be read) is always shown, whatever columns a command picks.
ERROR_COLUMN = "error"


def render_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> None:
    """Rows under upper-case headers: ``columns``, or every key any row has (in order of first
    appearance), so a row with more keys than the first (an ``error``) loses none of them."""
    if not rows:
        click.echo("(none)")
        return
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    if ERROR_COLUMN not in cols and any(ERROR_COLUMN in r for r in rows):
        cols.append(ERROR_COLUMN)
    texts = [[cell(r.get(c)) for c in cols] for r in rows]
    heads = [header(c) for c in cols]
    widths = [max(len(h), *(len(t[i]) for t in texts)) for i, h in enumerate(heads)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
    for t in texts:
        click.echo("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())


def emit(ctx: click.Context, rows: list[dict[str, Any]] | dict[str, Any], columns: list[str] | None = None) -> None:
    """Print rows as a table, or as JSON with --json: one rendering path for every command. A dict
    is shown as a KEY/VALUE table."""
    if json_mode(ctx):
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if isinstance(rows, dict):
        rows = [{"key": k, "value": v} for k, v in rows.items()]
    render_table(rows, columns)


def emit_tables(ctx: click.Context, document: Any, tables: list[tuple[str | None, list[dict[str, Any]],
                                                                        list[str] | None]]) -> None:
    """``document`` as JSON with --json; otherwise several tables, each under an optional title."""
    if json_mode(ctx):
        click.echo(json.dumps(document, indent=2, default=str))
        return
    for i, (title, rows, columns) in enumerate(tables):
        if i:
            click.echo("")
        if title:
            click.echo(title)
        render_table(rows, columns)
