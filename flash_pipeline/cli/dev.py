"""``dev``: the Dagster UI on a lake, with one Ray for the whole deployment.

``dg dev`` (what Dagster recommends) starts the webserver and daemon; each run is a new process. A run whose
input is too large to compact in its own process (runtime/executor.py) would start a local Ray of its own and
pay its start-up (seconds) every time. This command first starts one Ray head on this machine (loopback only,
no dashboard), which every run finds and joins (runtime/cluster.py ``running_local_head``), then runs ``dg dev``
in the project directory, and stops that head when ``dg dev`` ends (Ctrl-C). Dagster itself is a subprocess:
the engine never imports it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flash_pipeline.cli.flags import Command
from flash_pipeline.errors import FlashError

RAY_START_TIMEOUT = 120.0


def register(sub: Any) -> dict[str, Command]:
    p = sub.add_parser("dev", help="start the Dagster UI (dg dev) on a lake, with one Ray shared by its runs")
    p.add_argument("--lake", metavar="DIR|s3://BUCKET/PREFIX", help="the lake (default $FLASH_LAKE or ./demo_lake)")
    p.add_argument("--host", default="127.0.0.1", help="address of the UI (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=3000, help="port of the UI (default 3000)")
    p.add_argument("--no-ray", action="store_true",
                   help="start no shared Ray: runs compact in process, or start their own Ray for large inputs")
    p.add_argument("--ray-cpus", type=int, default=None, metavar="N", help="CPUs of the shared Ray (default: all)")
    p.add_argument("--project-dir", metavar="DIR", help="the Dagster project (default: this checkout)")
    return {"dev": cmd_dev}


def project_dir(given: str | None) -> Path:
    """The directory whose pyproject.toml declares the dg project (``[tool.dg]``)."""
    candidates = [Path(given)] if given else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for d in candidates:
        pyproject = d / "pyproject.toml"
        if pyproject.is_file() and "[tool.dg]" in pyproject.read_text():
            return d
    raise FlashError(f"no Dagster project (pyproject.toml with [tool.dg]) in {', '.join(map(str, candidates))}: "
                     "run from the repository root or pass --project-dir")


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FlashError(f"{path} not found: install the project (pip install -e .) into this environment")
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_shared_ray(num_cpus: int | None, env: dict[str, str]) -> subprocess.Popen[str] | None:
    """Start a Ray head for the deployment unless one answers already (then the runs join that one).

    ``ray start --head --block`` stays in the foreground in its own process group, so stopping that group stops
    this head alone, never another Ray of the machine."""
    from flash_pipeline.compactor.runtime.cluster import running_local_head

    found = running_local_head()
    if found:
        print(f"{Path(sys.argv[0]).name} dev: runs will join the Ray already running at {found}", file=sys.stderr)
        return None
    port = _free_port()
    args = [_tool("ray"), "start", "--head", "--block", f"--port={port}", "--include-dashboard=false",
            "--disable-usage-stats", "--node-ip-address=127.0.0.1"]
    if num_cpus:
        args.append(f"--num-cpus={num_cpus}")
    print(f"flash-compactor dev: starting the deployment's Ray on 127.0.0.1:{port} (a few seconds) ...",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    head = subprocess.Popen(args, env={**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    while running_local_head() != f"127.0.0.1:{port}":
        if head.poll() is not None:
            raise FlashError(f"ray start --head failed: {(head.stderr.read() if head.stderr else '').strip()[-500:]}; "
                             "start without it: flash-compactor dev --no-ray")
        if time.monotonic() - started > RAY_START_TIMEOUT:
            stop_shared_ray(head)
            raise FlashError(f"Ray did not start within {RAY_START_TIMEOUT:.0f} s; start without it: flash-compactor "
                             "dev --no-ray")
        time.sleep(0.2)
    print(f"flash-compactor dev: Ray ready in {time.monotonic() - started:.1f} s; "
          "every run of this deployment joins it", file=sys.stderr, flush=True)
    return head


def stop_shared_ray(head: subprocess.Popen[str] | None) -> None:
    """Stop the head's process group and, as ``ray stop`` does, forget it: a record of a head that is gone makes
    every later ``ray.init()`` on this machine try to connect to it.

    SIGINT, as Ctrl-C in a terminal: the head and its processes are gone in about 2 s. A SIGTERM to the group
    makes the raylet try to drain the node through the GCS the same signal just stopped, and wait 30 s for it."""
    if head is None:
        return
    if head.poll() is None:
        try:
            os.killpg(head.pid, signal.SIGINT)
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        except ProcessLookupError:
            pass
    try:
        from ray._private.utils import get_ray_address_file, read_ray_address

        if read_ray_address() == getattr(head, "address", None):
            os.remove(get_ray_address_file(None))
    except Exception:  # noqa: BLE001 - a private helper of Ray's; the engine ignores stale records anyway
        pass


def cmd_dev(args: argparse.Namespace) -> int:
    cwd = project_dir(args.project_dir)
    env = dict(os.environ)
    lake = args.lake or env.get("FLASH_LAKE") or "./demo_lake"
    if not lake.startswith("s3://"):
        lake = str(Path(lake).resolve())
    env["FLASH_LAKE"] = lake
    dg = [_tool("dg"), "dev", "--no-check-yaml", "--host", args.host, "--port", str(args.port)]
    ray_wanted = not args.no_ray and not (env.get("FLASH_RAY_ADDRESS") or env.get("RAY_ADDRESS"))
    head = start_shared_ray(args.ray_cpus, env) if ray_wanted else None
    print(f"flash-compactor dev: the Dagster UI on http://{args.host}:{args.port} for the lake {lake} "
          "(Ctrl-C stops it)", file=sys.stderr, flush=True)
    proc = subprocess.Popen(dg, cwd=cwd, env=env)
    # a SIGTERM to this command alone shuts dg dev down the way Ctrl-C does; the head is stopped below
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGINT))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # Ctrl-C reached dg dev too (same process group): wait for its shutdown
                continue
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
        stop_shared_ray(head)
