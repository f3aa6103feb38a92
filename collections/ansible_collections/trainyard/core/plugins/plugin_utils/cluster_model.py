# -*- coding: utf-8 -*-
"""The cluster model and the inventory checks, as pure functions (stdlib + PyYAML only).

One place computes node rank, nnodes and world size (``compute_models``); one place checks the inventory
before any host is contacted (``validate``). The action plugin ``cluster_validate`` feeds both with the
trainers' variables; the unit tests call them directly.

Every problem is one line that starts with "Stop if", names the host(s), the variable and the bad value,
and says how to fix it. ``validate`` returns all of them at once.

Typing rules (documented in roles/cluster/README.md):
  * Values from YAML/JSON sources (group_vars, host_vars, YAML inventories, ``-e @file``, ``-e '{json}'``)
    are strict: ``"8"`` where an int is needed is an error, ``"yes"`` where a bool is needed is an error.
  * Values from sources that cannot carry types (``-e key=value`` on the command line, ``[group:vars]``
    and host lines of INI inventories) are converted the way Ansible's argument spec does: decimal digits
    to int, true/false/yes/no/on/off/1/0 to bool. Such values are passed in ``lenient``.
  * An int or float is accepted where a str is expected (it converts without loss); a bool is not.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from ansible_collections.trainyard.core.plugins.module_utils.cluster_lock import lock_dir_problem
from ansible_collections.trainyard.core.plugins.module_utils.netcheck import EXCLUDED_EXACT, EXCLUDED_PREFIXES
from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars
from ansible_collections.trainyard.core.plugins.module_utils.torchrun import SECRET_NAME
from ansible_collections.trainyard.core.plugins.plugin_utils.did_you_mean import nearest

TRAINERS = "trainers"
KNOWN_PREFIXES = ("cluster_", "network_", "nvidia_driver_", "fabricmanager_", "container_", "nccl_env_",
                  "deepspeed_config_", "train_args_", "launch_", "janitor_")
# Cluster variables that may differ between nodes; every other cluster_* value must be the same everywhere.
# Node-local settings that may differ per node (interface names, disk mount points); the rest is one value per cluster.
PER_HOST_CLUSTER_VARS = frozenset({"cluster_data_iface", "cluster_output_root", "cluster_state_dir"})
# Role variables a play reads once for every node (the network role's path proof: its pairs and its ping settings
# are planned once per play): like cluster_* values, one value for the cluster.
ONE_PER_CLUSTER_VARS = frozenset({"network_path_wait_s", "network_path_retries", "network_path_workers",
                                  "network_connect_timeout_s", "network_path_mtu_full_mesh_max",
                                  "network_path_mtu_samples", "network_path_mtu_seed"})
# The DeepSpeed config is built and validated once for the play (roles/deepspeed_config/tasks/build.yml): every rank
# runs with the same config, so each deepspeed_config_* value is one for the cluster too, except where the file goes.
PER_HOST_DEEPSPEED_VARS = frozenset({"deepspeed_config_dir", "deepspeed_config_path"})
MTU_RANGE = (1280, 9216)
PORT_RANGE = (1024, 65535)
# Interface names (regular expressions, full match) never the data interface: module_utils/netcheck.py's list.
BAD_IFACE_PATTERNS = tuple(EXCLUDED_EXACT) + tuple(prefix + ".*" for prefix in EXCLUDED_PREFIXES)
PATH_VARS = ("cluster_output_root", "cluster_shared_root", "cluster_code_dir", "cluster_state_dir")
# Every variable whose name ends like this holds a path (a value, or a list of them for *_files); container mount
# sources too. Each is normalised and checked against DENIED_ROOTS (the directory itself, not what lies below).
PATH_SUFFIXES = ("_root", "_dir", "_file", "_path", "_log", "_files")
MOUNT_VARS = ("container_mounts", "container_mounts_extra")
NOT_PATHS = frozenset({"train_args_model_name_or_path"})       # a hub id ("org/model") as often as a path
# Paths resolved from a working directory of their own: relative is fine (the deny list still applies).
RELATIVE_OK = frozenset({"cluster_run_dir",                      # on the controller, from the working directory
                         "train_args_dataset_dir"})              # llamafactory resolves it from the job's chdir
DENIED_ROOTS = frozenset({
    "/", "/bin", "/boot", "/boot/efi", "/dev", "/dev/shm", "/dev/mqueue", "/dev/pts", "/etc", "/home", "/lost+found",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/run/lock", "/run/user", "/sbin", "/snap", "/srv", "/sys",
    "/tmp", "/usr", "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/local",
    "/usr/local/bin", "/usr/local/lib", "/usr/sbin", "/usr/share", "/usr/src", "/var", "/var/cache", "/var/lib",
    "/var/lib/docker", "/var/lock", "/var/log", "/var/mail", "/var/opt", "/var/run", "/var/spool", "/var/tmp"})
DENIED_ROOT_RE = re.compile(r"^/lib[^/]*$")                      # /lib, /lib32, /lib64, /libx32, ...
# Kernel file systems: no path below them holds job data.
DENIED_TREES = ("/proc", "/sys", "/dev/pts", "/dev/mqueue")
# Variable names (or env keys) whose values are never printed: the one rule of module_utils/torchrun.py.
SECRET_NAME_RE = SECRET_NAME
HIDDEN = "<hidden>"
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
IFACE_RE = re.compile(r"^[^\s/:]{1,15}$")
HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_TRUE = ("true", "yes", "on", "1", "y", "t")
_FALSE = ("false", "no", "off", "0", "n", "f")
MAX_HOSTS_NAMED = 8


# --------------------------------------------------------------------------------------------- problems
@dataclass
class Problem:
    """One finding. Findings that differ only by host are merged into one line naming every host."""

    what: str                       # the condition, after "Stop if "
    fix: str
    var: str = ""
    value: Any = None
    hosts: list = field(default_factory=list)
    has_value: bool = False

    def key(self) -> tuple:
        return (self.what, self.fix, self.var, _show(self.value) if self.has_value else None)

    def line(self, all_hosts: Iterable[str] = ()) -> str:
        where = ""
        if self.hosts:
            hosts = list(dict.fromkeys(self.hosts))
            all_hosts = list(all_hosts)
            if len(all_hosts) > 1 and sorted(hosts) == sorted(all_hosts):
                where = f" on all {len(hosts)} trainers"
            else:
                where = f" on {hosts_named(hosts)}"
        value = f" ({self.var} = {_show(redact(self.value, self.var))})" if self.has_value else ""
        return f"Stop if {self.what}{where}{value}. Fix: {self.fix}"


def hosts_named(hosts: Iterable[str], limit: int = MAX_HOSTS_NAMED) -> str:
    """'a, b' or 'a, ..., h and 56 more': at most `limit` hosts named, the rest counted, so that a line (or a node's
    record) stays the same size at any cluster size."""
    hosts = [str(h) for h in hosts]
    more = f" and {len(hosts) - limit} more" if len(hosts) > limit else ""
    return ", ".join(hosts[:limit]) + more


def _show(value: Any) -> str:
    """The value as the user wrote it: strings quoted, so "8" and 8 look different."""
    if isinstance(value, str):
        return repr(str(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null (empty)"
    text = repr(_plain(value))
    return text if len(text) <= 120 else text[:117] + "..."


def looks_secret(name: Any) -> bool:
    """True when a variable name or env key looks like it holds a secret (token, password, key, ...)."""
    return bool(SECRET_NAME_RE.search(str(name)))


def redact(value: Any, name: str = "") -> Any:
    """The value with everything that may be a secret replaced by HIDDEN: the whole value when its name looks
    secret, values under secret-looking keys of mappings, and KEY=value strings with a secret-looking KEY."""
    if name and looks_secret(name):
        return HIDDEN
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        m = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*[=:]", value)
        if m and looks_secret(m.group(1)):
            return f"{m.group(1)}={HIDDEN}"
    return value


def _plain(value: Any, json_safe: bool = False) -> Any:
    """Strip Ansible's tagged types so reprs are readable; json_safe: keys and any other object as text (the
    report's JSON), None kept."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {(str(k) if json_safe else _plain(k)): _plain(v, json_safe) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, json_safe) for v in value]
    return str(value) if json_safe and value is not None else value


