# -*- coding: utf-8 -*-
"""Check and merge the variables of the NCCL/torch env file on the controller, before anything is written."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_env_validate
short_description: Check the names and values of the NCCL/torch environment file before it is rendered
description:
  - Merges the role's sections with the user's extra variables and checks every name against the variables NCCL,
    torch, gloo, CUDA, OpenMP and the launchers read (plugin_utils/nccl_vars.py). An unknown name (a typo) is an
    error that names the nearest valid variable.
  - Checks every value can be written so that C(docker run --env-file), systemd's C(EnvironmentFile=) and the
    launch module read it the same way (C(;), C(,), C(:) and inner quotes are fine; a line break, a backslash, a
    leading quote or a blank at either end is refused with the reason).
  - "Runs on the controller only; the host is not contacted. Records C(nccl_env.variables) itself and returns C(ok),
    C(errors), C(refuse) (what the task writing the file refuses) and C(content), the file's text; fails only when
    I(model) or I(ifname) is missing."
  - "With I(compare) (run once, after the write) it compares every node's env file once (O(n)) from each host's
    registered results of the build, the write and the plugin probe, given as values, and answers each node's records
    C(nccl_env.fabric) and C(nccl_env.consistent) (plugin_utils/render_checks.py nccl_env_records) for the role to
    record on every host."
options:
  model: {description: The cluster model of the host (C(cluster_model)); given, none or incomplete fails the task., type: dict}
  ifname: {description: The data interface NCCL and gloo use; given, empty fails the task., type: str}
  fix: {description: The fix of the C(nccl_env.variables) record., type: str, default: ""}
  publish: {description: Facts to set on the host (the env file's path and the first launch's variables)., type: dict, default: {}}
  settings:
    description: "The role's settings (the C(nccl_env_*) variables without the prefix, with C(gpu_nics) and
      C(plugin_dir) as the role resolves them, C(visible_devices)); the role's sections are built from them, I(model)
      and I(ifname) (plugin_utils/nccl_vars.py role_sections), and what C(nccl_env.fabric) checks (C(profile),
      C(gpu_nics), C(plugin_dir), C(ib_hca)) is returned for I(compare). Instead of I(sections)."
    type: dict
  sections:
    description: The role's variables, C([{title, vars}]) in file order; a null value leaves the variable out.
      Required unless I(settings) or I(compare) is given.
    type: list
    elements: dict
  job: {description: The job's name (C(cluster_job_name)) for the file's header., type: str, default: ""}
  path: {description: Where the file goes on the node (C(nccl_env_path))., type: str, default: ""}
  plugin_probe:
    description: The argument vector that looks for the NCCL net plugin (a C(find) of C(libnccl-net*.so*) in the
      training container, for the efa and GCP profiles), run after the write, in check mode too; its answer is the
      result's C(plugin), for I(compare). Its failure never fails the task.
    type: list
    elements: str
  compare:
    description: "Run once: C({hosts, rank_order, iface_uniform, validated, write, plugin, record}), the play's hosts,
      the hosts by rank, whether the network role found the data interface's name the same everywhere, and, one per
      host in the order of C(hosts), the registered results of this action's build call, of the write and of the
      plugin probe (C({}) where a host has none). C(record), the nodes whose records this task records (each record
      naming its node: one worker for the cluster, not one per node), this process's nodes (C(ansible_play_hosts));
      the others' are only returned."
    type: dict
  extra:
    description: The user's variables (C(nccl_env_extra)); they may override the role's, but not the rendezvous ones.
    type: dict
    default: {}
  profile:
    description: The transport profile (C(nccl_env_profile)); under C(ib) and C(roce) an C(NCCL_IB_DISABLE=1) in
      I(extra) is refused (it would move the job onto sockets).
    type: str
    default: ""
  allow_unknown:
    description: Names, or shell-style patterns (C(MYLAB_*)), accepted although NCCL and torch do not read them.
    type: list
    elements: str
    default: []
  write:
    description:
      - "Write the file on the node in the same task, as C(ansible.builtin.template) would: the arguments of the
        C(job_files) module (C(directories), C(files), C(roots), C(return_content), C(glob), C(read)); each entry
        of C(files) without C(content) gets the file's text. Where the build found a bad name or value the task
        fails with C(refuse) before the node is touched (the C(nccl_env.variables) record is in the result, as
        C(preflight_record), for a rescue to record). C(changed) is the write's."
      - The module's result is returned as C(write).
    type: dict
extends_documentation_fragment: [trainyard.core.attributes.controller]
"""

