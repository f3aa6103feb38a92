"""Every parser of job-written text (the torchrun log and its failure report, torchelastic error files, py-spy and
faulthandler stacks, the flight-recorder analyzer's report of the job's dumps, env dumps, kernel log lines that
name the job's processes) runs in linear time on adversarial 1 MiB lines.

The budget is a subprocess timeout, not a timed assertion: on the code before this test each of these parsers ran
for hours on one of the inputs (a regex retried from every start of a long line, `\\s*` across every following
line, a traceback joined one line at a time)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BUDGET_S = 20  # generous for a loaded 2-core machine; the quadratic cases took hours

# Each parser gets every input below, alone and inside the context that makes it parse the line (a failure report).
CASES = {
    "parse_failures": "tr.parse_failures(REPORT + x)",
    "root_cause": "tr.root_cause(REPORT + x)",
    "failure_class": "tr.failure_class({'traceback': x})",
    "failure_tail": "tr.failure_tail(x); tr.log_tail(x); tr.last_line(x)",
    "find_marker": "tr.find_marker(x, 'trainyard: first step done'); tr.find_marker(x, 'first step.*done')",
    "error_files_in_log": "jc.error_files_in_log(x)",
    "parse_fr_report": "jc.parse_fr_report(x)",
    "parse_stacks": "jc.main_call(jc.parse_stacks(x))",
    "redact": "jc.redact_env_text(x); jc.redact_json([x, {'k': x}])",
    "parse_kernel_log": "gh.parse_kernel_log(x)",
}

SCRIPT = r'''
import sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
from ansible_collections.trainyard.core.plugins.module_utils import gpu_health as gh
from ansible_collections.trainyard.core.plugins.module_utils import job_collect as jc
from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr

N = 1 << 20
REPORT = "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-22_21:25:32\n  traceback : "
SEPS = ["a", " ", "\n", "\n ", "\t", "ProcessGroup", "ProcessGroupNCCL ", "mismatch", ", sequence number: ",
        "error_file: ", "  error_file :", "NVRM: Xid (0000:00:00 ", "NVRM: Xid (PCI:0000:00:00", "Out of memory: Killed process 1 (",
        "Memory cgroup out of memory: Killed process 1 (", "x[1", "[1]: segfault a", "Signal 1 (SIG", "  File \"",
        "\", line 1 in ", "Thread 0x1 (", "  f (a.py:", ":1", "E1122 12:00:00.0 1 a", "export ", "A_TOKEN=",
        " FAILED", "first step", "Root Cause", "[0]:", "  traceback : ", "  x", "\n  x"]
for sep in SEPS:
    x = (sep * (N // len(sep) + 1))[:N]
    exec(sys.argv[2])
print("ok")
'''


@pytest.mark.parametrize("name", sorted(CASES))
def test_parser_is_linear_on_adversarial_megabyte_lines(name):
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "collections"), CASES[name]],
                       capture_output=True, text=True, timeout=BUDGET_S)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_capped_lines_cut_every_line():
    sys.path.insert(0, str(REPO / "tests"))
    from ansible_collections.trainyard.core.plugins.module_utils import torchrun as tr
    lines = tr.capped_lines("a" * (3 * tr.LINE_MAX) + "\nb\n")
    assert lines == ["a" * tr.LINE_MAX, "b"]
