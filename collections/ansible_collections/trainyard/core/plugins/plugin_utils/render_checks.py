# -*- coding: utf-8 -*-
"""The render roles' checks as data (roles nccl_env, deepspeed_config; pure functions, unit-tested): the text a
job_files answer wrote or read, the fabric verdict of nccl_env.fabric, and each node's records of nccl_env.fabric,
nccl_env.consistent, deepspeed_config.consistent (built once per play on the controller), deepspeed_config.lora_gather
and deepspeed_config.valid."""

from __future__ import annotations

import base64
import hashlib

from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars

def _b64_text(content):
    return base64.b64decode(content).decode("utf-8", errors="replace")


def written_text(registered, path=None):
    """The text of `path` (None: the only file) from a registered job_files result: the file it wrote (or, in check
    mode, found), else the file it read back; None when the file is not there (or the task did not run)."""
    if not isinstance(registered, dict) or registered.get("failed") or registered.get("skipped"):
        return None
    for entry in registered.get("files") or []:
        if path in (None, entry.get("path")) and "content" in entry:
            return _b64_text(entry["content"])
    read = registered.get("read") or {}
    content = read.get(path) if path is not None else next(iter(read.values()), None)
    return None if content is None else _b64_text(content)


_FABRIC_FIX = {
    "tcp": "Set nccl_env_socket_ifname (or network_iface / cluster_data_iface) to the node's data interface, "
           "as `ip -br link` names it",
    "ib": "Install the InfiniBand driver (MLNX_OFED or rdma-core) on the node and give the container /dev/infiniband; "
          "`ibv_devinfo` must list the HCAs. A node without InfiniBand runs nccl_env_profile: tcp",
    "roce": "Configure the RoCE NICs (rdma-core, `ibv_devinfo` shows link_layer Ethernet) and give the container "
            "/dev/infiniband",
    "efa": "Attach EFA interfaces to the instance and install the EFA driver (the EFA installer); the image needs "
           "libfabric and aws-ofi-nccl (set nccl_env_plugin_dir to where libnccl-net*.so is)",
    "gcp-tcpx": "Create the VM with the GPU NICs (A3 High: four extra NICs) and mount the TCPX plugin into the "
                "image (nccl_env_plugin_dir; GCP's nccl-plugin-gpudirecttcpx installer); run the RxDM container",
    "gcp-tcpxo": "Create the VM with the GPU NICs (A3 Mega: eight extra NICs) and mount the TCPXO plugin into the "
                 "image (nccl_env_plugin_dir; GCP's nccl-plugin-gpudirecttcpx-dev installer); run the RxDM container",
}


def socket_ifaces(spec, names):
    """The interfaces NCCL_SOCKET_IFNAME=`spec` selects among `names`, as NCCL reads it: comma-separated
    prefixes, "=" for an exact name, a leading "^" to exclude (docs.nvidia.com/deeplearning/nccl, env.html)."""
    spec = str(spec or "").strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    wanted = [p for p in spec.split(",") if p]

    def hit(name):
        return any(name == p if exact else name.startswith(p) for p in wanted)

    return sorted(n for n in names if (not hit(n)) == exclude)