EXAMPLES = r"""
- name: Check the variables of the env file
  nccl_env_validate:
    sections: [{title: data interface, vars: {NCCL_SOCKET_IFNAME: eth1}}]
    extra: "{{ nccl_env_extra }}"
    allow_unknown: "{{ nccl_env_allow_unknown }}"
  register: __nccl_env_validated
"""

RETURN = r"""
preflight_record:
  description: The C(nccl_env.variables) record (see the C(preflight_check) action).
  returned: unless I(broken) is given
  type: dict
ok:
  description: Whether every name and value can be written.
  returned: always
  type: bool
errors:
  description: One message per bad name or value, with the nearest valid name where there is one.
  returned: always
  type: list
  elements: str
sections:
  description: The sections to write, values as text, the user's variables last.
  returned: always
  type: list
  elements: dict
env:
  description: "The flat C({name: value}) of the file."
  returned: always
  type: dict
content:
  description: The file's text.
  returned: unless I(compare) is given
  type: str
refuse:
  description: What the task writing the file refuses (one line naming the host and every bad name or value), or none.
  returned: unless I(compare) is given
  type: list
  elements: str
path:
  description: The file's path on the node (I(path)), for I(compare).
  returned: unless I(compare) is given
  type: str
fabric:
  description: "What C(nccl_env.fabric) checks on the node, C({profile, gpu_nics, plugin_dir, ib_hca}), for I(compare)."
  returned: unless I(compare) is given
  type: dict
write:
  description: "With I(write): the result of the C(job_files) module (C(files), C(directories), C(globbed), C(read),
    C(read_skipped))."
  returned: with I(write), when the build found nothing to refuse
  type: dict
files:
  description: "With I(write): the write's C(files) (each C({path, changed, ...}) as C(job_files) gives them), on the
    task's own result so the check-mode plan shows the file the run would write; its C(diff) beside it in diff mode."
  returned: with I(write), when the build found nothing to refuse
  type: list
plugin:
  description: The plugin probe's answer (C(rc), C(stdout), C(stderr), C(msg)).
  returned: with I(plugin_probe), unless the build or the write failed
  type: dict
records:
  description: "With I(compare): C({host: [nccl_env.fabric, nccl_env.consistent]}) for preflight_check."
  returned: with I(compare)
  type: dict
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.trainyard.core.plugins.plugin_utils import nccl_vars, render_checks
from ansible_collections.trainyard.core.plugins.plugin_utils import bases


def variables_record(env, errors, profile, fix=""):
    """The nccl_env.variables record of the preflight report from build_env's answer."""
    return {"check": "nccl_env.variables", "ok": not errors, "fix": fix,
            "detail": "; ".join(errors) if errors else
            f"{len(env)} variables, profile {profile}, NCCL_DEBUG={env.get('NCCL_DEBUG', 'unset')}",
            "data": {"profile": profile, "drift": {"nccl_env_profile": profile}}}


def managed_header():
    """The file's first lines: Ansible's managed string (DEFAULT_MANAGED_STR, "Ansible managed") as a comment, what the
    template module's ansible_managed | comment writes."""
    from ansible import constants as C
    from ansible.plugins.filter.core import comment

    return comment(str(C.config.get_config_value("DEFAULT_MANAGED_STR")))


