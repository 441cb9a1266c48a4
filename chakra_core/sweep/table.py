"""The sweep's outputs: sweep.csv, sweep.parquet and sweep.png, each written atomically.

One table, two encodings with the same contents: the Parquet column types are
chosen from the values (int64, float64, bool, string; a column mixing kinds,
or holding lists or mappings, is JSON text in both files), and the CSV cell of
a value is what reading it back with those types gives again (floats in their
shortest round-trip form, empty for null). pyarrow and matplotlib are imported
here only, so `chakra-sim run` never loads them.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from chakra_core._atomic import atomic_write_bytes, atomic_write_text
from chakra_core.json_types import JsonObject
from chakra_core.report.plots import readable_unit
from chakra_core.sweep.spec import Sweep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TABLE_CSV, TABLE_PARQUET, PLOT_PNG = "sweep.csv", "sweep.parquet", "sweep.png"


def column_kind(values: list[Any]) -> str:
    """'int', 'float', 'bool', 'str' or 'json': how a column is stored (nulls do not count)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "bool"
    if any(isinstance(v, bool) for v in present):
        return "json"
    if all(isinstance(v, int) for v in present):
        return "int" if present else "float"
    if all(isinstance(v, (int, float)) for v in present):
        return "float"
    if all(isinstance(v, str) for v in present):
        return "str"
    return "json"


def _cell(value: Any, kind: str) -> Any:
    """A value as stored in a column of `kind` (None stays None)."""
    if value is None:
        return None
    if kind == "float":
        return float(value)
    if kind == "json":
        return json.dumps(value, sort_keys=True)
    return value


def _csv_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def typed_columns(columns: list[str], rows: list[JsonObject],
                  kinds: dict[str, str] | None = None) -> dict[str, tuple[str, list[Any]]]:
    """column -> (kind, stored values). `kinds` gives the kind of columns known in advance, so
    that a column of nulls (no error anywhere) still has its type; values decide the others."""
    out = {}
    for column in columns:
        values = [row.get(column) for row in rows]
        kind = column_kind(values)
        declared = (kinds or {}).get(column)
        if declared is not None and (kind == declared or not any(v is not None for v in values)
                                     or (declared, kind) == ("float", "int")):
            kind = declared
        out[column] = (kind, [_cell(v, kind) for v in values])
    return out


def table_csv(columns: list[str], rows: list[JsonObject], kinds: dict[str, str] | None = None) -> str:
    typed = typed_columns(columns, rows, kinds)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for i in range(len(rows)):
        writer.writerow([_csv_text(typed[c][1][i]) for c in columns])
    return buffer.getvalue()


def table_parquet(columns: list[str], rows: list[JsonObject], kinds: dict[str, str] | None = None) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "str": pa.string(),
             "json": pa.string()}
    typed = typed_columns(columns, rows, kinds)
    table = pa.table({c: pa.array(values, type=types[kind]) for c, (kind, values) in typed.items()})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def write_outputs(sweep: Sweep, columns: list[str], rows: list[JsonObject], kinds: dict[str, str],
                  warnings: list[str]) -> list[Path]:
    """Write the table (CSV and Parquet) and the plot; return the files written.

    Without a point to draw, an earlier sweep.png is removed rather than left to contradict
    the table.
    """
    out = sweep.output_dir
    atomic_write_text(out / TABLE_CSV, table_csv(columns, rows, kinds))
    atomic_write_bytes(out / TABLE_PARQUET, table_parquet(columns, rows, kinds))
    written = [out / TABLE_CSV, out / TABLE_PARQUET]
    png = plot_png(sweep, rows)
    if png is None:
        warnings.append(f"no plot: no point has a value of the metric {sweep.metric.text}")
        (out / PLOT_PNG).unlink(missing_ok=True)
    else:
        atomic_write_bytes(out / PLOT_PNG, png)
        written.append(out / PLOT_PNG)
    return written


# The plot -----------------------------------------------------------------------------------------
_STYLES = (("-", "o"), ("--", "x"), (":", "^"), ("-.", "+"))
# The unit of a swept key, from its last name: manifests give times in ns, the network's
# `bandwidth` in GB/s (GB = 2^30 B), other `*_gbps` / `*-bw` keys in GB/s (10^9 B/s).
_KEY_UNITS = ((("_ns", "latency", "-delay", "-latency"), "ns"), (("_us",), "µs"),
              (("bandwidth", "_gbps", "-bw"), "GB/s"), (("_gbits",), "Gb/s"),
              (("_bytes", "-size", "_size"), "B"), (("_tflops", "peak-perf"), "TFLOP/s"))


def key_unit(key: str) -> str | None:
    """The unit of a swept key path (`network.bandwidth[0]` -> GB/s), or None when unknown."""
    name = re.sub(r"\[\d+\]", "", key).rsplit(".", 1)[-1]
    for endings, unit in _KEY_UNITS:
        if name.endswith(endings):
            return unit
    return None


def _with_unit(key: str, unit: str | None = None) -> str:
    unit = unit or key_unit(key)
    return f"{key} ({unit})" if unit else key