def nccl_fabric(profile, rdma_devices=(), link_layers=None, missing_nics=(), plugin=None, plugin_dir="",
                ib_hca="", ifname="", net_ifaces=None):
    """The verdict of nccl_env.fabric: {status, detail, fix} from what the node and the container showed.

    rdma_devices: names under /sys/class/infiniband; link_layers: {device: "InfiniBand"|"Ethernet"};
    missing_nics: GPU NICs not under /sys/class/net; plugin: the registered `find` of libnccl-net*.so* in the
    image ({} when not probed); ib_hca: nccl_env_ib_hca (the HCAs named must exist); ifname: the
    NCCL_SOCKET_IFNAME the env file carries and net_ifaces the names under /sys/class/net (None: not probed).
    """
    fix = _FABRIC_FIX.get(profile, "")
    if profile == "tcp":
        if net_ifaces is None or not str(ifname or "").strip():
            return {"status": "skip", "fix": "",
                    "detail": "profile tcp: " + ("no NCCL_SOCKET_IFNAME to look for (NCCL picks an interface)"
                                                 if not str(ifname or "").strip() else
                                                 "the interfaces of the node were not listed")}
        chosen = socket_ifaces(ifname, net_ifaces)
        if not chosen:
            return {"status": "fail", "fix": _FABRIC_FIX["tcp"],
                    "detail": f"profile tcp: NCCL_SOCKET_IFNAME={ifname} selects no interface of the node "
                              f"(it has {', '.join(sorted(net_ifaces)) or 'none'})"}
        return {"status": "pass", "fix": "",
                "detail": f"profile tcp: sockets over {', '.join(chosen)} (NCCL_SOCKET_IFNAME={ifname})"}
    problems, seen = [], []
    devices = sorted(rdma_devices or [])
    layers = link_layers or {}
    if profile in ("ib", "roce"):
        want = "InfiniBand" if profile == "ib" else "Ethernet"
        usable = [d for d in devices if layers.get(d, want) == want and not d.startswith(("rdmap", "efa"))]
        if not usable:
            found = ", ".join("%s (%s)" % (d, layers.get(d, "?")) for d in devices)
            problems.append(f"no {want} RDMA device under /sys/class/infiniband" + (f" (found {found})" if found else ""))
        named = [h.split(":")[0] for h in str(ib_hca or "").lstrip("^=").split(",") if h]
        absent = [h for h in named if not any(d == h or d.startswith(h) for d in devices)]
        if named and absent and not str(ib_hca).startswith("^"):
            problems.append(f"nccl_env_ib_hca names {', '.join(absent)}, not on this node")
        seen.append(f"RDMA devices: {', '.join(devices) or 'none'}")
    if profile == "efa":
        efa = [d for d in devices if d.startswith(("rdmap", "efa"))]
        if not efa:
            problems.append("no EFA device under /sys/class/infiniband")
        seen.append(f"EFA devices: {', '.join(efa) or 'none'}")
    if profile in ("gcp-tcpx", "gcp-tcpxo"):
        if missing_nics:
            problems.append(f"GPU NICs missing: {', '.join(missing_nics)} (nccl_env_gpu_nics)")
        else:
            seen.append("GPU NICs present")
    if profile in ("efa", "gcp-tcpx", "gcp-tcpxo"):
        plugin = plugin or {}
        found = [ln for ln in (plugin.get("stdout") or "").splitlines() if ln.strip()]
        if not plugin:
            return {"status": "skip", "fix": fix,
                    "detail": f"profile {profile}: " + "; ".join(problems + seen + ["the plugin probe did not run"])}
        if plugin.get("rc") not in (0, None) and not found:
            err = (plugin.get("stderr") or plugin.get("msg") or "").strip().splitlines()[-1:] or [""]
            if "No such container" in err[0] or "is not running" in err[0]:
                return {"status": "fail" if problems else "skip", "fix": fix,
                        "detail": f"profile {profile}: " + "; ".join(problems + seen + [
                            f"the training container is not running, so {plugin_dir}/libnccl-net*.so could not be "
                            f"looked for ({err[0]})"])}
        if not found:
            problems.append(f"no libnccl-net*.so in {plugin_dir} of the training image")
        else:
            seen.append(f"plugin {', '.join(found)}")
    if problems:
        return {"status": "fail", "detail": f"profile {profile}: " + "; ".join(problems), "fix": fix}
    return {"status": "pass", "detail": f"profile {profile}: " + "; ".join(seen), "fix": ""}


