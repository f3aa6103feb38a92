"""The health page built from a preflight report: matrices, drift, rank map, failures with fixes."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from helpers import load

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
    def __init__(self, tag="td"):
        super().__init__()
        self.tag, self.cells = tag, []

    def handle_starttag(self, tag, attrs):
        if tag == self.tag:
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


# --------------------------------------------------------------------------- above FULL_MATRIX_MAX nodes

summarise_pairwise, drift_summary = _page.summarise_pairwise, _page.drift_summary


def _big(n=40, bad=("h7",), gbps=True):
    """n nodes, each probing its next 3 (a sampled scheme); every link to or from a bad node fails; numeric busbw on
    every probed link, lowest on h5 -> h6; one node with another driver."""
    hosts = [f"h{i}" for i in range(n)]
    recs = []
    for i, h in enumerate(hosts):
        peers = [hosts[(i + k) % n] for k in (1, 2, 3)]
        pairwise = {"path_mtu": {p: not ({h, p} & set(bad)) for p in peers}}
        if gbps:
            pairwise["busbw_gbps"] = {p: (0.5 if (h, p) == ("h5", "h6") else 10.0 + i) for p in peers}
        recs.append({"host": h, "check": "network.path_mtu", "status": "fail" if h in bad else "pass",
                     "detail": f"{h} detail", "fix": "", "data": {"pairwise": pairwise}})
        recs.append({"host": h, "check": "nvidia_driver.smi", "status": "pass", "detail": "", "fix": "",
                     "data": {"drift": {"driver": "570.1" if h == "h9" else "580.1"},
                              "gpu_map": [{"local_rank": 0, "index": 0, "pci_bus_id": "0000:18:00.0", "uuid": "U"}]}})
    return {"run_id": "r", "hosts": hosts, "records": recs,
            "cluster_model": {h: {"node_rank": i, "data_address": f"10.0.0.{i + 1}"} for i, h in enumerate(hosts)}}


def test_failing_pairs_are_listed_in_full_and_in_rank_order():
    report = _big(bad=("h7", "h20"))
    m = {x["metric"]: x for x in pairwise_matrices(report)}["path_mtu"]
    assert not m["full"]
    s = summarise_pairwise(m["values"], m["hosts"], m["numeric"], worst=2)  # the cut never applies to failures
    want = [(src, dst) for src in m["hosts"] for dst in m["hosts"]
            if m["values"].get(src, {}).get(dst) is False]
    assert [(f["src"], f["dst"]) for f in s["failing"]] == want and len(want) == 12
    assert s["pairs"] == 40 * 3 and s["worst"] == []  # a bool metric has failing links, not worst values


def test_worst_links_are_the_lowest_values_lowest_first():
    m = {x["metric"]: x for x in pairwise_matrices(_big())}["busbw_gbps"]
    s = summarise_pairwise(m["values"], m["hosts"], m["numeric"], worst=3)
    assert [(w["src"], w["dst"], w["value"]) for w in s["worst"]] == [
        ("h5", "h6", 0.5), ("h0", "h1", 10.0), ("h0", "h2", 10.0)]
    assert s["failing"] == []


def test_per_node_aggregates_put_the_failing_nodes_first():
    m = {x["metric"]: x for x in pairwise_matrices(_big(bad=("h7",)))}
    nodes = summarise_pairwise(m["path_mtu"]["values"], m["path_mtu"]["hosts"], False)["nodes"]
    assert len(nodes) == 40
    assert nodes[0] == {"host": "h7", "out": 3, "in": 3, "failing_out": 3, "failing_in": 3, "min": None, "mean": None}
    assert [n["host"] for n in nodes[1:4]] == ["h4", "h5", "h6"]  # each probes h7 once
    assert all(n["failing_out"] + n["failing_in"] == 0 for n in nodes[7:])
    busbw = {n["host"]: n for n in summarise_pairwise(m["busbw_gbps"]["values"], m["busbw_gbps"]["hosts"], True)["nodes"]}
    assert busbw["h6"]["min"] == 0.5 and busbw["h6"]["in"] == 3
    # From h1: 11.0 three times; to h1: from h0 (10.0), h39 (49.0) and h38 (48.0).
    assert busbw["h1"]["min"] == 10.0 and busbw["h1"]["mean"] == (11.0 * 3 + 10.0 + 49.0 + 48.0) / 6


def test_a_big_cluster_gets_summaries_instead_of_n_squared_cells():
    report = _big(n=80, bad=("h7",))
    page = render(report)
    p = _Cells()
    p.feed(page)
    assert not any(c.get("data-src") for c in p.cells)  # no matrix cell
    # Rows: path_mtu's 6 failing links, busbw's WORST_LINKS lowest (the lowest first).
    assert page.count('<tr data-src="') == 6 + _page.WORST_LINKS
    assert '<tr data-src="h7" data-dst="h8" data-value="False">' in page
    assert page.index('<tr data-src="h5" data-dst="h6" data-value="0.5">') < page.index('data-value="10.0"')
    failing = {(c.get("data-host"), c.get("data-check")) for c in p.cells if c.get("data-status") == "fail"}
    assert failing == {("h7", "network.path_mtu")}
    spans = _Cells("span")
    spans.feed(page)
    odd = [(c["data-host"], c["data-key"]) for c in spans.cells if "odd" in (c.get("class") or "")]
    assert odd == [("h9", "driver")]
    # Linear, not quadratic: twice the nodes, about twice the page.
    assert len(render(_big(n=160, bad=("h7",)))) < 2.3 * len(page)


def test_small_cluster_keeps_its_full_matrix():
    report = _big(n=_page.FULL_MATRIX_MAX)
    p = _Cells()
    p.feed(render(report))
    assert sum(1 for c in p.cells if c.get("data-src")) == 2 * _page.FULL_MATRIX_MAX * (_page.FULL_MATRIX_MAX - 1)


def test_drift_summary_names_every_odd_node():
    rows = drift_summary(_page.drift_table(_big()))
    assert rows == [{"key": "driver", "majority": "580.1", "nodes": 39, "of": 40,
                     "odd": [{"host": "h9", "value": "570.1"}]}]



def test_nodes_without_failing_links_are_folded():
    page = render(_big(n=40, bad=("h7",)))
    path_mtu = page[page.index('data-metric="path_mtu" data-failing'):page.index('data-metric="busbw_gbps" data-failing')]
    shown, folded = path_mtu.split("<details>")
    assert shown.count('<tr data-host="') == 7 and "<summary>33 more node(s)</summary>" in folded
    busbw = page[page.index('data-metric="busbw_gbps" data-failing'):]
    shown, folded = busbw.split("<details>", 1)
    assert shown.count('<tr data-host="') == _page.WORST_LINKS  # no failing link: the lowest min open
    assert shown.index('<tr data-host="h5"') < shown.index('<tr data-host="h6"') < shown.index('<tr data-host="h0"')


def test_the_allreduce_section_shows_measured_against_expected_and_the_slow_node():
    inter = {"busbw_gbps": 3.1, "expected_gbps": 6.25, "fraction": 0.496, "floor_gbps": 1.0,
             "expected_for": "TCP over ens5 at 100 Gb/s", "sizes": [{"bytes": 2**20, "busbw_gbps": 0.4},
                                                                   {"bytes": 2**30, "busbw_gbps": 3.1}]}
    finding = {"kind": "node", "nodes": ["n2"], "text": "n2 is slow: 0.9 GB/s with n1, a node measured fine"}
    records = [
        {"host": h, "check": "nccl_check.inter_node", "status": "fail", "detail": "d", "data": inter}
        for h in ("n1", "n2")
    ] + [
        {"host": "n1", "check": "nccl_check.intra_node", "status": "pass", "detail": "d",
         "data": {"busbw_gbps": 300.0, "expected_gbps": None, "expected_for": "8x NVIDIA B200", "floor_gbps": 50}},
        {"host": "n2", "check": "nccl_check.bisect", "status": "fail", "detail": finding["text"],
         "data": {"findings": [finding], "pairwise": {"allreduce_pair_busbw_gbps": {"n1": 0.9}}}},
        {"host": "n1", "check": "nccl_check.bisect", "status": "pass", "detail": "not named",
         "data": {"findings": [finding], "pairwise": {"allreduce_pair_busbw_gbps": {"n2": 0.9}}}},
    ]
    report = {"hosts": ["n1", "n2"], "records": records}
    section = _page.allreduce_section(report)
    assert [(r["host"], r["check"]) for r in section["rows"]] == [("all nodes", "nccl_check.inter_node"),
                                                                   ("n1", "nccl_check.intra_node")]
    assert section["rows"][0]["sizes"] == [("1 MiB", 0.4), ("1 GiB", 3.1)]
    assert section["findings"] == [finding["text"]]
    page = _page.render(report)
    assert 'id="allreduce-expected"' in page and 'data-expected="6.25"' in page and "<td>50</td>" in page
    assert "no expectation for 8x NVIDIA B200" in page
    assert "<li>n2 is slow: 0.9 GB/s with n1, a node measured fine</li>" in page
    assert "allreduce_pair_busbw_gbps" in page
    assert _page.allreduce_section({"records": [{"host": "n1", "check": "network.mtu", "status": "pass"}]}) is None


def test_an_excluded_node_is_shown_with_its_failing_check_and_the_record():
    """cluster_node_failure_policy exclude: n3 failed nvidia_driver.version and is left out, n2 is left out as a
    machine the record remembers; the page names both as excluded, with the failing check, and lists the record."""
    from ansible_collections.trainyard.core.plugins.plugin_utils import bad_machines as bm

    report = _report()
    report["failures"] = [r for r in report["records"] if r["status"] == "fail"]
    report["failed"] = True
    machines = [{"id": "m-3f9c1a2b7d40", "last_host": "n3", "first_failed": "2026-11-27T07:00:00Z",
                 "last_failed": "2026-11-27T09:00:00Z", "failures": 2, "checks": ["nvidia_driver.version: driver 570.1"]},
                {"id": "m-0000000000a2", "last_host": "n2", "first_failed": "2026-11-26T07:00:00Z",
                 "last_failed": "2026-11-26T07:00:00Z", "failures": 1, "checks": ["nvidia_driver.pcie_link: x8"]}]
    exclusion = {"policy": "exclude", "summary": "2 of 3 nodes left out: n3, n2; launching on 1",
                 "excluded": [{"host": "n3", "id": "m-3f9c1a2b7d40", "reason": "failed",
                               "checks": ["nvidia_driver.version: driver 570.1"]},
                              {"host": "n2", "id": "m-0000000000a2", "reason": "remembered",
                               "checks": ["remembered as bad machine m-0000000000a2 (nvidia_driver.pcie_link: x8)"]}],
                 "remembered": [], "kept": ["n1"], "unknown": [], "notes": [],
                 "record_path": "/srv/runs/bad_machines.json", "machines": machines}
    view = bm.report_view(report, exclusion)
    section = _page.exclusion_section(view)
    assert section["hosts"] == ["n2", "n3"]  # rank order
    assert [r["check"] for r in section["excluded"][1]["failing"]] == ["nvidia_driver.version"]
    page = _page.render(view)
    parser = _Cells("tr")
    parser.feed(page)
    rows = [c for c in parser.cells if c.get("data-reason")]
    assert {(c["data-host"], c["data-reason"], c.get("data-check")) for c in rows} == {
        ("n3", "failed", "nvidia_driver.version"), ("n2", "remembered", "network.path_mtu")}
    assert 'id="exclusion" data-policy="exclude" data-excluded="n2 n3"' in page
    assert "<td>n3</td><td>excluded</td>" in page and "install 580.159.04 on n3" in page
    assert "remembered from an earlier run" in page and "failed a check of this run" in page
    assert 'data-machine="m-3f9c1a2b7d40"' in page and "/srv/runs/bad_machines.json" in page
    assert "<th>n3 (excluded)</th>" in page and "<td>n3 (excluded)</td>" in page
    assert _page.exclusion_section(_report()) is None and 'id="exclusion"' not in _page.render(_report())
