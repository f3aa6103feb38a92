# -*- coding: utf-8 -*-
"""Filters of the render play (roles nccl_env, train_args; deepspeed_config builds in plugin_utils/ds_config.py). Pure functions, importable by tests."""

from __future__ import annotations

import base64

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


def env_consistency(hosts, hostvars, per_node=nccl_vars.PER_NODE, expected_envs=None,
                    registered_var="__nccl_env_write", path_var="nccl_env_file"):
    """hosts (rank order) → {host: {consistent, missing, digest, reference, reference_hosts, diff}} of each host's
    env file (its registered job_files result); expected_envs (hosts' order) is each host's env, for per-node lines."""
    hosts = list(hosts)
    files = {h: written_text(hostvars[h].get(registered_var), hostvars[h].get(path_var)) for h in hosts}
    expected = dict(zip(hosts, expected_envs or []))
    return nccl_vars.consistency(files, list(per_node), expected)


def argv(options, extra=None):
    """An argument list from an ordered {"--option": value} dict and the user's extra list.

    None or False leave an option out, True writes the bare flag, lists become comma-joined, everything else
    str(). An option the user's extra list also gives (as --opt or --opt=value) is left to the user's.
    """
    extra = [str(a) for a in (extra or [])]
    given = {a.split("=", 1)[0] for a in extra if a.startswith("-")}
    out: list[str] = []
    for option, value in (options or {}).items():
        if option in given or value is None or value is False:
            continue
        if value is True:
            out.append(option)
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out.extend([option, str(value)])
    return out + extra


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


class FilterModule:
    def filters(self):
        return {
            "trainyard_env_consistency": env_consistency,
            "trainyard_argv": argv,
            "trainyard_nccl_fabric": nccl_fabric,
            "trainyard_nccl_fabric_probe": nccl_fabric_probe,
            "trainyard_written_text": written_text,
        }