def nccl_fabric_probe(profile, probe, plugin=None, gpu_nics="", plugin_dir="", ib_hca="", ifname=""):
    """nccl_fabric's verdict from the env-file task's job_files answer (globbed interfaces, read link layers)."""
    probe = probe if isinstance(probe, dict) and not probe.get("failed") and not probe.get("skipped") else {}
    names = {pattern: [p.rsplit("/", 1)[-1] for p in paths] for pattern, paths in (probe.get("globbed") or {}).items()}
    net = names.get("/sys/class/net/*")
    layers = {path.split("/")[-4]: _b64_text(content).strip() for path, content in (probe.get("read") or {}).items()
              if path.startswith("/sys/class/infiniband/") and path.endswith("/ports/1/link_layer")}
    plugin = plugin if isinstance(plugin, dict) and not plugin.get("skipped") else {}
    missing = [n for n in str(gpu_nics or "").split(",") if n and n not in net] if net is not None else []
    return nccl_fabric(profile, names.get("/sys/class/infiniband/*", []), layers, missing, plugin, plugin_dir,
                       ib_hca, ifname, net)


# ---------------------------------------------------------------- nccl_env: the file and the records of every node
_ENV_FILE_HEAD = """\
# NCCL / torch environment of job {job}: KEY=VALUE lines, the value literally (no
# quoting), read the same by `docker run --env-file`, systemd's EnvironmentFile= and the launch module; not a shell
# script (values may hold ";"). Identical on every node except
# NODE_RANK, CUDA_VISIBLE_DEVICES and (where the nodes' names differ) the interface lines: role nccl_env checks that.
"""

# The lines a node's env file may hold differently from the others: always, where the nodes' interface names differ
# (or the network role says they are not uniform), and where the nodes' flight-recorder paths differ.
_FR_KEYS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
            "TRAINYARD_PROGRESS_DIR")


def env_file_text(sections, job, header):
    """nccl.env: the header (ansible_managed as a comment), what the file is, then each section {title, vars}."""
    out = [header.rstrip("\n"), "\n", _ENV_FILE_HEAD.format(job=job)]
    for section in sections:
        out.append(f"\n# {section['title']}\n")
        out.extend(f"{name}={value}\n" for name, value in section["vars"].items())
    return "".join(out)


def _changed(result):
    """Whether a registered (not looped) result changed, or in check mode would change, something."""
    return isinstance(result, dict) and not result.get("skipped") and bool(result.get("changed"))


def nccl_env_records(nodes, rank_order=(), iface_uniform=True,
                     write_task="nccl_env : Render the NCCL/torch env file"):
    """Each node's records nccl_env.fabric and nccl_env.consistent, every node's env file compared once (O(n)).

    nodes: {host: {validated, write, plugin}} in play order: the registered results of the build, the write and the
    plugin probe (validated holds env, path and the fabric's inputs). rank_order: the hosts by rank (ties of the
    majority go to the lowest rank; hosts outside it follow in play order). Returns {host: [fabric, consistent]};
    consistent carries pending_on (the write, for check mode)."""
    hosts = [h for h in rank_order if h in nodes] + [h for h in nodes if h not in rank_order]
    envs = {h: (nodes[h].get("validated") or {}).get("env") or {} for h in hosts}
    per_node = ["NODE_RANK", "CUDA_VISIBLE_DEVICES"]
    if len({e.get("NCCL_SOCKET_IFNAME") for e in envs.values()}) > 1 or not iface_uniform:
        per_node += ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]
    if len({e.get("TORCH_FR_DUMP_TEMP_FILE") for e in envs.values()}) > 1:
        per_node += list(_FR_KEYS)
    files = {h: written_text(nodes[h].get("write"), (nodes[h].get("validated") or {}).get("path")) for h in hosts}
    seen = nccl_vars.consistency(files, per_node, envs)
    unrendered = all(r["missing"] for r in seen.values())
    out = {}
    for host in nodes:
        validated, r = nodes[host].get("validated") or {}, seen[host]
        path, fabric_in = validated.get("path", ""), validated.get("fabric") or {}
        fabric = nccl_fabric_probe(fabric_in.get("profile", ""), nodes[host].get("write") or {},
                                   nodes[host].get("plugin") or {}, fabric_in.get("gpu_nics", ""),
                                   fabric_in.get("plugin_dir", ""), fabric_in.get("ib_hca", ""),
                                   envs[host].get("NCCL_SOCKET_IFNAME", ""))
        if unrendered:
            status, detail = "skip", f"{path} not rendered yet on any node"
        elif r["consistent"]:
            status, detail = "pass", (f"{path} sha256 {r['digest'][:12]}, same as {len(r['reference_hosts'])} of "
                                      f"{len(seen)} nodes")
        else:
            status, detail = "fail", (f"{host}: {path} differs from the majority ({', '.join(r['reference_hosts'])}): "
                                      f"{r['diff']}")
        out[host] = [
            {"check": "nccl_env.fabric", "status": fabric["status"], "detail": fabric["detail"], "fix": fabric["fix"],
             "data": {"profile": fabric_in.get("profile", "")}},
            {"check": "nccl_env.consistent", "status": status, "detail": detail,
             "fix": f"Re-render it (ansible-playbook site.yml --tags nccl_env) and look for a host_vars/group_vars "
                    f"value that differs on {host} (nccl_env_*, cluster_*); never edit nccl.env by hand.",
             "data": {"digest": r["digest"], "diff": r["diff"]},
             "pending_on": {write_task: {"changed": _changed(nodes[host].get("write"))}}},
        ]
    return out


