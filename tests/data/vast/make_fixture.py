#!/usr/bin/env python3
"""Writes show-instances.json and show-overlays.json: what `vastai show instances --raw` and
`vastai show overlays --raw` print for the instance and overlay objects below (see README.md).

The objects are the API's (field names, types and shapes as in docs.vast.ai's API reference example and as
vast.py reads them); the transformation is the CLI's own for --raw (vast.py `show__instances`: every string
stripped, `duration` = now - start_date, `extra_env` pairs turned into a dict; `main`: json.dumps(rows,
indent=1, sort_keys=True)). NOW is fixed so the file does not change between runs."""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOW = 1795000000.0  # fixed "time.time()" of the capture

BASE = {
    "actual_status": "running", "intended_status": "running", "cur_state": "running", "next_state": "running",
    "template_id": None, "template_hash_id": None, "template_name": None,
    "image_uuid": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel", "image_args": [],
    "image_runtype": "ssh ssh_direc ssh_proxy", "extra_env": [["-n trainnet", "1"], ["-p 22:22", "1"]],
    "onstart": None, "jupyter_token": "0000000000000000000000000000000000000000000000000000000000000000",
    "status_msg": "success, running pytorch/pytorch_2.5.1-cuda12.4-cudnn9-devel/ssh\n",
    "ssh_idx": "6", "machine_dir_ssh_port": 21000, "end_date": 1797592000.0, "uptime_mins": 96.4,
    "cpu_arch": "amd64", "cpu_cores": 224, "cpu_cores_effective": 28.0, "cpu_name": "Xeon\u00ae Platinum 8480+",
    "cpu_ram": 2063900, "cpu_util": 0.4, "mem_limit": 257.9, "mem_usage": 3.1, "vmem_usage": 4.2,
    "gpu_name": "H100 SXM", "gpu_arch": "nvidia", "gpu_totalram": 81559, "gpu_ram": 81559, "gpu_util": 0.0,
    "gpu_temp": 31.0, "gpu_frac": 1.0, "gpu_lanes": 16, "gpu_mem_bw": 2910.7, "bw_nvlink": 370.4,
    "disk_name": "SAMSUNG MZQL27T6HBLA", "disk_space": 500.0, "disk_bw": 5400.0, "disk_util": 0.02,
    "disk_usage": 9.8, "direct_port_count": 200, "direct_port_start": 40000, "direct_port_end": 40199,
    "static_ip": True, "num_gpus": 8, "dph_total": 17.2, "reliability2": 0.998, "inet_up": 8420.1,
    "inet_down": 8911.7, "driver_version": "560.35.03", "cuda_max_good": 12.6, "host_id": 81234,
    "geolocation": "Texas, US", "verification": "verified", "is_bid": False, "bundle_id": 617,
    "public_ipaddr": "198.51.100.40\n", "ssh_host": "ssh6.vast.ai",
}

# Five instances of one account: two on the overlay "trainnet" (one with a direct SSH port, one through the
# proxy), one stopped, one still loading, one on another overlay.
ROWS = [
    dict(BASE, id=31000412, label="head", machine_id=4412, start_date=1794990000.0, ssh_port=30412,
         ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40022"}], "8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40080"}]},
         local_ipaddrs="10.0.0.1 172.17.0.2\n"),
    dict(BASE, id=31000377, label="worker", machine_id=4413, start_date=1794990100.0, ssh_port=30377,
         public_ipaddr="198.51.100.41", ports={}, local_ipaddrs="10.0.0.2 172.17.0.2 \n"),
    dict(BASE, id=31000501, label="spare", machine_id=4414, start_date=1794980000.0, ssh_port=30501,
         actual_status="exited", intended_status="stopped", cur_state="stopped", next_state="stopped",
         public_ipaddr="198.51.100.42", ports={}, local_ipaddrs="10.0.0.3 172.17.0.2"),
    dict(BASE, id=31000502, label="late", machine_id=4415, start_date=1794999000.0, ssh_port=30502,
         actual_status="loading", status_msg="Pulling image", public_ipaddr="198.51.100.43", ports={},
         local_ipaddrs=""),
    dict(BASE, id=31000610, label="eval", machine_id=5120, start_date=1794970000.0, ssh_port=30610,
         public_ipaddr="198.51.100.44", ports={}, local_ipaddrs="10.1.0.1 172.17.0.2",
         extra_env=[["-n evalnet", "1"]]),
]

OVERLAYS = [
    {"overlay_id": 211, "name": "trainnet", "internal_subnet": "10.0.0.0/24", "cluster_id": 88,
     "instances": [31000412, 31000377, 31000501, 31000502]},
    {"overlay_id": 212, "name": "evalnet", "internal_subnet": "10.1.0.0/24", "cluster_id": 88,
     "instances": [31000610]},
]


def strip_strings(value):  # as vast.py strip_strings
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {k: strip_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_strings(v) for v in value]
    return value


def cli_raw(rows):
    out = []
    for row in rows:  # as vast.py show__instances
        row = {k: strip_strings(v) for k, v in row.items()}
        row["duration"] = NOW - row["start_date"]
        row["extra_env"] = {env_var[0]: env_var[1] for env_var in row["extra_env"]}
        out.append(row)
    return json.dumps(out, indent=1, sort_keys=True)  # as vast.py main() under --raw


if __name__ == "__main__":
    (HERE / "show-instances.json").write_text(cli_raw(ROWS) + "\n")
    (HERE / "show-overlays.json").write_text(json.dumps(OVERLAYS, indent=1, sort_keys=True) + "\n")
