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


def test_a_command_joins_the_ray_head_started_on_this_machine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`ray start --head` once, and every flash-compactor command joins that Ray instead of starting its own."""
    import os
    import socket
    import tempfile

    from flash_pipeline.catalog.catalog import Catalog
    from flash_pipeline.cli.demo import DEMO_SOURCE, demo_deltas

    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_RAY_ADDRESS", "RAY_ADDRESS")}
    env.update(RAY_TMPDIR=ray_tmp, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", FLASH_EXECUTOR="ray", PYTHONPATH=str(REPO))
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    # --block keeps `ray start` in the foreground, heading its own process group: killing the group stops this
    # head alone (`ray stop` would stop every Ray of the machine, the test session's included)
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
         "--disable-usage-stats", "--node-ip-address=127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    import time

    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(ray_tmp, "ray", "ray_current_cluster")):
        assert head.poll() is None and time.monotonic() < deadline, "ray start --head failed"
        time.sleep(0.2)
    try:
        lake = tmp_path / "lake"
        cat = Catalog(str(lake))
        for partition, files in demo_deltas():
            cat.append(DEMO_SOURCE, partition, "upsert", files)
        out = subprocess.run(
            [sys.executable, "-m", "flash_pipeline.cli", "compact", "--catalog", str(lake), "--table", DEMO_SOURCE,
             "--primary-key", "Order ID", "--sort-key", "Last Updated"],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert f"joining the Ray at 127.0.0.1:{port}" in out.stderr
        # the head saw the command's job: it ran there, not on a Ray of its own
        jobs = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address='127.0.0.1:{port}', log_to_driver=False); "
             "from ray._private.state import jobs; print(len(jobs()))"],
            env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=180,
        )
        assert jobs.returncode == 0, jobs.stderr[-2000:]
        assert int(jobs.stdout.strip().splitlines()[-1]) >= 2  # the command's job and this check's
        assert sum(cat.latest_compacted(DEMO_SOURCE, p).rows for p in cat.partitions(DEMO_SOURCE)) == 8
        # the same head given by its address: it wants this machine's token as well (Ray's default for `ray
        # start --head`); without it the command waited 22 s, then said "no Ray cluster" at the right address
        for partition, files in demo_deltas():
            cat.append(DEMO_SOURCE, partition, "upsert", files)
        again = subprocess.run(
            [sys.executable, "-m", "flash_pipeline.cli", "compact", "--catalog", str(lake), "--table", DEMO_SOURCE,
             "--ray-address", f"127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=300,
        )
        assert again.returncode == 0, again.stderr[-2000:]
        assert all(cat.latest_compacted(DEMO_SOURCE, p).version == 2 for p in cat.partitions(DEMO_SOURCE))
    finally:
        import psutil

        from flash_pipeline.cli.dev import stop_shared_ray

        # stopped as `flash-compactor dev` stops its head: the head's group, every Ray process of it gone after
        processes = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        stop_shared_ray(head)
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"Ray processes left after stopping the head: {[p.name() for p in alive]}"


def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_ray_address_nothing_answers_at_is_refused_in_one_line_and_leaves_the_lake_as_it_was(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ray.init retries an unreachable GCS for minutes (a mistyped --ray-address kept a three-row compaction
    waiting over five minutes); the command now refuses it at once, naming the address and what to do."""
    import os

    import pyarrow as pa

    from flash_pipeline import Catalog

    lake = tmp_path / "lake"
    Catalog(lake).append("T", (), "upsert", [pa.table({"k": [1, 2], "v": ["a", "b"]})])
    before = sorted((p.relative_to(lake), p.stat().st_size) for p in lake.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k not in ("FLASH_RAY_ADDRESS", "RAY_ADDRESS")}
    for address, fragment in ((f"127.0.0.1:{_closed_port()}", "no Ray cluster answers at"), ("nonsense", "is not HOST:PORT"),
                              (f"127.0.0.1:{_closed_port()}", "FLASH_RAY_CONNECT_TIMEOUT must be seconds")):
        env["FLASH_RAY_CONNECT_TIMEOUT"] = "x" if "TIMEOUT" in fragment else "5"
        done = subprocess.run([sys.executable, "-m", "flash_pipeline.cli", "compact", "--catalog", str(lake), "--table", "T",
                               "--primary-key", "k", "--ray-address", address], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        assert len(errors) == 1 and fragment in errors[0], done.stderr
        assert "TIMEOUT" in fragment or (address in errors[0] and "--ray-address" in errors[0]), done.stderr
    assert sorted((p.relative_to(lake), p.stat().st_size) for p in lake.rglob("*")) == before


def test_rays_own_ray_address_is_joined_like_flash_ray_address(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`ray job submit` gives the job's driver the cluster in RAY_ADDRESS: a compaction run there started a Ray of
    its own (or ran in process) beside the cluster. It now joins it; FLASH_RAY_ADDRESS still wins. Checked with
    an address nothing answers at: the refusal names it (before, the three rows compacted in process, exit 0)."""
    import os

    import pyarrow as pa

    from flash_pipeline import Catalog
    from flash_pipeline.compactor.runtime.cluster import configured_ray_address

    lake = tmp_path / "lake"
    Catalog(lake).append("T", (), "upsert", [pa.table({"k": [1, 2, 2], "v": ["a", "b", "c"]})])
    before = sorted((p.relative_to(lake), p.stat().st_size) for p in lake.rglob("*"))
    base = {k: v for k, v in os.environ.items() if k not in ("FLASH_RAY_ADDRESS", "RAY_ADDRESS", "FLASH_EXECUTOR")}
    closed, other = f"127.0.0.1:{_closed_port()}", f"127.0.0.2:{_closed_port()}"
    for extra, named in (({"RAY_ADDRESS": closed}, closed), ({"RAY_ADDRESS": closed, "FLASH_RAY_ADDRESS": other}, other)):
        done = subprocess.run([sys.executable, "-m", "flash_pipeline.cli", "compact", "--catalog", str(lake), "--table", "T",
                               "--primary-key", "k"], capture_output=True, text=True, env={**base, **extra}, timeout=120)
        assert done.returncode == 2 and f"no Ray cluster answers at {named}" in done.stderr, done.stderr[-2000:]
    assert sorted((p.relative_to(lake), p.stat().st_size) for p in lake.rglob("*")) == before
    saved = {k: os.environ.pop(k, None) for k in ("FLASH_RAY_ADDRESS", "RAY_ADDRESS")}
    try:
        assert configured_ray_address() is None
        os.environ["RAY_ADDRESS"] = "ray://head:10001"
        assert configured_ray_address() == "ray://head:10001"
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def test_a_failure_of_the_ray_cluster_itself_is_one_line_naming_the_job_and_the_fix() -> None:
    """Ray's own exceptions for a dead raylet, a lost node or object, or its memory monitor's kill become a
    ClusterFailure (exit 1) naming the job and what to do; an exception a task raised (RayTaskError) keeps its
    own report. The exception objects are Ray's own; an adversarial run killed a real raylet under a compaction
    and got "unexpected LocalRayletDiedError ... Check raylet.out" with no table named."""
    import ray.exceptions as rex

    from flash_pipeline.compactor.runtime.cluster import cluster_failure
    from flash_pipeline.errors import ClusterFailure

    for exc in (rex.LocalRayletDiedError(), rex.NodeDiedError("node 1f3a died"), rex.ObjectLostError("abc" * 10, "owner", "site"),
                rex.OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node ...")):
        failure = cluster_failure(exc, "compact T -> T")
        assert isinstance(failure, ClusterFailure) and failure.exit_code == 1, exc
        line = str(failure)
        assert "\n" not in line and line.startswith("compact T -> T: the Ray cluster failed") and "run the command again" in line
        assert type(exc).__name__ in line
    assert cluster_failure(ValueError("a bug"), "compact T -> T") is None
    task_error = rex.RayTaskError("materialize_step", "Traceback ...", ValueError("a bug"))
    assert cluster_failure(task_error, "compact T -> T") is None


BUSY = r"""
import time, ray
from flash_pipeline.compactor.runtime import cluster
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)  # never another test's head
hold = ray.remote(num_cpus=1)(lambda: time.sleep(120)).remote()  # another client's task holds the only CPU
deadline = time.monotonic() + 60
while ray.available_resources().get("CPU", 0) > 0:  # until the task holds it
    assert time.monotonic() < deadline, "the holding task never started"
    time.sleep(0.05)
cluster.WARM_UP_WAIT_SECONDS = 2.0  # the bound under test, shortened for the suite
t = time.monotonic()
cluster.warm_up_workers()
print(round(time.monotonic() - t, 1))
ray.cancel(hold, force=True)
"""


def test_the_warm_up_does_not_hold_a_command_while_the_cluster_is_busy() -> None:
    """The warm-up waited until every CPU of the cluster was free at once: joining a cluster another client kept
    busy, a compaction printed nothing for 150 s before its first step (an adversarial run). It waits at most
    WARM_UP_WAIT_SECONDS; the rounds then queue for CPUs with their progress lines."""
    out = subprocess.run([sys.executable, "-c", BUSY], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    waited = float(out.stdout.strip().splitlines()[-1])
    assert 1.5 <= waited <= 15, waited  # the 2 s bound, not the 120 s the CPU stays busy