# ---------------------------------------------------------------- deepspeed_config: this node's file and the majority
DEEPSPEED_WRITE_TASK = ("deepspeed_config : Record the DeepSpeed validation, write ds_config.json and record whether it "
                        "matches the others")


def deepspeed_consistent_record(written, majority, path, write_task=DEEPSPEED_WRITE_TASK):
    """deepspeed_config.consistent: this node's ds_config.json (its job_files answer: written, or read back) against
    the majority's sha256 (empty: no node has the file yet)."""
    text = written_text(written or {})
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest() if isinstance(text, str) else ""
    if not majority:
        status, detail = "skip", f"{path} not written yet on any node"
    elif not digest:
        status, detail = "fail", f"{path} missing"
    else:
        status = "pass" if digest == majority else "fail"
        detail = f"{path} sha256 {digest[:12]}" + (", same as the majority" if digest == majority
                                                   else f", differs from the majority {majority[:12]}")
    return {"check": "deepspeed_config.consistent", "status": status, "detail": detail,
            "fix": "Re-render it (ansible-playbook site.yml --tags deepspeed_config); never edit ds_config.json by hand.",
            "pending_on": {write_task: {"changed": _changed(written)}}}


def deepspeed_records(built, verdict, version="", auto_filler="trainer"):
    """The node's deepspeed_config.lora_gather and deepspeed_config.valid records from its built config
    (ds_config.render) and DeepSpeed's verdict on it (None: not validated)."""
    lora, added, kept = built["lora"], built["added"], built["kept"]
    detail = ("deepspeed_config_validate is false" if verdict is None else "; ".join(verdict["errors"])
              if not verdict["ok"] else f'{built["label"]}, accepted by DeepSpeed {version or "?"}, "auto" filled by '
              f'{auto_filler}' + "".join([", added: " + ", ".join(a["key"] for a in added)] * bool(added))
              + "".join([", " + "; ".join(kept)] * bool(kept)))
    return [{"check": "deepspeed_config.lora_gather", "status": lora["status"], "detail": lora["detail"],
             "fix": f"Remove {lora['variable']} (or set it to true): with LoRA under ZeRO-3, "
                    "stage3_gather_16bit_weights_on_model_save must be true or the saved adapter is empty."},
            {"check": "deepspeed_config.valid", "status": "skip" if verdict is None else
             "pass" if verdict["ok"] else "fail", "detail": detail,
             "fix": "Correct the key named above in deepspeed_config_base_file or deepspeed_config_overrides (or the "
                    "deepspeed_config_* variable that sets it); a top-level key another tool reads goes in "
                    'deepspeed_config_allow_unknown_keys; an "auto" goes with the integration that fills it '
                    "(deepspeed_config_auto_filler).",
             "data": {"source": built["source"], "added": added, "kept": kept, "overridden": built["overridden"],
                      "duplicate_spellings": built["duplicates"], "auto_filler": auto_filler,
                      "drift": {"deepspeed_config_profile": built["drift"]}}}]
