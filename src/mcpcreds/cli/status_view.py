"""`mcpcreds status` on a terminal: the sidecar's status document as tables, once or live.

Drawn with `rich` (tables that fit the terminal, `rich.live` for `--watch`). The command imports
this module only when stdout is a terminal: piped, `status` prints JSON and loads no rich (the
fast-CLI rule, tests/test_cli_imports.py).

Everything shown is read from the status document, which holds no secret (names, states, times
and counts); a field that is missing or of the wrong type shows as `-` rather than failing, so a
newer or older sidecar still draws. Times are shown relative to `now` (expires in, renews in);
granted/refused per minute need two documents, so they show from the second refresh of
`--watch` on (a one-shot status shows the totals).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..errors import InvalidRequest, McpcredsError

BAR_WIDTH: Final = 10
MAX_ROWS: Final = 200  # per table: a sidecar with thousands of keys still draws in a terminal
MAX_COLUMNS: Final = 8  # of a table drawn from rows the view does not know (leases, grants)
MIN_INTERVAL: Final = 0.1
MAX_INTERVAL: Final = 3600.0

Status = Mapping[str, Any]
Sample = tuple[float, Status]  # (wall time it was read, the document)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _text(value: Any, limit: int = 80) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else str(value)
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def duration(seconds: float) -> str:
    """12s, 4m05s, 3h12m, 2d03h: two units at most."""
    seconds = int(abs(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def relative(at: Any, now: float, past: str = "ago") -> str:
    """`at` (unix time) from `now`: "in 4m05s", "3s ago" (or `past` after it), "-" when unknown."""
    value = _num(at)
    if value is None:
        return "-"
    delta = value - now
    return duration(delta) if delta >= 0 else f"{duration(delta)} {past}"


def bar(level: Any, capacity: Any, width: int = BAR_WIDTH) -> str:
    """The bucket's level as a bar: "██████░░░░ 6.0/10"."""
    lvl, cap = _num(level), _num(capacity)
    if lvl is None or cap is None or cap <= 0:
        return "-"
    filled = round(width * min(max(lvl / cap, 0.0), 1.0))
    return f"{'█' * filled}{'░' * (width - filled)} {lvl:.1f}/{cap:g}"


def per_minute(previous: Sample | None, current: Sample) -> dict[str, tuple[float, float]]:
    """Granted permits and refused requests per minute per bucket between two documents; a
    bucket whose counts went down (the sidecar restarted) or is new has none."""
    if previous is None:
        return {}
    elapsed = current[0] - previous[0]
    if not elapsed > 0:
        return {}
    before = {b.get("key"): b for b in _rows(previous[1].get("buckets"))}
    out: dict[str, tuple[float, float]] = {}
    for row in _rows(current[1].get("buckets")):
        old = before.get(row.get("key"))
        if old is None or not isinstance(row.get("key"), str):
            continue
        counts = [(_num(row.get(f)), _num(old.get(f))) for f in ("granted", "refused")]
        if any(a is None or b is None or a < b for a, b in counts):
            continue
        granted, refused = ((a - b) * 60 / elapsed for a, b in counts)  # type: ignore[operator]
        out[row["key"]] = (granted, refused)
    return out


