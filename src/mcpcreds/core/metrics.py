"""Counters and a latency histogram, rendered as Prometheus text.

Names follow the Prometheus conventions (tests/test_metrics_exposition.py parses a scrape with
`prometheus_client`): a counter ends in `_total`, a duration is in seconds (`_seconds`), a point
in time is a `_timestamp_seconds` gauge. docs/operations.md, "Metrics", lists every metric.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable
from typing import Final

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                          2.5, 5.0, 10.0)

Labels = tuple[tuple[str, str], ...]
# Label sets kept per metric for labels a caller can vary (a tool name): past this, new ones are
# counted under `OTHER`, so a client cannot grow the scrape (or the sidecar) without bound.
MAX_LABEL_SETS: Final = 1000
OTHER: Final = "_other"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(value: float) -> str:
    """A sample value, exactly: `repr` keeps every digit (`:g` made a unix time 1.76457e+09)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Metrics:
    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)
        self._hist_counts: defaultdict[str, list[int]] = defaultdict(
            lambda: [0] * (len(LATENCY_BUCKETS) + 1))
        self._hist_sum: defaultdict[str, float] = defaultdict(float)
        self.counters: defaultdict[tuple[str, Labels], float] = defaultdict(float)
        self.help: dict[str, str] = {}
        # labelled histograms: name -> labels -> [bucket counts..., +Inf count], and their sums
        self.histograms: dict[str, dict[Labels, list[int]]] = {}
        self.histogram_sums: defaultdict[tuple[str, Labels], float] = defaultdict(float)
        self._label_sets: defaultdict[str, set[Labels]] = defaultdict(set)

    def bounded(self, name: str, labels: Labels, free: str) -> Labels:
        """`labels`, or the same with label `free` set to OTHER once `name` has MAX_LABEL_SETS."""
        seen = self._label_sets[name]
        if labels in seen:
            return labels
        if len(seen) >= MAX_LABEL_SETS:
            return tuple((k, OTHER if k == free else v) for k, v in labels)
        seen.add(labels)
        return labels

    def observe(self, name: str, labels: Labels, seconds: float, help_text: str = "") -> None:
        """One observation of the labelled histogram `name` (latency buckets, in seconds)."""
        counts = self.histograms.setdefault(name, {}).get(labels)
        if counts is None:
            counts = self.histograms[name][labels] = [0] * (len(LATENCY_BUCKETS) + 1)
        counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # the first bound >= seconds, else +Inf
        self.histogram_sums[(name, labels)] += seconds
        if help_text and name not in self.help:
            self.help[name] = help_text

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        counts = self._hist_counts[route]
        counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # the first bound >= seconds, else +Inf
        self._hist_sum[route] += seconds

    def inc(self, name: str, labels: Labels = (), value: float = 1.0, help_text: str = "") -> None:
        self.counters[(name, labels)] += value
        if help_text and name not in self.help:
            self.help[name] = help_text

    def render(self, gauges: Iterable[tuple[str, str, Labels, float]] = ()) -> str:
        """Prometheus text exposition; `gauges` are (name, help, labels, value) read at scrape,
        a counter when the name ends in `_total` (a count the sidecar keeps elsewhere)."""
        out: list[str] = [
            "# HELP mcpcreds_requests_total Socket API requests by route and status.",
            "# TYPE mcpcreds_requests_total counter",
        ]
        for (route, status), count in sorted(self.requests.items()):
            out.append(f"mcpcreds_requests_total{_labels((('route', route), ('status', str(status))))} "
                       f"{count}")
        out += ["# HELP mcpcreds_request_seconds Socket API request latency.",
                "# TYPE mcpcreds_request_seconds histogram"]
        for route, counts in sorted(self._hist_counts.items()):
            out += _histogram_lines("mcpcreds_request_seconds", (("route", route),), counts,
                                    self._hist_sum[route])
        for name in sorted(self.histograms):
            out += [f"# HELP {name} {self.help.get(name, name)}", f"# TYPE {name} histogram"]
            for labels, counts in sorted(self.histograms[name].items()):
                out += _histogram_lines(name, labels, counts, self.histogram_sums[(name, labels)])
        by_name: defaultdict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for (name, labels), value in self.counters.items():
            by_name[name].append((labels, value))
        for name in sorted(by_name):
            out.append(f"# HELP {name} {self.help.get(name, name)}")
            out.append(f"# TYPE {name} counter")
            for labels, value in sorted(by_name[name]):
                out.append(f"{name}{_labels(labels)} {_value(value)}")
        gauge_help: dict[str, str] = {}
        gauge_rows: defaultdict[str, list[tuple[Labels, float]]] = defaultdict(list)
        for name, help_text, labels, value in gauges:
            gauge_help.setdefault(name, help_text)
            gauge_rows[name].append((labels, value))
        for name in sorted(gauge_rows):
            out.append(f"# HELP {name} {gauge_help[name]}")
            out.append(f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}")
            for labels, value in gauge_rows[name]:
                out.append(f"{name}{_labels(labels)} {_value(value)}")
        return "\n".join(out) + "\n"


def _histogram_lines(name: str, labels: Labels, counts: list[int], total: float) -> list[str]:
    """One histogram's cumulative `_bucket` lines, then `_sum` and `_count` (Prometheus text)."""
    lines = []
    running = 0
    for bound, count in zip(LATENCY_BUCKETS, counts, strict=False):
        running += count
        le = 'le="' + str(bound) + '"'
        lines.append(f"{name}_bucket{_labels(labels, le)} {running}")
    running += counts[-1]
    le_inf = 'le="+Inf"'
    lines.append(f"{name}_bucket{_labels(labels, le_inf)} {running}")
    lines.append(f"{name}_sum{_labels(labels)} {_value(total)}")
    lines.append(f"{name}_count{_labels(labels)} {running}")
    return lines
