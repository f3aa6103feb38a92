# -*- coding: utf-8 -*-
"""Validate the inventory and compute the cluster model on the controller; no host is contacted."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_validate
short_description: Check the inventory and variables of a training cluster and compute the cluster model
description:
  - Runs on the controller only and contacts no host.
  - Reads the variables the user set for every host of the group C(trainers) (inventory, group_vars,
    host_vars, extra vars; gathered facts are ignored), checks them all, and fails once listing every problem,
    one line each, starting with "Stop if", naming host, variable, bad value and the fix.
  - "Every variable whose name starts with a role prefix (C(cluster_), C(network_), C(container_), ... and
    C(<role>_) for every role with a C(meta/argument_specs.yml)) is checked against that role's argument spec:
    unknown names (with the nearest valid name), type, choices, nested options of dicts and lists of dicts."
  - Computes the cluster model (node rank, nnodes, world size, head, master address and port, hosts by rank,
    data address) with C(plugin_utils/cluster_model.py) and returns it per host in I(models).
options:
  group:
    description: Group of the training nodes.
    type: str
    default: trainers
  roles_dir:
    description: Directory whose C(*/meta/argument_specs.yml) type the role variables. Default is the repository's C(roles/).
    type: path
  removed:
    description: "Removed or renamed variables, C({old: {new: name, note: text}})."
    type: dict
    default: {}
  reserved:
    description: "Facts that roles compute and the inventory must not set, C({fact: role})."
    type: dict
    default: {}
  bad_iface_patterns:
    description: Regular expressions (full match) of interface names that are never the data interface.
    type: list
    elements: str
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Stop if the inventory or the variables are wrong
  cluster_validate:
    removed: "{{ _cluster_removed_vars }}"
    reserved: "{{ _cluster_reserved_facts }}"
  register: __cluster_validate
"""

RETURN = r"""
models:
  description: The cluster model of every trainer, by inventory name, without C(hosts_by_rank) (given once, below).
  returned: success
  type: dict
hosts_by_rank:
  description: Inventory names of the trainers, rank 0 first.
  returned: success
  type: list
install_nodes:
  description:
    - "The trainers that install something in this run, rank order aside (C(nvidia_driver_install), or the container
      role on with C(container_engine_install) and an image named; a node whose value resolves only later is in):
      site.yml's install play runs on them only (C(plugin_utils/cluster_model.py) C(install_nodes))."
  returned: success
  type: list
problems:
  description: Every "Stop if ..." line (also in msg when the task fails).
  returned: always
  type: list
"""

from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.utils.display import Display
from ansible_collections.trainyard.core.plugins.plugin_utils import cluster_model
from ansible_collections.trainyard.core.plugins.plugin_utils import bases

display = Display()
REPO = Path(__file__).resolve().parents[1]

# Host variables (not role-prefixed) that the validation reads.
HOST_VARS = ("node_rank", "data_address", "ansible_host", "ansible_port", "ansible_connection")


def _cli_untyped() -> set:
    """Names the command line set with -e key=value (always strings), the ones a later -e @file or -e '{...}'
    set again excluded. Read from the parsed command line (ansible.context.CLIARGS) as Ansible reads it."""
    from ansible import context
    from ansible.parsing.splitter import parse_kv

    untyped: set = set()
    for opt in context.CLIARGS.get("extra_vars", ()) or ():
        opt = str(opt or "")
        if not opt:
            continue
        if opt.startswith("@") or opt[0] in "[{/.":
            names = _typed_names(opt)
            untyped -= names
            continue
        untyped |= set(parse_kv(opt))
    return untyped


def _typed_names(opt: str) -> set:
    """The top-level names a typed -e (@file, YAML/JSON text) sets; none when it cannot be read (Ansible has
    already refused it then)."""
    import yaml

    try:
        text = Path(opt[1:]).read_text() if opt.startswith("@") else opt
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError):
        return set()
    return set(data) if isinstance(data, dict) else set()


def _ini_vars(sources) -> dict:
    """{host: {name: value}} as the INI inventory sources among ``sources`` (ansible_inventory_sources) set them
    (host lines and [group:vars], with the group chain), parsed again by Ansible's own ini inventory plugin into
    a fresh InventoryData. YAML/JSON sources and group_vars/host_vars files carry types and are left out."""
    from ansible.errors import AnsibleError
    from ansible.inventory.data import InventoryData
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import inventory_loader

    files = []
    for src in sources or ():
        path = Path(str(src))
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
    out: dict = {}
    plugin = inventory_loader.get("ini")
    for f in files:
        if f.suffix.lower() in (".yml", ".yaml", ".json", ".py", ".sh", ".cfg", ".md") or not plugin.verify_file(str(f)):
            continue
        data = InventoryData()
        try:
            plugin.parse(data, DataLoader(), str(f), cache=False)
        except AnsibleError:
            continue  # not INI: another plugin read it
        for name, host in data.hosts.items():
            merged: dict = {}
            for group in sorted(host.get_groups(), key=lambda g: g.depth):
                merged.update(group.get_vars())
            merged.update(host.get_vars())
            out.setdefault(name, {}).update(merged)
    return out