def _rows(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [row for row in value[:MAX_ROWS] if isinstance(row, Mapping)]


_TIME_FIELDS: Final = ("expires_at", "renew_at", "paused_until")
_LATEST_TIME: Final = 1e11  # year 5138: past it, a time is garbage, not a date


def _check_rows(status: Status, part: str, strings: tuple[str, ...], numbers: tuple[str, ...] = ()) -> None:
    value = status.get(part)
    if value is None and part != "servers":
        return
    if not isinstance(value, list) or not all(isinstance(row, Mapping) for row in value):
        raise ValueError(f"{part} is not a list of objects")
    for row in value:
        if not all(isinstance(row.get(f), str) for f in strings):
            raise ValueError(f"a row of {part} lacks its names")
        if not all(_num(row.get(f)) is not None for f in numbers):
            raise ValueError(f"a row of {part} lacks its numbers")
        for field in _TIME_FIELDS:
            at = row.get(field)
            if at is not None and not (_num(at) is not None and 0 <= at <= _LATEST_TIME):
                raise ValueError(f"a time of {part} is out of range")


def check_document(status: Any) -> None:
    """Raise ValueError unless `status` has the shape every sidecar's status has: the view is
    lenient with fields it does not know (a newer or older sidecar), but an answer without the
    core rows, or with garbage where they are, is not a sidecar's status and is not drawn as one
    (exit non-zero rather than an empty or misleading table)."""
    if not isinstance(status, Mapping):
        raise ValueError("not an object")
    _check_rows(status, "servers", ("name", "key"))
    _check_rows(status, "logins", ("key",))
    _check_rows(status, "buckets", ("key",), ("level", "capacity"))


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", expand=False,
                  show_edge=False, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _more(table: Table, value: Any) -> None:
    if isinstance(value, list) and len(value) > MAX_ROWS:
        table.caption = f"… and {len(value) - MAX_ROWS} more (mcpcreds status --json shows all)"


def servers_table(status: Status) -> Table:
    table = _table("servers", "name", "key", "auth", "rate", "secrets")
    for s in _rows(status.get("servers")):
        secrets = s.get("secrets")
        names = ", ".join(_text(n, 40) for n in secrets) if isinstance(secrets, list) and secrets else "-"
        table.add_row(_text(s.get("name")), _text(s.get("key")), _text(s.get("auth")),
                      _text(s.get("rate")), names)
    _more(table, status.get("servers"))
    return table


# why the gateway does not expose a tool (`tools.hidden` of a server row: gateway/tools_seen.py)
_HIDDEN: Final = {"no_tool_allowlist": "no tool_allowlist", "tool_allowlist": "not in tool_allowlist",
                  "tool_exclude": "in tool_exclude", "expected_tools": "not in expected_tools",
                  "tool_metadata": "refused by tool_metadata", "pin_changed": "changed since pinned"}


def tools_summary(name: str, tools: Mapping[str, Any]) -> str:
    """A server's tools through the gateway in a few words: "3 of 5 exposed (2 hidden: not in
    tool_allowlist)", "none seen yet (...)", "0 exposed: no tool_allowlist"."""
    seen, exposed = _num(tools.get("seen")), _num(tools.get("exposed"))
    closed = tools.get("closed_by")
    why = None
    if closed is not None:
        why = "no tool_allowlist" if closed == "no_tool_allowlist" else "tool_allowlist is empty"
    if seen is None:
        return f"0 exposed: {why}" if why else f"none seen yet (mcpcreds tools {name} shows those pinned)"
    if why:
        return f"0 of {seen:g} exposed: {why}"
    text = f"{'-' if exposed is None else f'{exposed:g}'} of {seen:g} exposed"
    hidden = tools.get("hidden")
    counts: list[tuple[str, float]] = []
    order = list(_HIDDEN)
    for reason, count in sorted(hidden.items() if isinstance(hidden, Mapping) else (),
                                key=lambda item: order.index(item[0]) if item[0] in order else len(order)):
        if (number := _num(count)):
            words = _HIDDEN.get(str(reason)) or _text(reason, 40)
            if reason == "pin_changed":
                words += f": mcpcreds tools approve {name}"
            counts.append((words, number))
    total = sum(number for _, number in counts)
    if len(counts) == 1:
        return f"{text} ({total:g} hidden: {counts[0][0]})"
    if counts:
        return f"{text} ({total:g} hidden: " + ", ".join(f"{n:g} {words}" for words, n in counts) + ")"
    return text


def tools_table(status: Status) -> Table | None:
    """Per server the gateway serves: how many of its tools it exposes, and why not the others."""
    rows = [s for s in _rows(status.get("servers")) if isinstance(s.get("tools"), Mapping)]
    if not rows:
        return None
    table = _table("gateway tools", "server", "tools")
    for s in rows:
        name = _text(s.get("name"))
        table.add_row(name, tools_summary(name, s["tools"]))
    return table


_STATE_STYLE: Final = {"valid": "green", "renewing": "cyan", "stale": "yellow", "failing": "bold red",
                       "none": "dim"}


def logins_table(status: Status, now: float) -> Table:
    table = _table("logins", "key", "state", "expires in", "renews in", "token requests", "last error")
    for login in _rows(status.get("logins")):
        state = _text(login.get("state"), 16)
        error = login.get("last_error")
        table.add_row(_text(login.get("key")), Text(state, style=_STATE_STYLE.get(state, "")),
                      relative(login.get("expires_at"), now, "ago (expired)"),
                      relative(login.get("renew_at"), now, "overdue"),
                      _text(login.get("token_requests")),
                      Text(_text(error), style="red" if error else ""))
    _more(table, status.get("logins"))
    return table


def buckets_table(status: Status, now: float, rates: Mapping[str, tuple[float, float]]) -> Table:
    table = _table("buckets", "key", "rate", "level", "waiting", "granted", "refused", "paused")
    for b in _rows(status.get("buckets")):
        key = b.get("key")
        rate = rates.get(key) if isinstance(key, str) else None
        granted, refused = _text(b.get("granted")), _text(b.get("refused"))
        if rate is not None:
            granted, refused = f"{rate[0]:.0f}/min", f"{rate[1]:.0f}/min"
        paused = b.get("paused_until")
        table.add_row(_text(key), _text(b.get("rate")), bar(b.get("level"), b.get("capacity")),
                      _text(b.get("waiting")), granted,
                      Text(refused, style="red" if refused not in ("0", "0/min", "-") else ""),
                      Text(f"for {relative(paused, now)}", style="yellow")
                      if (_num(paused) or 0) > now else "-")
    _more(table, status.get("buckets"))
    return table


def generic_table(title: str, value: Any) -> Table | None:
    """Rows this view does not know field by field (leases, grants): their fields as columns."""
    if isinstance(value, Mapping):
        value = [value]
    rows = _rows(value)
    if not rows:
        return None
    columns = list(dict.fromkeys(k for row in rows for k in row if isinstance(k, str)))[:MAX_COLUMNS]
    table = _table(title, *(c.replace("_", " ") for c in columns))
    for row in rows:
        table.add_row(*(_text(row.get(c), 40) for c in columns))
    _more(table, value)
    return table


def gateway_view(status: Status) -> RenderableType | None:
    gateway = status.get("gateway")
    if not isinstance(gateway, Mapping):
        return None
    rows = _rows(gateway.get("servers"))
    if not rows:
        return Text("gateway: no live sessions", style="dim")
    table = _table("gateway sessions", "server", "sessions", "oldest", "streams", "in flight")
    for row in rows:
        age = _num(row.get("oldest_session_age"))
        table.add_row(_text(row.get("name")), _text(row.get("sessions")),
                      duration(age) if age is not None else "-", _text(row.get("streams")),
                      _text(row.get("in_flight")))
    return table


def view(status: Status, now: float, rates: Mapping[str, tuple[float, float]] | None = None,
         note: str = "") -> Group:
    """The whole status as one renderable: a header line, then one table per part present."""
    head = Text(f"mcpcreds {_text(status.get('version'), 20)}", style="bold")
    if note:  # before the config path, which can be long enough to wrap the line
        head.append(f"  {note}", style="dim")
    head.append(f"  config {_text(status.get('config'), 200)}  state {_text(status.get('state'), 20)}",
                style="")
    parts: list[RenderableType] = [head, Text(""), servers_table(status)]
    if (tools := tools_table(status)) is not None:
        parts += [Text(""), tools]
    if _rows(status.get("logins")):
        parts += [Text(""), logins_table(status, now)]
    if _rows(status.get("buckets")):
        parts += [Text(""), buckets_table(status, now, rates or {})]
    for title in ("leases", "grants"):
        if (table := generic_table(title, status.get(title))) is not None:
            parts += [Text(""), table]
    if (gateway := gateway_view(status)) is not None:
        parts += [Text(""), gateway]
    return Group(*parts)


def show(status: Status, console: Console | None = None, now: float | None = None) -> None:
    """`mcpcreds status` once, on a terminal."""
    (console or Console()).print(view(status, time.time() if now is None else now))


def watch(fetch: Callable[[], Status], console: Console | None = None, *, interval: float = 2.0,
          count: int | None = None, clock: Callable[[], float] = time.time,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """`mcpcreds status --watch`: fetch and redraw every `interval` seconds, top-style, until
    Ctrl-C (exit 0) or `count` refreshes. A failed fetch (the sidecar restarting) is shown in
    place of the tables and the next refresh tries again."""
    console = console or Console()
    previous: Sample | None = None
    done = 0
    note = f"every {interval:g}s, Ctrl-C quits"
    try:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while count is None or done < count:
                if done:
                    sleep(interval)
                done += 1
                try:
                    status = fetch()
                except McpcredsError as exc:
                    live.update(Text(f"mcpcreds: {exc.code}: {exc.message}  ({note})", style="red"),
                                refresh=True)
                    continue
                now = clock()
                live.update(view(status, now, per_minute(previous, (now, status)), note), refresh=True)
                previous = (now, status)
    except KeyboardInterrupt:
        pass
    return 0


def check_interval(value: float) -> float:
    if not math.isfinite(value) or not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise InvalidRequest(f"--interval takes {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds")
    return value