def merge(problems: Iterable[Problem]) -> list[Problem]:
    out: dict[tuple, Problem] = {}
    for p in problems:
        k = p.key()
        if k in out:
            out[k].hosts.extend(h for h in p.hosts if h not in out[k].hosts)
        else:
            out[k] = Problem(p.what, p.fix, p.var, p.value, list(p.hosts), p.has_value)
    return list(out.values())


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    n = nearest(name, candidates)
    return f"did you mean '{n}'?" if n else "no similar name exists"


# --------------------------------------------------------------------------------------------- specs
def load_role_specs(roles_dir: str | Path) -> dict[str, dict]:
    """{role: {"options": {var: spec}, "defaults": set(var)}} from every roles/*/meta/argument_specs.yml.

    Options of every entry point are merged, the main entry point winning; names in defaults/main.yml that
    no spec types are known (untyped), so they are not reported as unknown.
    """
    import yaml  # controller side only

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~20x faster on a dozen spec files
    roles: dict[str, dict] = {}
    for spec_file in sorted(Path(roles_dir).glob("*/meta/argument_specs.y*ml")):
        role = spec_file.parent.parent.name
        data = yaml.load(spec_file.read_text(), Loader=loader) or {}
        entry_points = (data.get("argument_specs") or {}) if isinstance(data, dict) else {}
        options: dict[str, dict] = {}
        for ep_name in sorted(entry_points, key=lambda n: n == "main"):  # main last: it wins
            for var, spec in ((entry_points[ep_name] or {}).get("options") or {}).items():
                options[var] = spec if isinstance(spec, dict) else {}
        defaults: set[str] = set()
        for dflt in ("defaults/main.yml", "defaults/main.yaml"):
            f = spec_file.parent.parent / dflt
            if f.is_file():
                loaded = yaml.load(f.read_text(), Loader=loader) or {}
                if isinstance(loaded, dict):
                    defaults.update(loaded)
        roles[role] = {"options": options, "defaults": defaults}
    return roles


def prefixes_for(roles: Mapping[str, dict]) -> dict[str, str]:
    """{prefix: role}: the known prefixes plus one per role that has a spec."""
    out = {p: p[:-1] for p in KNOWN_PREFIXES}
    for role in roles:
        out[f"{role}_"] = role
    return out


def owner(var: str, prefixes: Mapping[str, str]) -> str | None:
    """The role whose prefix is the longest match of var (nccl_env_x → nccl_env, not a shorter one)."""
    best = None
    for prefix in prefixes:
        if var.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return prefixes[best] if best else None


# --------------------------------------------------------------------------------------------- typing
def _coerce(value: Any, typ: str) -> Any:
    """Ansible's own conversion for values from untyped sources (INI, -e key=value)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if typ == "int" and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if typ == "float" and re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", text):
        return float(text)
    if typ == "bool" and text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    return value


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, Mapping):
        return "dict"
    if isinstance(value, (list, tuple)):
        return "list"
    if value is None:
        return "null"
    return type(value).__name__


_NAMES = {"str": "string", "int": "integer", "bool": "boolean", "float": "number", "dict": "mapping",
          "list": "list", "path": "path (string)", "null": "null"}


def _a(typ: str) -> str:
    name = _NAMES.get(typ, typ)
    return ("an " if name[:1] in "aeiou" else "a ") + name


def _type_fix(var: str, value: Any, typ: str) -> str:
    if looks_secret(var):
        value = None  # never echoed into the fix either
    if typ == "int" and isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return f"write {var}: {value.strip()} without quotes"
    if typ == "int" and isinstance(value, float) and value.is_integer():
        return f"write {var}: {int(value)} (a whole number)"
    if typ == "bool" and isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return f"write {var}: {'true' if value.strip().lower() in _TRUE else 'false'} without quotes"
    if typ == "float" and isinstance(value, str):
        return f"write {var} as a number without quotes"
    if typ == "list":
        return f"write {var} as a YAML list (- item per line, or [a, b])"
    if typ == "dict":
        return f"write {var} as a YAML mapping (key: value)"
    return f"give {var} a value of type {typ}"


def type_ok(value: Any, typ: str) -> bool:
    if typ in ("raw", "", None) or callable(typ):
        return True
    if typ == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ == "bool":
        return isinstance(value, bool)
    if typ in ("str", "path"):
        return isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    if typ == "list":
        return isinstance(value, (list, tuple))
    if typ == "dict":
        return isinstance(value, Mapping)
    if typ in ("jsonarg", "json"):
        return isinstance(value, (str, Mapping, list, tuple))
    if typ in ("bytes", "bits"):
        return isinstance(value, (str, int)) and not isinstance(value, bool)
    return True


def check_value(var: str, value: Any, spec: Mapping, host: str, lenient: bool = False) -> list[Problem]:
    """Type, choices and nested options of one value against its argument spec entry (recursive)."""
    problems: list[Problem] = []
    typ = spec.get("type", "str") if isinstance(spec.get("type", "str"), str) else "raw"
    if lenient:
        value = _coerce(value, typ)
    if value is None and typ not in ("raw",):
        # An empty YAML value ("var:" with nothing after it) is almost always a mistake.
        problems.append(Problem(f"{var} is empty (null) but must be {_a(typ)}", _type_fix(var, value, typ), var, value,
                                [host], True))
        return problems
    if not type_ok(value, typ):
        problems.append(Problem(f"{var} is {_a(_type_name(value))} but must be {_a(typ)}", _type_fix(var, value, typ),
                                var, value, [host], True))
        return problems
    choices = spec.get("choices")
    if choices and typ != "list":
        if _plain(value) not in [_plain(c) for c in choices]:
            n = nearest(str(value), [str(c) for c in choices])
            hint = f" ('{n}'?)" if n else ""
            problems.append(Problem(f"{var} is not one of {', '.join(map(str, choices))}",
                                    f"set {var} to one of: {', '.join(map(str, choices))}{hint}", var, value,
                                    [host], True))
    if typ == "list":
        elements = spec.get("elements")
        for i, item in enumerate(value):
            sub = {"type": elements or "raw", "options": spec.get("options"), "choices": choices}
            problems += check_value(f"{var}[{i}]", item, sub, host, lenient)
    elif typ == "dict" and isinstance(spec.get("options"), Mapping):
        problems += _check_options(var, value, spec["options"], host, lenient)
    return problems


def _check_options(var: str, value: Mapping, options: Mapping, host: str, lenient: bool) -> list[Problem]:
    problems: list[Problem] = []
    for key, item in value.items():
        if key not in options:
            problems.append(Problem(f"{var} has the unknown key '{key}'",
                                    f"{_did_you_mean(str(key), options)} Valid keys: {', '.join(sorted(options))}",
                                    f"{var}.{key}", item, [host], True))
            continue
        problems += check_value(f"{var}.{key}", item, options[key] or {}, host, lenient)
    for key, sub in options.items():
        if (sub or {}).get("required") and key not in value:
            problems.append(Problem(f"{var} lacks the required key '{key}'", f"add {key} to {var}", var, value,
                                    [host], True))
    return problems


# --------------------------------------------------------------------------------------------- helpers
def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def address_problem(text: Any) -> str | None:
    """Why text is not a usable address (IPv4/IPv6 or DNS name), or None."""
    if not isinstance(text, str) or not text.strip():
        return "is empty or not a string"
    text = text.strip()
    if re.fullmatch(r"[\d.]+", text) or ":" in text:
        if not _is_ip(text):
            return "is not a valid IP address"
        ip = ipaddress.ip_address(text)
        if ip.is_unspecified or ip.is_multicast:
            return "is not a unicast address"
        return None
    if not HOSTNAME_RE.match(text):
        return "is neither an IP address nor a valid host name"
    return None


def bad_iface(name: str, patterns: Iterable[str] = BAD_IFACE_PATTERNS) -> str | None:
    for pat in patterns:
        if re.fullmatch(pat, name):
            return pat
    return None


def _norm_path(p: str) -> str:
    p = re.sub(r"/+", "/", p.strip())
    return p.rstrip("/") or "/"


# --------------------------------------------------------------------------------------------- model
def effective(var: str, host_vars: Mapping, defaults: Mapping) -> Any:
    return host_vars[var] if var in host_vars else defaults.get(var)


def order_hosts(hosts: list[str], ranks: Mapping[str, Any]) -> list[str]:
    """hosts_by_rank: by node_rank where every host has one, else inventory order."""
    if hosts and all(isinstance(ranks.get(h), int) and not isinstance(ranks.get(h), bool) for h in hosts):
        return sorted(hosts, key=lambda h: ranks[h])
    return list(hosts)


def data_address(host: str, host_vars: Mapping) -> str:
    addr = host_vars.get("data_address") or host_vars.get("ansible_host") or host
    return str(addr).strip()


def compute_models(hosts: list[str], hostvars: Mapping[str, Mapping], defaults: Mapping | None = None) -> dict:
    """{host: cluster_model} for every trainer. Assumes validate() found no problem."""
    defaults = defaults or {}
    ranks = {h: hostvars[h].get("node_rank") for h in hosts}
    by_rank = order_hosts(hosts, ranks)
    head = by_rank[0]
    hv_head = hostvars[head]
    gpus = int(effective("cluster_gpus_per_node", hv_head, defaults) or 0)
    nproc = effective("cluster_nproc_per_node", hv_head, defaults)
    nproc = int(nproc) if _is_int_like(nproc) else (gpus or 1)
    master = effective("cluster_master_addr", hv_head, defaults) or data_address(head, hv_head)
    port = int(effective("cluster_rendezvous_port", hv_head, defaults) or 39500)
    nnodes = len(by_rank)
    rank_of = {h: i for i, h in enumerate(by_rank)}
    return {
        h: {
            "node_rank": rank_of[h],
            "nnodes": nnodes,
            "nproc_per_node": nproc,
            "world_size": nnodes * nproc,
            "head": head,
            "master_addr": str(master),
            "master_port": port,
            "hosts_by_rank": list(by_rank),
            "data_address": data_address(h, hostvars[h]),
        }
        for h in hosts
    }


# The options that decide whether a node installs anything in a run (site.yml's install play: only the nodes that do).
INSTALL_OPTIONS = ("nvidia_driver_install", "container_enabled", "container_engine_install", "container_image")


def _truthy(value: Any) -> bool:
    """A boolean option as Ansible's bool filter reads it (a string "false" is false)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)


