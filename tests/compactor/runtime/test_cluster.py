"""The engine's local Ray (flash_pipeline/compactor/runtime/cluster.py) listens on the loopback interface only."""

from __future__ import annotations

import ipaddress
import subprocess
import sys

from conftest import REPO

PROBE = r"""
import json, psutil
from flash_pipeline.compactor.runtime.cluster import ensure_ray
ensure_ray(num_cpus=1)
me = psutil.Process()
pids = {p.pid for p in me.children(recursive=True)} | {me.pid}
listening = sorted({(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN and c.pid in pids})
print(json.dumps(listening))
"""


def test_local_ray_listens_on_loopback_only() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    listening = [tuple(x) for x in __import__("json").loads(out.stdout.strip().splitlines()[-1])]
    # the GCS, raylet, object manager, agents and workers all listen somewhere: the probe saw them
    assert len(listening) >= 4, listening
    for ip, port in listening:
        addr = ipaddress.ip_address(ip)
        if getattr(addr, "ipv4_mapped", None) is not None:
            addr = addr.ipv4_mapped
        assert addr.is_loopback, f"Ray listens on {ip}:{port}, reachable from other machines"
