"""deploy/grafana/keel.json is a Grafana dashboard over metrics keel really exports.

What Grafana's import needs of the document (a title and uid, panels with unique ids,
positions and a data source, targets with unique refIds), and that every query names
only metrics a keel process registers (:class:`shared.metrics.Metrics`, under the names
Prometheus gives their samples) and, in a selector or ``by``, only their labels.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Counter, Gauge, Histogram

from services.conductor.manager import ConductorManager
from shared.metrics import Metrics

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "deploy" / "grafana" / "keel.json"
#: Labels Prometheus adds to every sample it scrapes, and the one a histogram has.
SCRAPE_LABELS = {"instance", "job"}
_METRIC = re.compile(r"\b(keel_[a-z_]+)\b")
_SELECTOR = re.compile(r"(keel_[a-z_]+)\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_BY = re.compile(r"\bby\s*\(([^)]*)\)")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def exported() -> dict[str, set[str]]:
    """Every sample name a keel process may export → the labels it carries."""
    names: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        if not isinstance(metric, Counter | Gauge | Histogram):
            continue
        base: str = metric._name
        labels = set(metric._labelnames)
        if isinstance(metric, Counter):
            names[base + "_total"] = labels
        elif isinstance(metric, Histogram):
            names[base + "_bucket"] = labels | {"le"}
            names[base + "_sum"] = labels
            names[base + "_count"] = labels
        else:
            names[base] = labels
    return names


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in document["panels"] if p["type"] != "row"]


def queries(document: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in panels(document) for target in panel["targets"]]


def test_it_is_a_dashboard_grafana_imports(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"]
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(isinstance(i, int) and i > 0 for i in ids)
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid)
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    for panel in panels(dashboard):
        assert panel["title"]
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs
        assert len(refs) == len(set(refs)), panel["title"]
        assert all(target["datasource"] == panel["datasource"] for target in panel["targets"])


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells


def test_it_covers_what_an_operator_watches(dashboard: dict[str, Any]) -> None:
    text = " ".join(queries(dashboard))
    for metric in (
        "keel_boots_total",
        "keel_boot_seconds_bucket",
        "keel_moves_open",
        "keel_self_fences_total",
        "keel_compute_hosts",
        "keel_rpc_handle_seconds_bucket",
        "keel_db_query_seconds_bucket",
    ):
        assert metric in text, metric


def test_every_query_names_metrics_and_labels_keel_exports(dashboard: dict[str, Any]) -> None:
    names = exported()
    unknown = [
        (expr, name) for expr in queries(dashboard) for name in _METRIC.findall(expr)
        if name not in names
    ]  # fmt: skip
    assert unknown == []
    for expr in queries(dashboard):
        used = {name for name in _METRIC.findall(expr)}
        known = set().union(*(names[name] for name in used)) | SCRAPE_LABELS
        for metric, matchers in _SELECTOR.findall(expr):
            for label, _, _ in _MATCHER.findall(matchers):
                assert label in names[metric] | SCRAPE_LABELS, (expr, label)
        for grouping in _BY.findall(expr):
            for label in (part.strip() for part in grouping.split(",")):
                assert label in known, (expr, label)


def test_the_conductor_methods_queried_exist() -> None:
    document = json.loads(DASHBOARD.read_text())
    for expr in queries(document):
        for metric, matchers in _SELECTOR.findall(expr):
            found = dict((label, value) for label, _, value in _MATCHER.findall(matchers))
            if metric == "keel_rpc_messages_total" and found.get("topic") == "conductor":
                for method in found.get("method", "").split("|"):
                    assert hasattr(ConductorManager, method), method