def install_nodes(hosts: list[str], hostvars: Mapping[str, Mapping], defaults: Mapping,
                  unread: Mapping[str, Iterable] | None = None) -> list[str]:
    """The trainers that install something in this run, in hosts' order: nvidia_driver_install, or the container role
    on with container_engine_install and an image named (with no image the role's engine probe refuses before it
    installs). hostvars: each host's own values (what the inventory and the extra vars set); defaults: the options'
    values where a host sets none; unread: {host: names} the host sets but the controller could not read yet (a
    template that resolves later, on the node). A value still a template, or unread, counts the node in: the role's own
    condition decides there."""
    picked = []
    for host in hosts:
        own = hostvars.get(host) or {}
        value = {k: own.get(k, defaults.get(k)) for k in INSTALL_OPTIONS}
        if any(_templated(v) for v in value.values()) or set(INSTALL_OPTIONS) & set((unread or {}).get(host, ())):
            picked.append(host)
        elif _truthy(value["nvidia_driver_install"]) or (
                _truthy(value["container_enabled"]) and _truthy(value["container_engine_install"])
                and str(value["container_image"] or "").strip()):
            picked.append(host)
    return picked


def _is_int_like(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and v.strip().isdigit())


# --------------------------------------------------------------------------------------------- validate
def validate(groups: Mapping[str, list], hostvars: Mapping[str, Mapping], roles: Mapping[str, dict] | None = None,
             defaults: Mapping | None = None, removed: Mapping[str, Mapping] | None = None,
             reserved: Mapping[str, str] | None = None, lenient: Mapping[str, Iterable[str]] | None = None,
             bad_iface_patterns: Iterable[str] = BAD_IFACE_PATTERNS) -> list[str]:
    """Every problem of the inventory, as "Stop if …" lines (empty list: the inventory is good).

    groups: inventory groups ({group: [hosts]}); hostvars: {host: {var: value}} of the variables the user set
    (inventory, group_vars, host_vars, extra vars; no facts). roles: load_role_specs(); defaults: the cluster
    role's defaults; removed: {old_name: {"new": name, "note": text}}; reserved: {fact: role that sets it};
    lenient: {host: names whose values came from an untyped source (INI, -e key=value)}.
    """
    roles = roles or {}
    defaults = dict(defaults or {})
    removed = removed or {}
    reserved = reserved or {}
    lenient = {h: set(v) for h, v in (lenient or {}).items()}
    problems: list[Problem] = []

    # ---- the trainers group
    if TRAINERS not in groups:
        other = [g for g in groups if g not in ("all", "ungrouped")]
        n = nearest(TRAINERS, other)
        hint = f" (the group '{n}' looks like a typo of it)" if n else ""
        return [Problem(f"the inventory has no group '{TRAINERS}'{hint}",
                        f"put the training nodes under all.children.{TRAINERS}.hosts (YAML) or [{TRAINERS}] (INI)"
                        ).line()]
    hosts = list(groups.get(TRAINERS) or [])
    if not hosts:
        return [Problem(f"the group '{TRAINERS}' has no hosts",
                        f"add the training nodes to the group '{TRAINERS}'").line()]

    specs = {role: r.get("options") or {} for role, r in roles.items()}
    known = {role: set(r.get("options") or {}) | set(r.get("defaults") or ()) for role, r in roles.items()}
    prefixes = prefixes_for(roles)
    # A variable belongs to the role whose spec or defaults name it (the job and recover roles keep the launch_
    # names they had in the launch role); an unknown one to the role of its longest prefix.
    holder = {var: role for role, names in known.items() for var in names}

    # ---- per-host variables: removed, reserved, unknown, typing
    typed: dict[str, dict[str, Any]] = {}
    for h in hosts:
        hv = hostvars.get(h) or {}
        typed[h] = {}
        for var in sorted(hv):
            value = hv[var]
            if var in removed:
                info = removed[var] or {}
                new = info.get("new") or ""
                note = info.get("note") or ""
                fix = (f"rename {var} to {new}" if new else f"remove {var}") + (f" ({note})" if note else "")
                problems.append(Problem(f"the removed variable {var} is set", fix, var, value, [h], True))
                continue
            if var in reserved:
                problems.append(Problem(f"{var} is set in the inventory but is a fact computed by the role "
                                        f"{reserved[var]}", f"remove {var} from the inventory", var, value, [h], True))
                continue
            role = holder.get(var) or owner(var, prefixes)
            if role is None:
                continue
            if role not in known:
                continue  # that role has no spec (yet): nothing to check against
            if var not in known[role]:
                # Named, never with its value: a misspelt password variable must not be printed.
                near = nearest(var, [v for v in holder if owner(v, prefixes) == role])
                problems.append(Problem(f"{var} is not a variable of the role {role}",
                                        (f"did you mean '{near}'?" if near else "no similar name exists")
                                        + " (see roles/" + holder.get(near, role) + "/meta/argument_specs.yml)", var))
                continue
            spec = specs[role].get(var)
            if spec is None:
                typed[h][var] = value
                continue
            found = check_value(var, value, spec, h, lenient=var in lenient.get(h, ()))
            problems += found
            if not found:
                typed[h][var] = _coerce(value, spec.get("type", "str")) if var in lenient.get(h, ()) else value

    # ---- options of different roles that contradict each other
    problems += _check_across_roles(hosts, typed, specs)

    # ---- host identity: node_rank, addresses
    problems += _check_ranks(hosts, hostvars, lenient)
    problems += _check_addresses(hosts, hostvars)

    # ---- cluster variables (and the role variables read once per play): uniform across nodes, then their values
    cluster_vars = sorted({v for h in hosts for v in (hostvars.get(h) or {}) if one_per_cluster(v)})
    for var in cluster_vars:
        if var in removed or var in reserved:
            continue
        seen: dict[str, list[str]] = {}
        default = (defaults.get(var) if var.startswith("cluster_")
                   else ((specs.get(holder.get(var, "")) or {}).get(var) or {}).get("default"))
        by_default: set[str] = set()
        for h in hosts:
            hv = hostvars.get(h) or {}
            shown = _show(redact(typed[h].get(var, hv.get(var)) if var in hv else default, var))
            if var not in hv:
                by_default.add(shown)
            seen.setdefault(shown, []).append(h)
        if len(seen) > 1:
            detail = "; ".join(f"{', '.join(hs[:4])}{' …' if len(hs) > 4 else ''} = {v}"
                               f"{' (default)' if v in by_default else ''}" for v, hs in seen.items())
            problems.append(Problem(f"{var} differs between trainers ({detail})",
                                    f"set {var} once for the cluster (group_vars/all.yml or the trainers group), "
                                    "not per host"))

    head = order_hosts(hosts, {h: (hostvars.get(h) or {}).get("node_rank") for h in hosts})[0]
    for h in hosts:
        problems += _check_cluster_values(h, head, hosts, typed[h], hostvars, defaults, bad_iface_patterns)
        problems += check_paths(h, typed[h])

    merged = merge(problems)
    return [p.line(hosts) for p in merged]


