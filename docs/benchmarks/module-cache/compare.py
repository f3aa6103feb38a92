import json, sys, os
sys.path.insert(0, "tests"); sys.path.insert(0, "tests/bench")
from pathlib import Path
import scale, userpath
from helpers import BIN
name = sys.argv[1]; reps = int(sys.argv[2]); out = sys.argv[3]
meta = json.loads(Path(f".sim/{name}/cluster.json").read_text())
g = scale.CpuGroup(f"cc-{os.getpid()}")
rows = []
try:
    for i in range(reps):
        for label, env in ((("off", {"TRAINYARD_MODULE_CACHE": "false"}), ("on", {})) if i % 2 == 0 else (("on", {}), ("off", {"TRAINYARD_MODULE_CACHE": "false"}))):
            r = scale.measured_run(BIN, Path(meta["inventory"]), meta["nodes"], g, env_extra=env, label=f"{label}{i}", args=["-e", userpath.LONG_JOB])
            rows.append({"cache": label, "round": i, **{k: r[k] for k in ("nodes", "rc", "changed", "wall_s", "controller_cpu_s", "controller_main_cpu_s", "node_cpu_s", "others_cpu_s", "tasks_by_host")}})
            Path(out).write_text(json.dumps(rows, indent=1))
finally:
    g.close()
