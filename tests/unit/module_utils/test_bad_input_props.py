"""Property tests: the parsers behind the modules' entry points turn any input into a result or their own named
error (which the module reports as one line), never another exception (a traceback)."""

from __future__ import annotations

import json
import posixpath

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model as cm
from ansible_collections.trainyard.core.plugins.module_utils import nvidia_smi as ns
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
from helpers import load

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                  max_size=6), max_leaves=20)
STATE_KEYS = ["job", "pid", "pgid", "start_ticks", "command", "log", "sidecars", "token", "torchrun_pid", "master_port",
              "node_rank", "fingerprint", "exit_file", "started_at", "name"]


def job_reset():
    return load("library/job_reset.py", "job_reset_props")


@SETTINGS
@given(st.dictionaries(st.sampled_from(STATE_KEYS), JSONISH, max_size=10) | JSONISH)
def test_any_launch_json_is_parsed_or_refused_with_a_value_error(data):
    try:
        state = tr.parse_state(json.dumps(data))
    except ValueError:
        return
    # What the module does with an accepted state must not raise either.
    for sc in state["sidecars"]:
        assert sc.get("pid") is None or isinstance(sc["pid"], int)
    assert job_reset().state_problem(state) is None


@SETTINGS
@given(st.dictionaries(st.sampled_from(STATE_KEYS), JSONISH, max_size=10) | JSONISH)
def test_job_reset_names_every_state_it_cannot_use(data):
    why = job_reset().state_problem(data)
    assert why is None or isinstance(why, str)
    if why is None:
        for key in ("pid", "pgid", "start_ticks"):
            assert data.get(key) is None or (isinstance(data[key], int) and not isinstance(data[key], bool))


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_from_nvidia_smi_parse_or_raise_the_named_error(raw):
    for text in (raw, raw.decode("utf-8", "surrogateescape")):
        try:
            ns.parse_query_xml(text)
        except ns.NvidiaSmiParseError:
            pass


@SETTINGS
@given(st.text(max_size=200))
def test_secret_env_problems_never_show_the_text(text):
    env, problems = tr.parse_secret_env(text, "f")
    for p in problems:
        assert p.startswith("f line ") and "value is not shown" in p
    assert all(tr._ENV_NAME.match(k) for k in env)


@SETTINGS
@given(st.text(alphabet="/.ab~", max_size=30))
def test_path_check_matches_normpath_and_never_raises(path):
    problems = cm.path_problems("cluster_output_root", path, ["n1"])
    assert len(problems) <= 1
    if path.strip().startswith("/"):
        norm = cm.normalise_path(path)
        assert norm == "/" + posixpath.normpath(path.strip()).lstrip("/")
        assert bool(problems) == (cm.denied_path(norm) or ".." in path.strip().split("/"))


@SETTINGS
@given(st.text(max_size=40), st.text(max_size=40))
def test_redaction_hides_every_value_under_a_secret_looking_name(key, value):
    shown = cm.redact({f"api_{key}_token": value, "plain": [f"PASSWORD={value}"]}, "launch_env")
    assert shown[f"api_{key}_token"] == cm.HIDDEN and shown["plain"] == [f"PASSWORD={cm.HIDDEN}"]