def one_per_cluster(var: str) -> bool:
    """Whether `var` must have one value on every trainer: the cluster_* values but the node-local ones, the role
    variables a play reads once for every node, and the DeepSpeed config's."""
    if var.startswith("cluster_"):
        return var not in PER_HOST_CLUSTER_VARS
    if var.startswith("deepspeed_config_"):
        return var not in PER_HOST_DEEPSPEED_VARS
    return var in ONE_PER_CLUSTER_VARS


def _check_across_roles(hosts: list[str], typed: Mapping[str, Mapping], specs: Mapping[str, Mapping]) -> list[Problem]:
    """Well-typed options of two roles that cannot both hold."""
    problems: list[Problem] = []
    runtime_default = ((specs.get("launch") or {}).get("launch_runtime") or {}).get("default", "docker")
    for h in hosts:
        t = typed.get(h) or {}
        runtime = t.get("launch_runtime", runtime_default)
        if t.get("container_enabled") is False and runtime == "docker":
            problems.append(Problem("container_enabled is false while launch_runtime is docker (the job would "
                                    "start inside a training container that nothing creates)",
                                    "set launch_runtime: host to run the job on the node itself, or remove "
                                    "container_enabled", "container_enabled", False, [h], True))
        problems += _check_node_counts(h, len(hosts), t, specs)
        problems += _check_backend(h, t, specs)
        problems += check_role_rules(h, t, specs)
    images: dict[str, list[str]] = {}
    for h in hosts:
        t = typed.get(h) or {}
        if t.get("container_enabled") is not False and isinstance(t.get("container_image"), str):
            images.setdefault(t["container_image"].strip(), []).append(h)
    if len(images) > 1:
        seen = "; ".join(f"{img or '(empty)'} on {', '.join(on[:MAX_HOSTS_NAMED])}" for img, on in images.items())
        problems.append(Problem(f"container_image differs between nodes ({seen})", "every node runs the same "
                                "image: set container_image once in group_vars, not per host", "", None, hosts))
    return problems


# --------------------------------------------------------------------------------------------- role rules
# Rules over a role's own variables that its argument spec cannot state (formats, ranges, options that exclude each
# other). They read the inventory only, so they run here, once, before any host is contacted, and not as a task on
# every node; each keeps the message its role's "Stop if" task had (variable, value, host, fix). Choices and types
# are the argument specs' (check_value), never repeated here.
DRIVER_BRANCH_RE = re.compile(r"^[0-9]{3,4}$")
DRIVER_VERSION_RE = re.compile(r"^[0-9]{3,4}\.[0-9]{1,3}(\.[0-9]{1,3})?$")
VISIBLE_DEVICES_RE = re.compile(r"^[A-Za-z0-9,:-]*$")
UNIX_USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
CONTROL_CHAR_RE = re.compile(r"[\x00-\x1f\x7f]")
LLAMAFACTORY_OVERRIDE_RE = re.compile(r"^[A-Za-z_][\w.]*=")
JANITOR_COMPLETION = ("marker", "marker_or_superseded")
FINETUNING_TYPES = ("lora", "full", "freeze")


def llamafactory_overrides_problems(extra: Any) -> list[str]:
    """train_args_extra entries that are not key=value overrides (what llamafactory.launcher takes after the
    config file)."""
    return [str(e) for e in extra or [] if not LLAMAFACTORY_OVERRIDE_RE.match(str(e))]


def job_timeouts(get, llamafactory: bool) -> list[tuple[str, int]]:
    """(where, seconds) of every collective timeout the inventory gives the job: nccl_env_collective_timeout_s,
    train_args_ddp_timeout, and with the llamafactory profile a ddp_timeout in train_args_llamafactory_options or a
    ddp_timeout=N of train_args_extra (an override after the config). Values that are not whole numbers are left to
    the type checks and LLaMA-Factory's parser. get(var): the host's value (None when unset or templated)."""
    def whole(value: Any) -> int | None:
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return value
        text = str(value).strip()
        return int(text) if re.fullmatch(r"[0-9]{1,30}", text) else None

    found = [(var, whole(get(var))) for var in ("nccl_env_collective_timeout_s", "train_args_ddp_timeout")
             if get(var) is not None]
    if llamafactory:
        options, extra = get("train_args_llamafactory_options"), get("train_args_extra")
        if isinstance(options, Mapping) and "ddp_timeout" in options:
            found.append(("train_args_llamafactory_options.ddp_timeout", whole(options["ddp_timeout"])))
        for entry in extra if isinstance(extra, list) else []:
            key, sep, value = str(entry).partition("=")
            if sep and key.strip() == "ddp_timeout":
                found.append((f"train_args_extra {str(entry)!r}", whole(value)))
    return [(var, value) for var, value in found if value is not None]


def _value(t: Mapping, specs: Mapping[str, Mapping], var: str) -> Any:
    """The host's value of var: the inventory's, else its spec's default; None when that default is a template
    (it resolves on the node, from other variables the checks of those variables cover)."""
    if var in t:
        return t[var]
    default = next(((opts.get(var) or {}) for opts in specs.values() if var in opts), {}).get("default")
    return None if _templated(default) else default


