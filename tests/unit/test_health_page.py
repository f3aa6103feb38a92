"""The health page built from a preflight report: matrices, drift, rank map, failures with fixes."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from conftest import load

_page = load("filter_plugins/health_page.py")
drift_table, heat_color, node_check_matrix = _page.drift_table, _page.heat_color, _page.node_check_matrix
pairwise_matrices, rank_map, render = _page.pairwise_matrices, _page.rank_map, _page.render


def _report():
    hosts = ["n2", "n1", "n3"]  # inventory order differs from rank order on purpose
    model = {"n1": {"node_rank": 0, "data_address": "10.0.0.1"}, "n2": {"node_rank": 1, "data_address": "10.0.0.2"},
             "n3": {"node_rank": 2, "data_address": "10.0.0.3"}}
    recs = []
    for h in hosts:
        recs.append({"host": h, "check": "cluster.disk", "status": "pass", "detail": "500 GiB free", "fix": ""})
        recs.append({"host": h, "check": "nvidia_driver.version", "status": "fail" if h == "n3" else "pass",
                     "detail": "driver 570.1" if h == "n3" else "driver 580.159.04",
                     "fix": "install 580.159.04 on n3" if h == "n3" else "",
                     "data": {"drift": {"driver": "570.1" if h == "n3" else "580.159.04"},
                              "gpu_map": [{"local_rank": i, "index": i, "pci_bus_id": f"0000:00:0{6 + i}.0",
                                           "uuid": f"GPU-{h}-{i}"} for i in range(2)]}})
    # n2 -> n3 jumbo path broken; bandwidth numbers on n1's row only.
    recs.append({"host": "n1", "check": "network.path_mtu", "status": "pass", "detail": "", "fix": "",
                 "data": {"pairwise": {"path_mtu": {"n2": True, "n3": True}, "busbw_gbps": {"n2": 9.5, "n3": 2.0}}}})
    recs.append({"host": "n2", "check": "network.path_mtu", "status": "fail", "detail": "n2 -> n3: 8972 lost",
                 "fix": "set MTU 9000 on n3", "data": {"pairwise": {"path_mtu": {"n1": True, "n3": False}}}})
    recs.append({"host": "n3", "check": "network.path_mtu", "status": "pass", "detail": "", "fix": "",
                 "data": {"pairwise": {"path_mtu": {"n1": True, "n2": True}}}})
    return {"run_id": "20261122T000000", "generated": "2026-11-22T00:00:00Z", "hosts": hosts, "records": recs,
            "cluster_model": model}


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells = []

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self.cells.append(dict(attrs))


def test_matrix_orders_hosts_by_rank_and_lists_failures_with_fix():
    m = node_check_matrix(_report())
    assert m["hosts"] == ["n1", "n2", "n3"]
    assert m["checks"] == ["cluster.disk", "nvidia_driver.version", "network.path_mtu"]
    assert [(f["host"], f["check"]) for f in m["failures"]] == [("n2", "network.path_mtu"),
                                                                 ("n3", "nvidia_driver.version")]


def test_drift_highlights_only_the_odd_node():
    d = drift_table(_report())
    assert d["keys"] == ["driver"]
    assert d["odd"] == {"n1": set(), "n2": set(), "n3": {"driver"}}


def test_pairwise_bool_and_numeric_metrics():
    mats = {m["metric"]: m for m in pairwise_matrices(_report())}
    assert mats["path_mtu"]["values"]["n2"]["n3"] is False
    assert not mats["path_mtu"]["numeric"]
    assert mats["busbw_gbps"]["numeric"] and mats["busbw_gbps"]["max"] == 9.5
    assert heat_color(True, None) != heat_color(False, None)
    assert heat_color(None, 1) == "#d9d9d9"
    assert heat_color(9.5, 9.5) != heat_color(2.0, 9.5)


def test_rank_map_has_one_row_per_local_rank():
    rows = rank_map(_report())
    assert [(r["node_rank"], r["host"], r["local_rank"], r["pci_bus_id"]) for r in rows][:2] == [
        (0, "n1", 0, "0000:00:06.0"), (0, "n1", 1, "0000:00:07.0")]
    assert len(rows) == 6


def test_rendered_page_marks_the_failing_cells():
    page = render(_report())
    p = _Cells()
    p.feed(page)
    failing = {(c.get("data-host"), c.get("data-check")) for c in p.cells if c.get("data-status") == "fail"}
    assert failing == {("n2", "network.path_mtu"), ("n3", "nvidia_driver.version")}
    broken = [c for c in p.cells if c.get("data-src") == "n2" and c.get("data-dst") == "n3"]
    assert broken and broken[0]["data-value"] == "False"
    odd = [c for c in p.cells if "odd" in (c.get("class") or "")]
    assert [(c["data-host"], c["data-key"]) for c in odd] == [("n3", "driver")]
    assert "install 580.159.04 on n3" in page
    assert "http://" not in page and "https://" not in page  # self-contained


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", "a & b"])
def test_details_are_escaped(text):
    r = _report()
    r["records"][0]["detail"] = text
    assert text not in render(r)