def _scalar(value: Any) -> Any:
    """A one-element list (`network.bandwidth: [50]`) as its element: it is one setting."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _label(value: Any) -> str:
    value = _scalar(value)
    if isinstance(value, list):    # one value per dimension: 50, 100
        return ", ".join(_label(item) for item in value)
    return value if isinstance(value, str) else json.dumps(value)


LEGEND_TITLE_CHARS = 60
"""The longest legend title kept on one line inside the axes."""


def plot_png(sweep: Sweep, rows: list[JsonObject]) -> bytes | None:
    """The PNG of plot_figure; None when no point has a value to draw."""
    figure = plot_figure(sweep, rows)
    if figure is None:
        return None
    buffer = io.BytesIO()
    # No Software/date metadata: the same table gives the same bytes.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def plot_figure(sweep: Sweep, rows: list[JsonObject]) -> Figure | None:
    """The metric against the x key, one line per combination of the series keys, every axis and
    legend key with its unit; None when no point has a value to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    metric, spec = sweep.metric.text, sweep.plot
    drawn = [row for row in rows if row["status"] == "ok" and row.get(metric) is not None]
    if not drawn:
        return None
    x_values: list[Any] = [_scalar(row.get(spec.x)) for row in drawn]   # JSON values: numbers when numeric_x
    numeric_x = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x_values)
    # A categorical axis keeps the sweep's order of values.
    categories = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in x_values))
    values = [float(cast(float, row[metric])) for row in drawn]   # the metric's column holds numbers
    divisor, unit = readable_unit(values, sweep.metric.unit)

    lines: dict[tuple[str, ...], list[tuple[Any, float]]] = {}
    for row, x, value in zip(drawn, x_values, values):
        series = tuple(json.dumps(row.get(k), sort_keys=True) for k in spec.series)
        position = x if numeric_x else categories.index(json.dumps(x, sort_keys=True))
        lines.setdefault(series, []).append((position, value / divisor))

    # With two or more series keys and few values of the last, that key picks the line style
    # and marker and the others the colour: lines that coincide (two backends agreeing) stay
    # visible, an 'x' inside an 'o'.
    styled = len(spec.series) >= 2 and len({key[-1] for key in lines}) <= len(_STYLES)
    colour_of: dict[tuple[str, ...], int] = {}
    style_of: dict[str, int] = {}
    figure = Figure(figsize=(9 if len(lines) > 4 else 8, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for series, points in lines.items():
        points.sort(key=lambda p: p[0])
        label = ", ".join(_label(json.loads(v)) for v in series) if series else None
        colour_key, style = (series, 0)
        if styled:
            colour_key, style = series[:-1], style_of.setdefault(series[-1], len(style_of))
        linestyle, marker = _STYLES[style]
        axes.plot([p[0] for p in points], [p[1] for p in points], label=label, linestyle=linestyle, marker=marker,
                  color=f"C{colour_of.setdefault(colour_key, len(colour_of)) % 10}",
                  markerfacecolor="none" if style else None)
    if not numeric_x:
        axes.set_xticks(range(len(categories)),
                        [_label(json.loads(c)) for c in categories], rotation=20 if len(categories) > 4 else 0)
    elif spec.logx and all(v > 0 for v in x_values):
        axes.set_xscale("log", base=2 if _powers_of_two(x_values) else 10)
    if numeric_x and len(set(x_values)) <= 12:   # label the swept values themselves
        ticks = sorted(set(x_values))
        axes.set_xticks(ticks, [_label(v) for v in ticks])
        axes.xaxis.set_minor_locator(NullLocator())
    if spec.logy:
        axes.set_yscale("log")
    x_label = _with_unit(spec.x, spec.x_unit)
    axes.set_xlabel(x_label)
    # 'finish (µs)' rather than 'finish_ns (µs)'
    name = metric.replace("_ns)", ")").removesuffix("_ns") if sweep.metric.unit == "ns" else metric
    y_label = name + (f" ({unit})" if unit else "")
    axes.set_ylabel(y_label)
    failed = sum(1 for row in rows if row["status"] != "ok")
    title = f"{sweep.name}: {y_label} vs {x_label}"
    if failed:
        title += f"\n({failed} failed point{'s' if failed != 1 else ''} not shown)"
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if spec.series:
        keys = [_with_unit(key) for key in spec.series]
        # beside the axes, a key per line, when it would hide data or be wider than the axes (a
        # plan's nine keys in one line collapse them)
        beside = len(lines) > 4 or len(", ".join(keys)) > LEGEND_TITLE_CHARS
        legend = {"title": (",\n" if beside else ", ").join(keys),
                  "fontsize": "small", "title_fontsize": "small", "ncols": 1 if len(lines) <= 16 else 2}
        if beside:
            figure.legend(loc="outside right upper", **legend)
        else:
            axes.legend(**legend)
    if not spec.logy:
        axes.set_ylim(bottom=0)
    return figure


def _powers_of_two(values: list[float]) -> bool:
    return all(v > 0 and math.log2(v).is_integer() for v in values)