def _ints(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def check_role_rules(h: str, t: Mapping, specs: Mapping[str, Mapping]) -> list[Problem]:
    """Every role rule for one host (t: its well-typed variables), as Problems naming the host."""
    problems: list[Problem] = []

    def v(var: str) -> Any:
        return _value(t, specs, var)

    def stop(what: str, fix: str, var: str = "", value: Any = None, has_value: bool = False) -> None:
        problems.append(Problem(what, fix, var, value, [h], has_value))

    # nvidia_driver (was tasks/assert.yml)
    branch, version, devices = (v("nvidia_driver_branch"), v("nvidia_driver_version"),
                                v("nvidia_driver_visible_devices"))
    if None not in (branch, version, devices):
        b, ver, dev = str(branch), str(version), str(devices)
        if not (DRIVER_BRANCH_RE.match(b) and (ver == "" or (DRIVER_VERSION_RE.match(ver) and ver.split(".")[0] == b))
                and VISIBLE_DEVICES_RE.match(dev)):
            stop(f"the driver options disagree (nvidia_driver_branch {b!r}, nvidia_driver_version {ver!r}, "
                 f"nvidia_driver_visible_devices {dev!r})",
                 "the branch is the major version (e.g. 580), the version a full version of that branch "
                 "(e.g. 580.159.04) or empty, visible devices a comma-separated list of GPU indexes or UUIDs")

    # deepspeed_config (was tasks/assert.yml)
    if v("deepspeed_config_bf16") is True and v("deepspeed_config_fp16") is True:
        stop("deepspeed_config_bf16 and deepspeed_config_fp16 are both true", "choose one (bf16 on H100/H200)")

    # network (was tasks/assert.yml; the role checks nothing of it when it is off)
    if v("network_enabled") is not False:
        w, r, k, c, listen = (v("network_path_wait_s"), v("network_path_retries"), v("network_path_workers"),
                              v("network_connect_timeout_s"), v("network_listener_s"))
        if _ints(w, r, k, c, listen) and not (w >= 1 and r >= 0 and k >= 1 and c >= 1 and listen >= c):
            stop(f"the probe timings are wrong (network_path_wait_s={w}, network_path_retries={r}, "
                 f"network_path_workers={k}, network_connect_timeout_s={c}, network_listener_s={listen})",
                 "waits and workers must be at least 1, retries at least 0, and network_listener_s at least "
                 "network_connect_timeout_s (the listener lives as long as one connect timeout)")

    # nccl_env (was tasks/assert.yml)
    socks, threads = v("nccl_env_nsocks_perthread"), v("nccl_env_socket_nthreads")
    if v("nccl_env_profile") == "tcp" and _ints(socks, threads) and not (
            socks >= 0 and 0 <= threads <= 16 and max(socks, 1) * max(threads, 1) <= 64):
        stop(f"nccl_env_socket_nthreads={threads} and nccl_env_nsocks_perthread={socks} are beyond NCCL's limits",
             "NCCL takes 1-16 threads and at most 64 sockets in all (threads x sockets per thread); 0 leaves one "
             "to NCCL. 4 x 4 is the measured default")
    # An RDMA environment is never turned into TCP without a word: the tcp profile writes NCCL_IB_DISABLE=1 over it.
    if v("nccl_env_profile") == "tcp":
        for var in ("nccl_env_extra", "launch_env", "container_env", "nccl_check_env"):
            names, fits = nccl_vars.rdma_settings(v(var))
            if names:
                stop(f"{var} configures an RDMA fabric ({', '.join(names)}) but nccl_env_profile tcp writes "
                     f"NCCL_IB_DISABLE=1, so NCCL would ignore it and run over TCP sockets",
                     f"set nccl_env_profile: {fits} to keep the fabric (nccl_env_ib_hca and nccl_env_ib_gid_index take "
                     f"NCCL_IB_HCA and NCCL_IB_GID_INDEX); or, for a job meant to run over sockets, remove those "
                     f"variables from {var} or say so with NCCL_IB_DISABLE: 1 in it", var)
    ceiling = v("nccl_env_collective_timeout_max_s")
    if _ints(ceiling) and v("nccl_env_collective_timeout_above_max") is not True:
        for var, value in job_timeouts(v, v("train_args_profile") == "llamafactory"):
            if value > ceiling:
                stop(f"{var} is {value} s, above the collective timeout ceiling of {ceiling} s "
                     f"(nccl_env_collective_timeout_max_s): a dead rank would hang the job that long",
                     f"lower it to at most {ceiling} s (nccl_env_collective_timeout_s is the job's one timeout), or "
                     f"set nccl_env_collective_timeout_above_max: true to keep it (the report names it)", var)
    coll, beat = v("nccl_env_collective_timeout_s"), v("nccl_env_heartbeat_timeout_s")
    if _ints(coll, beat) and not (coll > 0 and beat >= 0):
        stop(f"the timeouts are not whole seconds (nccl_env_collective_timeout_s={coll}, "
             f"nccl_env_heartbeat_timeout_s={beat})", "give whole seconds, the collective timeout above 0 "
             "(e.g. 1800 and 600)")

    # train_args (was tasks/assert.yml; train_args_extra as a list of strings and train_args_options as a dict
    # are the spec's types)
    llamafactory = v("train_args_profile") == "llamafactory"
    entry = t.get("train_args_entrypoint")
    if isinstance(entry, str) and not llamafactory and not entry.strip().startswith("/"):
        code = _value(t, specs, "cluster_code_dir") or "cluster_code_dir"
        stop("train_args_entrypoint is not an absolute path", f"give the script's absolute path on the node "
             f"(e.g. {code}/train.py)", "train_args_entrypoint", entry, True)
    extra = v("train_args_extra")
    if llamafactory and isinstance(extra, list) and llamafactory_overrides_problems(extra):
        stop(f"train_args_extra holds entries that are not key=value overrides of the config with train_args_profile "
             f"llamafactory ({llamafactory_overrides_problems(extra)})", "give key=value overrides (e.g. "
             "['max_steps=100'])")
    if llamafactory:
        model, data = v("train_args_model_name_or_path"), v("train_args_dataset")
        ftype = t.get("train_args_finetuning_type", t.get("deepspeed_config_finetuning_type", "lora"))
        if not (model and data and ftype in FINETUNING_TYPES):
            stop(f"train_args_profile llamafactory lacks its inputs (train_args_model_name_or_path {model!r}, "
                 f"train_args_dataset {data!r}, train_args_finetuning_type {ftype!r})",
                 "set train_args_model_name_or_path (a path under cluster_shared_root, or a hub id), "
                 "train_args_dataset (a dataset name in dataset_info.json) and train_args_finetuning_type "
                 "lora, full or freeze")

    # janitor (was tasks/preflight.yml; janitor_root against system directories is check_paths', the list type of
    # janitor_keep_patterns the spec's)
    if v("janitor_enabled") is not False:
        interval, floor, user = v("janitor_interval"), v("janitor_min_size"), v("janitor_user")
        if _ints(interval) and interval <= 0:
            stop("janitor_interval is not above 0", "give the seconds between two prunes (e.g. 60)",
                 "janitor_interval", interval, True)
        if _ints(floor) and floor < 0:
            stop("janitor_min_size is below 0", "give the size floor in bytes (0: no floor)", "janitor_min_size",
                 floor, True)
        if "janitor_completion" in t and t["janitor_completion"] not in JANITOR_COMPLETION:
            stop("janitor_completion is not one of marker, marker_or_superseded",
                 "set janitor_completion to marker or marker_or_superseded", "janitor_completion",
                 t["janitor_completion"], True)
        if isinstance(user, str) and (not UNIX_USER_RE.match(user) or user == "root"):
            stop("janitor_user is not an unprivileged user name", "give a user name such as trainyard-janitor "
                 "(never root)", "janitor_user", user, True)
        paths = {"janitor_root": t.get("janitor_root", v("cluster_output_root")),
                 "janitor_dir": t.get("janitor_dir", f"{v('cluster_state_dir')}/{v('cluster_job_name')}")}
        for var, path in paths.items():
            if isinstance(path, str) and CONTROL_CHAR_RE.search(path):
                stop(f"{var} holds a control character", f"give {var} (or the cluster_* path it defaults to) as a "
                     "plain absolute path", var, path, True)

    # nccl_check (was tasks/enabled.yml's assert; the role checks nothing of it when it is off)
    if v("nccl_check_enabled") is not False:
        warn, good = v("nccl_check_expect_warn_fraction"), v("nccl_check_expect_pass_fraction")
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (warn, good)) and not 0 < warn <= good:
            stop(f"nccl_check_expect_warn_fraction ({warn}) is not above 0 and at most nccl_check_expect_pass_fraction "
                 f"({good})", "a pass needs the larger fraction of the expected bandwidth (defaults 0.8 and 0.5, "
                 "docs/bandwidth.md)", "nccl_check_expect_warn_fraction", warn, True)

    # container (was tasks/assert.yml; the role checks nothing of it when it is off)
    if v("container_enabled") is not False:
        problems.extend(_container_rules(h, t, v))

    problems.extend(host_only_rules(h, t, v))

    # launch (was tasks/preflight.yml): sidecars the inventory gives; the janitor's own is built by its role
    for var in ("launch_sidecars", "launch_sidecars_extra"):
        for item in t.get(var) if isinstance(t.get(var), list) else []:
            argv = item.get("argv") if isinstance(item, Mapping) else None
            if not (isinstance(item, Mapping) and str(item.get("name") or "") and isinstance(argv, list) and argv):
                stop(f"a sidecar of {var} has no name or no argv list ({_show(redact(item))})",
                     "give each sidecar as {name: <name>, argv: [program, arg, ...]}")
    return problems


# Host-only paths (docs/security.md "Paths"): control state, locks and secrets that the job must never read or
# write, so never inside, equal to or around a directory the training container mounts. (variable, kind, default
# when the variable is not set: a cluster_* template resolved here, None when it names other variables.)
HOST_ONLY_PATHS = (
    ("cluster_state_dir", "dir", None),
    ("janitor_dir", "dir", "{{ cluster_state_dir }}/{{ cluster_job_name }}"),
    ("network_state_file", "file", "{{ cluster_state_dir }}/{{ cluster_job_name }}/launch.json"),
    ("launch_secret_env_file", "file", "/run/trainyard/{{ cluster_job_name }}/secret.env"),
    ("container_env_file", "file", None),
    ("cluster_lock_dir", "dir", None),
)
# The job's own parts of the state directory, mounted by design (module_utils/torchrun.py JOB_RO_DIR, JOB_RW_DIR).
_JOB_PARTS = ("job-ro", "job-rw")


