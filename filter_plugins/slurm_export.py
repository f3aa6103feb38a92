# -*- coding: utf-8 -*-
"""Filters of playbooks/export.yml: the per-node health configuration a run proved and the sbatch script of the
command that ran (plugin_utils/slurm_export.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.trainyard.core.plugins.plugin_utils import slurm_export as se


def slurm_health(report, hosts, names=None):
    try:
        return se.health(report or {}, list(hosts), dict(names or {}))
    except se.ExportError as e:
        raise AnsibleFilterError(str(e))


def slurm_sbatch(command, job, hosts_by_rank, names, exclude, container, env, run_id, partition="", time_limit=""):
    try:
        return se.sbatch_script(job, list(hosts_by_rank), dict(names or {}), list(exclude or []), list(command or []),
                                container, dict(env or {}), run_id, partition, time_limit)
    except se.ExportError as e:
        raise AnsibleFilterError(str(e))


def slurm_command(launch, node, head):
    try:
        return se.recorded_command(launch, node, head)
    except se.ExportError as e:
        raise AnsibleFilterError(str(e))


def env_from_text(text):
    try:
        return se.env_from_text(text)
    except se.ExportError as e:
        raise AnsibleFilterError(str(e))


class FilterModule(object):
    def filters(self):
        return {"trainyard_slurm_health": slurm_health, "trainyard_slurm_sbatch": slurm_sbatch,
                "trainyard_slurm_command": slurm_command, "trainyard_env_from_text": env_from_text}