class ActionModule(bases.ControllerAction):
    def decide(self, args, task_vars):
        if args.get("compare") is not None:
            return self.compare(bases.need_dict(args["compare"], "nccl_env_validate: 'compare'"), task_vars)
        host, model = task_vars.get("inventory_hostname"), args.get("model") or {}
        broken = [f"{host}: cluster_model is not set. The validate play (playbooks/validate.yml, role cluster, "
                  "tasks/validate.yml) computes it; run the render roles after it."] * (
            "model" in args and not all(k in model for k in ("node_rank", "master_addr"))) + [
            f"{host}: no data interface for NCCL_SOCKET_IFNAME: the network role did not set network_iface (did it "
            "run in the prepare play?) and cluster_data_iface is empty. Run the network role first, or set "
            "cluster_data_iface (or nccl_env_socket_ifname) to the interface of the data network."] * (
            "ifname" in args and not args["ifname"])
        if broken:
            return dict(failed=True, msg=" ".join(broken))
        sections = args.get("sections")
        if args.get("settings") is not None:
            sections = nccl_vars.role_sections(model, str(args.get("ifname") or ""),
                                               bases.need_dict(args["settings"], "nccl_env_validate: 'settings'"))
        if not isinstance(sections, list) or not all(isinstance(s, dict) and "vars" in s for s in sections):
            raise AnsibleActionFail("nccl_env_validate: 'sections' must be a list of {title, vars}")
        extra = bases.need_dict(args.get("extra") or {}, "nccl_env_extra (NAME: value)")
        merged, env, errors = nccl_vars.build_env(sections, extra, bases.str_list(args.get("allow_unknown")),
                                                  str(args.get("profile") or ""))
        profile = str(args.get("profile") or "")
        result = self.record(task_vars, variables_record(env, errors, profile, str(args.get("fix") or "")))
        result["ansible_facts"].update(bases.need_dict(args.get("publish") or {}, "nccl_env_validate: 'publish'"))
        settings = args.get("settings") or {}
        built = dict(result, ok=not errors, errors=errors, sections=merged, env=env,
                     refuse=[f"{host}: {'; '.join(errors)}"] if errors else [],
                     content=render_checks.env_file_text(merged, str(args.get("job") or ""), managed_header()),
                     path=str(args.get("path") or ""),
                     fabric={k: settings.get(k, "") for k in ("profile", "gpu_nics", "plugin_dir", "ib_hca")})
        if args.get("write") is not None:
            built = self.write(bases.need_dict(args["write"], "nccl_env_validate: 'write'"), built, task_vars)
        if args.get("plugin_probe") and not built.get("failed"):
            built["plugin"] = self.plugin_probe(bases.str_list(args["plugin_probe"]), task_vars)
        return built

    def plugin_probe(self, argv, task_vars):
        """The look for the NCCL net plugin (the command's argv: a find in the training container), read in check mode
        too; its failure is nccl_env.fabric's to judge (render_checks.nccl_fabric), never the task's."""
        answer = self.run_reading_module("ansible.legacy.command", {"argv": argv}, task_vars)
        return {k: answer[k] for k in ("rc", "stdout", "stderr", "msg") if k in answer}

    def write(self, write, built, task_vars):
        """The file written on the node by the job_files module (one round trip, through module_utils/jobtree.py);
        a refused build fails here, before the node is touched, with job_files' message (the refusal's lines)."""
        if built["refuse"]:
            return dict(built, failed=True, msg="\n".join(built["refuse"]))
        files = write.get("files") or []
        if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
            raise AnsibleActionFail("nccl_env_validate: 'write.files' must be a list of {path, mode}")
        module_args = dict(write, files=[f if "content" in f else dict(f, content=built["content"]) for f in files])
        written = self._execute_module(module_name="job_files", module_args=module_args, task_vars=task_vars)
        written.pop("invocation", None)
        # The write's files and diff on the task's result, as job_files gives them (the check-mode plan shows them).
        out = dict(built, write=written, changed=bool(written.get("changed")), files=written.get("files") or [],
                   **({"diff": written["diff"]} if written.get("diff") else {}))
        if written.get("failed"):
            out.update(failed=True, msg=written.get("msg", "job_files failed"))
        return out

    def compare(self, args, task_vars):
        """Every node's records from its registered results, given once for the play as values; those of the nodes of
        'record' recorded."""
        hosts = bases.str_list(args.get("hosts"))
        lists = {k: args.get(k) for k in ("validated", "write", "plugin")}
        bad = [k for k, v in lists.items() if not isinstance(v, list) or len(v) != len(hosts)]
        if bad:
            raise AnsibleActionFail("nccl_env_validate: 'compare' needs %s: one registered result per host of 'hosts' "
                                    "(%d), in its order, as values" % (", ".join(bad), len(hosts)))
        nodes = {h: {k: lists[k][i] or {} for k in lists} for i, h in enumerate(hosts)}
        records = render_checks.nccl_env_records(nodes, bases.str_list(args.get("rank_order")),
                                                 boolean(args.get("iface_uniform", True), strict=False))
        mine = bases.str_list(args.get("record"))
        out = self.record(task_vars, *[dict(r, host=h) for h in mine for r in records.get(h, [])]) if mine else {}
        return dict(out, records=records)