def _around(a: str, b: str) -> bool:
    """a and b (normalised, absolute) are the same directory or one holds the other."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def mounted_dirs(t: Mapping, v) -> list[tuple[str, str]]:
    """[(variable, normalised path)] of every host directory the job sees: the cluster's output, shared and code
    roots and every container_mounts / container_mounts_extra source (cluster_* templates resolved); each directory
    once, named by the first variable that gives it. One that path_problems stops (a system directory, '..', a
    relative path) is left out: it has its own line."""
    out: dict[str, str] = {}

    def add(var: str, path: Any) -> None:
        if isinstance(path, str) and path.strip().startswith("/") and not _templated(path) \
                and not path_problems(var, path, []):
            out.setdefault(normalise_path(path), var)

    for var in ("cluster_output_root", "cluster_shared_root", "cluster_code_dir"):
        add(var, v(var))
    for var in MOUNT_VARS:
        mounts = v(var)
        for i, m in enumerate(mounts if isinstance(mounts, list) else []):
            add(f"{var}[{i}].source", _resolve_cluster_refs(m.get("source"), v) if isinstance(m, Mapping) else None)
    return [(var, path) for path, var in out.items()]


def host_only_rules(h: str, t: Mapping, v) -> list[Problem]:
    """One "Stop if" line for each host-only path (HOST_ONLY_PATHS) that lies inside, is, or holds a directory the
    training container mounts, whatever its spelling. The job's own job-ro and job-rw parts alone may be mounted
    below the state directory (<cluster_state_dir>/<job>/job-rw) and below janitor_dir (<janitor_dir>/job-rw)."""
    problems: list[Problem] = []
    mounts = mounted_dirs(t, v)
    roots = {normalise_path(p) for p in (v(x) for x in PATH_VARS) if isinstance(p, str) and p.startswith("/")}
    flagged: set[str] = set()
    for var, kind, default in HOST_ONLY_PATHS:
        if var not in t and default and "cluster_state_dir" in default and "cluster_state_dir" in flagged:
            continue  # a default below a state directory already stopped: one line, one fix
        value = t[var] if var in t else (_resolve_cluster_refs(default, v) if default else v(var))
        if not isinstance(value, str) or not value.strip().startswith("/") or _templated(value) \
                or path_problems(var, value, []):
            continue  # not a path yet, or one with a line of its own
        path = normalise_path(value)
        for mvar, mpath in mounts:
            if var == "cluster_lock_dir" and any(_around(mpath, r) and mpath.startswith(r) for r in roots):
                continue  # within the cluster's own roots: lock_dir_problem's line already names it
            inside = path == mpath or path.startswith(mpath.rstrip("/") + "/")
            holds = kind == "dir" and mpath.startswith(path.rstrip("/") + "/")
            if holds and posixpath.basename(mpath) in _JOB_PARTS:
                parent = posixpath.dirname(mpath)
                if (var == "janitor_dir" and parent == path) or \
                        (var == "cluster_state_dir" and posixpath.dirname(parent) == path):
                    continue
            if not (inside or holds):
                continue
            where = "is" if path == mpath else ("is inside" if inside else "holds")
            what = "secrets" if var in ("launch_secret_env_file", "container_env_file") else "control state"
            problems.append(Problem(
                f"{var} {where} a directory the training container mounts ({var} {value} normalises to {path}; "
                f"{mvar} {mpath}): host-only {what} the job could read or replace",
                f"put {var} outside every mounted directory (e.g. {_HOST_ONLY_EXAMPLE[var]}), or mount {mpath} "
                "elsewhere", var, value, [h], True))
            flagged.add(var)
            break
    return problems


_HOST_ONLY_EXAMPLE = {"cluster_state_dir": "/var/lib/trainyard", "janitor_dir": "the default <cluster_state_dir>/<job>",
                      "network_state_file": "the default <cluster_state_dir>/<job>/launch.json",
                      "launch_secret_env_file": "the default /run/trainyard/<job>/secret.env",
                      "container_env_file": "/etc/trainyard/<job>.env", "cluster_lock_dir": "/var/lib/trainyard-lock"}


MOUNT_KEYS = frozenset({"source", "target", "read_only", "create"})
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*$", re.I)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}


def size_bytes(value: Any, invalid: Any = ValueError) -> int:
    """'16g' / '512m' / '1GiB' / 1073741824 -> bytes (docker's binary units). A value that is not a size raises
    ValueError, or returns `invalid` when one is given."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = None if isinstance(value, bool) else _SIZE_RE.match(str(value))
    if not m:
        if invalid is not ValueError:
            return invalid
        raise ValueError(f"not a size: {value!r} (use e.g. 16g, 512m)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _resolve_cluster_refs(value: Any, v) -> Any:
    """A spec default such as "{{ cluster_code_dir }}/x" with the host's value of each cluster_* it names, None
    when it names anything else (it resolves on the node); any other value as it is."""
    if not _templated(value):
        return value
    out = re.sub(r"\{\{\s*(cluster_\w+)\s*\}\}", lambda m: str(v(m.group(1))), value)
    return None if _templated(out) or "None" in out.split("/") else out


def _mount_ok(m: Any) -> bool:
    def absolute(path: Any) -> bool:
        return path is None or (isinstance(path, str) and path.startswith("/"))
    return (isinstance(m, Mapping) and not set(m) - MOUNT_KEYS and "source" in m and absolute(m["source"])
            and absolute(m.get("target")) and isinstance(m.get("read_only", False), bool)
            and isinstance(m.get("create", True), bool))


def _container_rules(h: str, t: Mapping, v) -> list[Problem]:
    """The container role's option rules for one host: mounts well formed and mounted once, image named, shm size
    a size, registry login complete. The same image on every node is _check_across_roles'."""
    problems: list[Problem] = []

    def stop(what: str, fix: str, var: str = "", value: Any = None, has_value: bool = False) -> None:
        problems.append(Problem(what, fix, var, value, [h], has_value))

    targets: list[str] = []
    for var in MOUNT_VARS:
        mounts = v(var)
        for i, m in enumerate(mounts if isinstance(mounts, list) else []):
            m = {k: _resolve_cluster_refs(x, v) for k, x in m.items()} if isinstance(m, Mapping) else m
            if not _mount_ok(m):
                if var not in t:                 # a default over a wrong cluster_* path: that path's own problem
                    continue
                stop(f"{var}[{i}] is malformed ({_show(redact(m))})", "give each entry as {source: /abs/path, "
                     "target: /abs/path (default: source), read_only: bool, create: bool}")
                continue
            target = m.get("target") or m["source"]
            if target is not None:
                targets.append(normalise_path(target))
    twice = sorted({x for x in targets if targets.count(x) > 1})
    if twice:
        stop(f"container_mounts and container_mounts_extra mount {', '.join(twice)} more than once",
             "mount each path inside the container once (drop or retarget the extra entry)")
    # An image left unset is the role's to name (a play without the container role needs none).
    image = t.get("container_image")
    if isinstance(image, str) and (not image.strip() or re.search(r"\s", image.strip())):
        stop("container_image is not an image reference", "set it to the training image (e.g. "
             "registry.example.com/team/train:2024-11 or repo@sha256:<digest>) in the cluster's group_vars/all.yml",
             "container_image", image, True)
    shm = v("container_shm_size")
    if shm is not None and size_bytes(shm, -1) <= 0:
        stop("container_shm_size is not a size", "use a size such as 16g or 512m", "container_shm_size", shm, True)
    if v("container_registry_password") and not v("container_registry_username"):
        stop("container_registry_password is set but container_registry_username is empty",
             "set both (or neither, for a registry without login)")
    problems.extend(_container_user_rule(h, v))
    return problems


# ---- container hardening (container_user): one parser, used by this rule and by the container role's filters.
def container_user_ids(user: Any) -> tuple[int, int] | None:
    """container_user -> (uid, gid) of an unprivileged job user, or None for root ("root", "0", "0:0") and for ""
    (the image's USER). Raises ValueError for any other form: a name would be looked up in the image's passwd by
    docker but in the host's by the role's chown, and a uid without a gid runs with gid 0 (root's group)."""
    text = str(user if user is not None else "").strip()
    if text in ("", "root", "0", "0:0"):
        return None
    m = re.fullmatch(r"(\d{1,10}):(\d{1,10})", text)
    if not m or int(m.group(1)) > 2 ** 31 - 2 or int(m.group(2)) > 2 ** 31 - 2:
        raise ValueError(text)
    uid, gid = int(m.group(1)), int(m.group(2))
    if uid == 0 or gid == 0:
        raise ValueError(text)
    return uid, gid


def _container_user_rule(h: str, v) -> list[Problem]:
    user = v("container_user")
    if user is None:
        return []
    try:
        container_user_ids(user)
    except ValueError:
        return [Problem("container_user is not uid:gid numbers, root or \"\"",
                        "set container_user to an unprivileged uid:gid no host process uses (default 65532:65532); "
                        "root, or \"\" for the image's USER, are opt-outs (docs/security.md)",
                        "container_user", user, [h], True)]
    return []


def _check_node_counts(h: str, n: int, t: Mapping, specs: Mapping[str, Mapping]) -> list[Problem]:
    """cluster_min_nodes (recover) and launch_nnodes_min (torchrun's elastic mode) against the trainers."""
    problems: list[Problem] = []
    low = t.get("cluster_min_nodes")
    if isinstance(low, int) and not isinstance(low, bool) and not 1 <= low <= n:
        problems.append(Problem(f"cluster_min_nodes is outside 1..{n} ({n} trainers)",
                                f"set cluster_min_nodes to the fewest nodes the job may continue on, 1 to {n}",
                                "cluster_min_nodes", low, [h], True))
    for var, floor, what in (("cluster_shard_nodes", 0, "the nodes one ansible-playbook process runs, 0 never splits"),
                             ("cluster_shard_max", 0, "the most processes of a sharded run, 0 half the cores"),
                             ("cluster_shard_wait_s", 1, "seconds a cross-node step waits for the other shards")):
        value = t.get(var)
        if isinstance(value, int) and not isinstance(value, bool) and value < floor:
            problems.append(Problem(f"{var} is below {floor}", f"set {var} to {floor} or more ({what}; "
                                    "docs/sharding.md)", var, value, [h], True))
    elastic = t.get("launch_nnodes_min")
    backend = t.get("launch_rdzv_backend", ((specs.get("launch") or {}).get("launch_rdzv_backend") or {})
                    .get("default", "static"))
    if isinstance(elastic, int) and not isinstance(elastic, bool) and elastic:
        if backend != "c10d":
            problems.append(Problem("launch_nnodes_min is set while launch_rdzv_backend is not c10d (torchrun's "
                                    "elastic mode needs the c10d rendezvous)",
                                    "set launch_rdzv_backend: c10d, or launch_nnodes_min: 0 for a fixed size",
                                    "launch_nnodes_min", elastic, [h], True))
        elif not 1 <= elastic <= n:
            problems.append(Problem(f"launch_nnodes_min is outside 1..{n} ({n} trainers)",
                                    f"set launch_nnodes_min to 1..{n}, or 0 for a fixed size",
                                    "launch_nnodes_min", elastic, [h], True))
    return problems


def _check_backend(h: str, t: Mapping, specs: Mapping[str, Mapping]) -> list[Problem]:
    """launch_backend slurm against the launch options it does not carry (docs/slurm.md): the Slurm task runs each
    node's torchrun in the training container (docker exec), with a fixed node set and the secrets as environment."""
    def get(var: str, fallback: Any) -> Any:
        return t.get(var, ((specs.get("launch") or {}).get(var) or {}).get("default", fallback))

    if get("launch_backend", "torchrun") != "slurm":
        return []
    problems: list[Problem] = []
    unsupported = (("launch_runtime", "docker", "the Slurm task runs torchrun inside the training container through "
                    "docker exec", "set launch_runtime: docker, or launch_backend: torchrun to run on the node itself"),
                   ("launch_rdzv_backend", "static", "Slurm allocates a fixed set of nodes; ranks come from the cluster "
                    "model", "set launch_rdzv_backend: static, or launch_backend: torchrun for an elastic job"),
                   ("launch_secret_env_mode", "env", "the Slurm task passes secrets by docker exec --env-file only",
                    "set launch_secret_env_mode: env, or launch_backend: torchrun"))
    for var, needed, why, fix in unsupported:
        value = get(var, needed)
        if isinstance(value, str) and not _templated(value) and value != needed:
            problems.append(Problem(f"launch_backend is slurm while {var} is not {needed} ({why})", fix, var, value,
                                    [h], True))
    return problems


def _check_ranks(hosts: list[str], hostvars: Mapping, lenient: Mapping) -> list[Problem]:
    problems: list[Problem] = []
    n = len(hosts)
    given: dict[str, int] = {}
    for h in hosts:
        hv = hostvars.get(h) or {}
        if "node_rank" not in hv:
            continue
        raw = hv["node_rank"]
        value = _coerce(raw, "int") if "node_rank" in lenient.get(h, ()) else raw
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(Problem(f"node_rank is {_a(_type_name(raw))}, not an integer", _type_fix("node_rank", raw, "int")
                                    + f" (a whole number from 0 to {n - 1})", "node_rank", raw, [h], True))
            continue
        if not 0 <= value < n:
            problems.append(Problem(f"node_rank is out of range 0..{n - 1} ({n} trainers)",
                                    f"give each of the {n} trainers a distinct node_rank from 0 to {n - 1}, "
                                    "or remove node_rank everywhere to rank hosts in inventory order",
                                    "node_rank", raw, [h], True))
            continue
        given[h] = value
    with_rank = [h for h in hosts if "node_rank" in (hostvars.get(h) or {})]
    if with_rank and len(with_rank) < n:
        missing = [h for h in hosts if h not in with_rank]
        problems.append(Problem(f"node_rank is set on some trainers ({', '.join(with_rank[:MAX_HOSTS_NAMED])}) "
                                f"but not on {', '.join(missing[:MAX_HOSTS_NAMED])}"
                                f"{' …' if len(missing) > MAX_HOSTS_NAMED else ''}",
                                "set node_rank on every trainer (a permutation of 0.."
                                f"{n - 1}) or on none (inventory order)"))
    by_value: dict[int, list[str]] = {}
    for h, r in given.items():
        by_value.setdefault(r, []).append(h)
    for r, hs in sorted(by_value.items()):
        if len(hs) > 1:
            free = sorted(set(range(n)) - set(by_value))
            problems.append(Problem(f"node_rank {r} is given to more than one trainer ({', '.join(hs)})",
                                    "give each trainer its own node_rank"
                                    + (f"; unused ranks: {', '.join(map(str, free))}" if free else ""),
                                    "node_rank", r, [], True))
    return problems


def _check_addresses(hosts: list[str], hostvars: Mapping) -> list[Problem]:
    problems: list[Problem] = []
    ssh_targets: dict[tuple, list[str]] = {}
    data_targets: dict[str, list[str]] = {}
    for h in hosts:
        hv = hostvars.get(h) or {}
        if "ansible_host" in hv:
            why = address_problem(hv["ansible_host"])
            if why:
                problems.append(Problem(f"ansible_host {why}", "set ansible_host to the node's management IP "
                                        "address or DNS name", "ansible_host", hv["ansible_host"], [h], True))
        if "data_address" in hv:
            why = address_problem(hv["data_address"])
            if why:
                problems.append(Problem(f"data_address {why}", "set data_address to the node's address on the data "
                                        "network (or remove it to use ansible_host)", "data_address",
                                        hv["data_address"], [h], True))
        target = str(hv.get("ansible_host") or h).strip().lower()
        port = hv.get("ansible_port", 22)
        conn = str(hv.get("ansible_connection") or "ssh")
        if conn not in ("local", "docker", "community.docker.docker"):
            ssh_targets.setdefault((target, str(port)), []).append(h)
        data_targets.setdefault(data_address(h, hv).lower(), []).append(h)
    for (target, port), hs in ssh_targets.items():
        if len(hs) > 1:
            problems.append(Problem(f"the inventory names {', '.join(hs)} all reach the same address "
                                    f"{target} (port {port})",
                                    "give each node its own ansible_host (one inventory name per machine)"))
    for addr, hs in data_targets.items():
        if len(hs) > 1:
            problems.append(Problem(f"the trainers {', '.join(hs)} have the same data address {addr}",
                                    "set data_address (or ansible_host) of each node to its own address on the "
                                    "data network"))
    return problems


def _check_cluster_values(h: str, head: str, hosts: list[str], typed: Mapping, hostvars: Mapping,
                          defaults: Mapping, bad_iface_patterns: Iterable[str]) -> list[Problem]:
    """Range and consistency checks of the cluster_* values that passed the type check."""
    problems: list[Problem] = []
    hv = hostvars.get(h) or {}

    def val(var: str) -> tuple[bool, Any]:
        """(set here and well typed, value); values that failed typing are not checked twice."""
        if var in typed:
            return True, typed[var]
        if var in hv:
            return False, None
        return var in defaults and not _templated(defaults.get(var)), defaults.get(var)

    ok, mtu = val("cluster_data_mtu")
    if ok and isinstance(mtu, int) and mtu != 0 and not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
        problems.append(Problem(f"cluster_data_mtu is outside {MTU_RANGE[0]}–{MTU_RANGE[1]}",
                                "set cluster_data_mtu to 9000 (jumbo frames) or 1500, or 0 to measure it (an overlay)",
                                "cluster_data_mtu", mtu,
                                [h], True))
    ok, port = val("cluster_rendezvous_port")
    if ok and isinstance(port, int) and not PORT_RANGE[0] <= port <= PORT_RANGE[1]:
        problems.append(Problem(f"cluster_rendezvous_port is outside {PORT_RANGE[0]}–{PORT_RANGE[1]}",
                                "choose an unprivileged free port, e.g. 39500", "cluster_rendezvous_port", port,
                                [h], True))
    ok_g, gpus = val("cluster_gpus_per_node")
    if ok_g and isinstance(gpus, int) and gpus < 0:
        problems.append(Problem("cluster_gpus_per_node is negative", "set it to the GPUs per node (0 for CPU-only)",
                                "cluster_gpus_per_node", gpus, [h], True))
    ok_n, nproc = val("cluster_nproc_per_node")
    if "cluster_nproc_per_node" in typed and isinstance(nproc, int):
        if nproc < 1:
            problems.append(Problem("cluster_nproc_per_node is less than 1",
                                    "set it to the processes per node (at least 1), or remove it to use "
                                    "cluster_gpus_per_node", "cluster_nproc_per_node", nproc, [h], True))
        elif ok_g and isinstance(gpus, int) and gpus > 0 and nproc > gpus:
            problems.append(Problem(f"cluster_nproc_per_node is more than cluster_gpus_per_node ({gpus})",
                                    f"use at most one process per GPU: cluster_nproc_per_node <= {gpus}",
                                    "cluster_nproc_per_node", nproc, [h], True))
    elif "cluster_nproc_per_node" not in hv and ok_g and gpus == 0:
        problems.append(Problem("cluster_gpus_per_node is 0 and cluster_nproc_per_node is not set",
                                "set cluster_nproc_per_node (processes per node) for a CPU-only cluster",
                                "cluster_gpus_per_node", gpus, [h], True))

    ok, iface = val("cluster_data_iface")
    if ok and isinstance(iface, str) and iface.strip():
        name = iface.strip()
        pat = bad_iface(name, bad_iface_patterns)
        if pat:
            problems.append(Problem("cluster_data_iface is loopback or a container/VM bridge interface "
                                    f"(matches {pat})",
                                    "set it to the physical data NIC (e.g. eth1, ens1f0, ib0) or leave it empty "
                                    "to detect it", "cluster_data_iface", iface, [h], True))
        elif not IFACE_RE.match(name) or name != iface:
            problems.append(Problem("cluster_data_iface is not a valid interface name (1-15 characters, no "
                                    "spaces, '/' or ':')", "set it to the name `ip link` shows, e.g. eth1",
                                    "cluster_data_iface", iface, [h], True))

    if h == head:
        ok, master = val("cluster_master_addr")
        if ok and isinstance(master, str) and master.strip():
            head_addr = data_address(head, hostvars.get(head) or {})
            if master.strip().lower() != head_addr.lower():
                other = [x for x in hosts if data_address(x, hostvars.get(x) or {}).lower() == master.strip().lower()
                         or str((hostvars.get(x) or {}).get("ansible_host") or x).lower() == master.strip().lower()]
                which = (f" (that is {other[0]}, not the head)" if other and other[0] != head else "")
                problems.append(Problem(f"cluster_master_addr is not the data address of the head {head} "
                                        f"({head_addr}){which}",
                                        f"remove cluster_master_addr (it defaults to the head's data address) or set "
                                        f"it to {head_addr}; to make another node the head give it node_rank 0",
                                        "cluster_master_addr", master, [h], True))

    for var in PATH_VARS:
        ok, path = val(var)
        if not ok or not isinstance(path, str):
            continue
        if not path.strip():
            problems.append(Problem(f"{var} is empty", f"set {var} to an absolute path", var, path, [h], True))
        elif var not in typed:
            problems += path_problems(var, path, [h])  # a default; set values are checked by check_paths
    ok_o, out = val("cluster_output_root")
    ok_s, shared = val("cluster_shared_root")
    if ok_o and ok_s and isinstance(out, str) and isinstance(shared, str) and out.startswith("/") \
            and shared.startswith("/") and _norm_path(out) == _norm_path(shared):
        problems.append(Problem("cluster_output_root and cluster_shared_root are the same directory (outputs are "
                                "node-local and pruned; the shared root holds models and data)",
                                "give the outputs their own directory", "cluster_output_root", out, [h], True))

    # The cluster lock must stay out of every directory the training container mounts (the job would see it); a
    # mounted directory already stopped above (a system directory, a relative path) is not named twice.
    ok, lock_dir = val("cluster_lock_dir")
    if ok and isinstance(lock_dir, str) and lock_dir.startswith("/"):
        mounted = {var: path for var in PATH_VARS for okp, path in [val(var)]
                   if okp and isinstance(path, str) and path.strip() and not path_problems(var, path, [h])}
        lock = lock_dir_problem(lock_dir, mounted)
        if lock:
            problems.append(Problem(lock[0], lock[1], "cluster_lock_dir", lock_dir, [h], True))

    ok, job = val("cluster_job_name")
    if ok and isinstance(job, str) and not JOB_NAME_RE.match(job):
        problems.append(Problem("cluster_job_name is not a valid job name (letters, digits, '_', '.', '-'; "
                                "starts with a letter or digit; at most 63 characters)",
                                "use a name like llama-lora (it names the container and a directory)",
                                "cluster_job_name", job, [h], True))
    ok, run_dir = val("cluster_run_dir")
    if "cluster_run_dir" in typed and isinstance(run_dir, str) and not run_dir.strip():
        problems.append(Problem("cluster_run_dir is empty", "remove it (default: runs/<timestamp> in the "
                                "repository) or set a directory on the controller", "cluster_run_dir", run_dir,
                                [h], True))
    return problems


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


# --------------------------------------------------------------------------------------------- paths
def normalise_path(path: str) -> str:
    """The directory a path names: posixpath.normpath plus the POSIX '//' root folded to '/'."""
    norm = posixpath.normpath(path.strip())
    return "/" + norm.lstrip("/") if norm.startswith("/") else norm


def denied_path(norm: str) -> bool:
    """True for a system directory itself (/, /tmp, /etc, /var/lib, /lib64, ...) and anything in a kernel file
    system (/proc, /sys); paths below the other system directories are fine (/var/lib/trainyard)."""
    if norm in DENIED_ROOTS or DENIED_ROOT_RE.match(norm):
        return True
    return any(norm == t or norm.startswith(t + "/") for t in DENIED_TREES)


def path_problems(var: str, path: Any, hosts: list) -> list[Problem]:
    """One "Stop if" problem when path is relative or names a system directory, whatever its spelling."""
    if not isinstance(path, str) or not path.strip() or _templated(path):
        return []
    if ".." in path.strip().split("/"):
        # Refused, not resolved: the node resolves '..' after the symbolic links before it (/var/run -> /run), so
        # the directory validation would see and the one the roles write can differ.
        return [Problem(f"{var} contains '..' (the node resolves it after any symbolic link before it, e.g. "
                        "/var/run/../etc is /etc)", "write the path without '..'", var, path, hosts, True)]
    if not path.strip().startswith("/") and var.split("[")[0] not in RELATIVE_OK:
        example = "/" + path.strip().lstrip("./~").lstrip("/")
        return [Problem(f"{var} is not an absolute path (relative paths depend on where a task runs)",
                        f"set {var} to an absolute path, e.g. {example}", var, path, hosts, True)]
    norm = normalise_path(path)
    if not denied_path(norm):
        return []
    if any(norm == t or norm.startswith(t + "/") for t in DENIED_TREES) and norm not in DENIED_ROOTS:
        fix = f"set {var} to a directory on a real file system, e.g. /srv/trainyard/{var.split('_', 1)[-1]}"
    else:
        fix = f"set {var} to a directory of its own below it, e.g. {norm.rstrip('/')}/trainyard"
    return [Problem(f"{var} normalises to {norm}, a system directory (the roles create, chmod, write and prune "
                    "there)", fix, var, path, hosts, True)]


def is_path_var(var: str) -> bool:
    return var not in NOT_PATHS and var.endswith(PATH_SUFFIXES)


def check_paths(host: str, typed: Mapping) -> list[Problem]:
    """Every path variable set for host (well typed), container mount sources and *_files lists included."""
    problems: list[Problem] = []
    for var, value in sorted(typed.items()):
        if var in MOUNT_VARS and isinstance(value, (list, tuple)):
            for i, mount in enumerate(value):
                if isinstance(mount, Mapping):
                    problems += path_problems(f"{var}[{i}].source", mount.get("source"), [host])
        elif is_path_var(var) and isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                problems += path_problems(f"{var}[{i}]", item, [host])
        elif is_path_var(var):
            problems += path_problems(var, value, [host])
    return problems