def _untyped(name: str, value, host: str, cli: set, ini: dict) -> bool:
    """True when Ansible read the value from a source that cannot carry types: -e key=value, or an INI inventory
    (that set this very value: a typed source of higher precedence overrides it otherwise)."""
    if not isinstance(value, str):
        return False
    if name in cli:
        return True
    ini_host = ini.get(host) or {}
    return name in ini_host and ini_host[name] == value


def _fact_names(hostvars_host) -> set:
    """The names the host's facts (the fact cache, before any host is contacted) put among its variables."""
    names: set = set()
    try:
        facts = hostvars_host.get("ansible_facts") or {}
        names.update(facts)
        names.update(f"ansible_{k}" for k in facts)
    except Exception:  # noqa: BLE001 - no facts at all is fine
        pass
    return names


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        cm = cluster_model
        group = args.get("group") or cm.TRAINERS
        roles_dir = Path(args.get("roles_dir") or REPO / "roles")
        removed = dict(args.get("removed") or {})
        reserved = dict(args.get("reserved") or {})
        patterns = list(args.get("bad_iface_patterns") or cm.BAD_IFACE_PATTERNS)

        groups = {g: list(h) for g, h in (task_vars.get("groups") or {}).items()}
        if group != cm.TRAINERS and group in groups:
            groups[cm.TRAINERS] = groups[group]
        hostvars = task_vars.get("hostvars")
        cli, ini = _cli_untyped(), _ini_vars(task_vars.get("ansible_inventory_sources"))
        try:
            roles = cm.load_role_specs(roles_dir)
        except Exception as exc:  # noqa: BLE001 - a broken spec file must name itself
            raise AnsibleActionFail(f"cluster_validate: cannot read the argument specs under {roles_dir}: {exc}")
        prefixes = cm.prefixes_for(roles)
        import yaml

        defaults_file = roles_dir / "cluster" / "defaults" / "main.yml"
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        defaults = (yaml.load(defaults_file.read_text(), Loader=loader) or {}) if defaults_file.is_file() else {}
        # A reserved fact that a role documents as an input in its spec is a variable, not a fact.
        documented = {v for r in roles.values() for v in r.get("options") or {}}
        reserved = {k: v for k, v in reserved.items() if k not in documented}

        user_vars: dict[str, dict] = {}
        lenient: dict[str, set] = {}
        unread: dict[str, set] = {}
        for host in groups.get(cm.TRAINERS) or []:
            hv = hostvars[host]
            facts = _fact_names(hv)
            picked: dict = {}
            names = [n for n in hv.keys()
                     if n not in facts and (n in HOST_VARS or n in removed or n in reserved
                                            or cm.owner(n, prefixes) is not None)]
            for name in names:
                try:
                    value = hv[name]
                except Exception:  # noqa: BLE001 - a template that refers to role defaults resolves later
                    unread.setdefault(host, set()).add(name)
                    continue
                picked[name] = value
                if _untyped(name, value, host, cli, ini):
                    lenient.setdefault(host, set()).add(name)
            user_vars[host] = picked

        problems = cm.validate(groups, user_vars, roles=roles, defaults=defaults, removed=removed,
                               reserved=reserved, lenient=lenient, bad_iface_patterns=patterns)
        result = {"problems": problems}
        if problems:
            header = (f"Inventory validation: {len(problems)} problem(s); no host was contacted. "
                      f"Fix them all, then rerun.")
            display.display(header, color="red", stderr=True)
            for line in problems:
                display.display(f"  {line}", color="red", stderr=True)
            result["failed"] = True
            result["msg"] = header + "\n" + "\n".join(problems)
            return result

        hosts = groups[cm.TRAINERS]
        plain = {h: {k: cluster_model._plain(v) for k, v in user_vars[h].items()} for h in hosts}
        for h in hosts:
            for var in lenient.get(h, ()):
                spec = next((r["options"].get(var) for r in roles.values() if var in r.get("options", {})), None)
                typ = (spec or {}).get("type", "int" if var == "node_rank" else "str")
                plain[h][var] = cluster_model._coerce(plain[h][var], typ)
        models = cm.compute_models(hosts, plain, defaults)
        # hosts_by_rank once, not in each of the n models: n x n names would cost every result, fact and copy
        # O(nodes^2) (at 1,024 nodes, seconds per task); the validate play puts it back in each node's cluster_model.
        result["hosts_by_rank"] = models[hosts[0]]["hosts_by_rank"]
        # The nodes that install the driver or the engine in this run (site.yml's install play runs on them only).
        result["install_nodes"] = cm.install_nodes(
            hosts, plain, {k: self.var(task_vars, k) for k in cm.INSTALL_OPTIONS}, unread)
        result["models"] = {h: {k: v for k, v in m.items() if k != "hosts_by_rank"} for h, m in models.items()}
        result["msg"] = (f"{len(hosts)} trainers, {models[hosts[0]]['nproc_per_node']} processes each, "
                         f"world size {models[hosts[0]]['world_size']}, head {models[hosts[0]]['head']} "
                         f"({models[hosts[0]]['master_addr']}:{models[hosts[0]]['master_port']})")
        return result
