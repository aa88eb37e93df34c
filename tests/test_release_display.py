"""How a release and the demo read: a notebook's HTML view (escaped), and the demo at 80
columns."""

from __future__ import annotations

import dataclasses
import html
import io
import re

import pandas as pd
from rich.console import Console

import dpcurator as dp
from dpcurator.cli.demo_curator import demo_curator


def _release() -> dp.Release:
    frame = pd.DataFrame({"unit": list(range(40)) * 2,
                          "group": ["<script>alert(1)</script>", "a & b"] * 40,
                          "value": [1.0, 2.0] * 40})
    curator = dp.Curator(frame, privacy_unit="unit", budget=dp.PureDP(2.0),
                         bounds={"value": (0, 2)}, max_partitions=2, max_rows_per_partition=1)
    return curator.sql("SELECT group, COUNT(*) AS n, SUM(value) AS s FROM data GROUP BY group",
                       epsilon=1.0, keys=["<script>alert(1)</script>", "a & b"])


def test_the_html_view_shows_values_intervals_privacy_and_warnings_escaped() -> None:
    release = _release()
    warned = dataclasses.replace(release, warnings=("a <b>bold</b> claim & more",))
    page = warned._repr_html_()
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "a &amp; b" in page
    assert "a &lt;b&gt;bold&lt;/b&gt; claim &amp; more" in page
    assert html.escape(f"privacy spent: {release.privacy}") in page
    headers = re.findall(r"<th>(.*?)</th>", page)
    assert headers == ["group", "n", "95% interval (bounded)", "s", "95% interval (bounded)"]
    rows = re.findall(r"<tr>(.*?)</tr>", page)[1:]
    assert len(rows) == 2
    for i, row in enumerate(rows):
        cells = re.findall(r"<td>(.*?)</td>", row)
        assert len(cells) == len(headers)
        for column, name in ((1, "n"), (3, "s")):  # each value, then its own interval
            value = float(cells[column].replace(",", ""))
            assert abs(value - float(release.values[name][i])) <= 1e-5 * max(1, abs(value))
            low, high = (float(x.replace(",", "")) for x in cells[column + 1][1:-1].split(", "))
            assert low <= high


def test_the_html_view_of_a_release_without_warnings_has_no_warning_list() -> None:
    page = _release()._repr_html_()
    assert "warnings" not in page


def test_the_curator_demo_fits_80_columns() -> None:
    out = io.StringIO()
    console = Console(width=80, file=out, force_terminal=False, color_system=None)
    results = demo_curator(customers=2_000, console=console)
    tables = sum(len([v for v in q["rows"][0].values() if isinstance(v, dict)])
                 for q in results["queries"])
    printed = out.getvalue()
    assert printed.count("95% CI") == tables == 4  # one table per aggregate, with intervals
    assert "…" not in printed  # no cell cut short
    assert max(len(line) for line in printed.splitlines()) <= 80


def test_an_interval_column_never_writes_over_another_column() -> None:
    """A bug hunt: ``COUNT(*) AS income_low`` beside ``AVG(income) AS income`` lost the count
    under AVG's low end, and a key named ``n_high`` lost its keys, in ``to_pandas`` and
    ``to_arrow`` with intervals. A taken name gets an underscore, as a total's column does."""
    import numpy as np

    df = pd.DataFrame({"uid": np.arange(3000), "income": np.arange(3000) % 100 * 1000.0,
                       "segment": np.where(np.arange(3000) % 2, "odd", "even")})
    c = dp.Curator(df, privacy_unit="uid", budget=dp.PureDP(10.0),
                   bounds={"income": (0, 100_000)})
    release = c.sql("SELECT COUNT(*) AS income_low, AVG(income) AS income FROM data",
                    epsilon=1.0)
    assert release.interval_columns == {"income_low": ("income_low_low", "income_low_high"),
                                        "income": ("income_low_", "income_high")}
    for table in (release.to_pandas(intervals=True), release.to_arrow(intervals=True)):
        frame = table if isinstance(table, pd.DataFrame) else table.to_pandas()
        assert list(frame.columns) == ["income_low", "income_low_low", "income_low_high",
                                       "income", "income_low_", "income_high"]
        assert frame["income_low"][0] == release.values["income_low"][0]
        assert frame["income_low_"][0] == release.interval("income")[0][0]
    keyed = c.sql("SELECT segment AS n_high, COUNT(*) AS n FROM data GROUP BY 1",
                  epsilon=1.0, keys=["even", "odd"])
    frame = keyed.to_pandas(intervals=True)
    assert list(frame.columns) == ["n_high", "n", "n_low", "n_high_"]
    assert list(frame["n_high"]) == ["even", "odd"]
    assert list(keyed.to_pandas().columns) == ["n_high", "n"]
    assert c.spent.epsilon == 2.0
