"""Shared fixtures: a local lake, an S3 lake on a moto server process, and ``any_lake`` over both."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from flash_pipeline.catalog.catalog import Catalog

# Credentials for the moto server, set before anything starts: a Ray started by any test hands its environment
# to its workers, which then read and write the S3 lakes of later tests.
for _name, _value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
    os.environ[_name] = _value
os.environ.pop("AWS_SESSION_TOKEN", None)
os.environ.pop("AWS_PROFILE", None)
# Kernels compiled ahead of time are built in the background once a process has used Numba (kernels/aot.py), so a
# suite would switch from Numba to them part way through, at a moment that depends on the machine. The suite runs
# without them; tests/compactor/kernels/test_aot.py turns them on, each test with a build of its own.
os.environ.setdefault("FLASH_AOT_KERNELS", "off")

TESTS = Path(__file__).resolve().parent

# A shell starts a background job with SIGINT ignored, and a process keeps that through exec. Dagster's interrupt
# set-up then copies SIGINT's disposition to SIGTERM, so every process a test starts afterwards ignored SIGTERM: a
# multiprocessing pool's exit (terminate) waited forever for its worker. The suite behaves the same in the
# foreground and in the background: Ctrl-C (and SIGTERM) act as Python's default here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

# ----- test tiers: `pytest -m "not slow"` is the fast tier (README); the full suite runs everything -------------
# whole modules that start real clusters, browsers, servers or kill processes (each names why)
SLOW_MODULES = {
    "tests/assets/test_dagster_ui.py": "headless Chromium against dg dev",
    "tests/assets/test_dagster_spark_load.py": "a Spark driver",
    "tests/assets/test_dagster_interrupt.py": "a Dagster run interrupted in a subprocess",
    "tests/benchmarks/test_benchmarks_small.py": "the benchmark scripts at small scale",
    "tests/benchmarks/test_live_memory.py": "a Ray cluster's memory",
    "tests/catalog/test_races.py": "writer processes racing",
    "tests/catalog/test_iceberg_histories_a.py": "100 random histories read through five readers",
    "tests/catalog/test_iceberg_histories_b.py": "100 random histories read through five readers",
    "tests/compactor/runtime/test_cluster.py": "Ray heads and clusters",
    "tests/compactor/runtime/test_determinism_and_cluster.py": "a two-node Ray cluster",
    "tests/compactor/runtime/test_arrow_pool_release.py": "Ray workers' memory",
    "tests/compactor/test_resilience.py": "drivers and workers killed and resumed",
    "tests/compactor/test_rounds.py": "multi-round sessions at scale",
    "tests/sensors/test_postgres_instance.py": "a PostgreSQL server",
    "tests/test_s3_faults.py": "an S3 endpoint that drops requests and answers",
}
SLOW_PARAMS = {"s3", "ray"}  # a test's S3 (moto server) and Ray-executor variants; its local, in-process ones stay fast


SLOW_TESTS = frozenset(line.strip() for line in (TESTS / "slow_tests.txt").read_text().splitlines()
                       if line.strip() and not line.startswith("#"))


def _is_slow(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow") is not None or item.nodeid in SLOW_TESTS:
        return True
    if Path(str(item.fspath)).relative_to(REPO).as_posix() in SLOW_MODULES:
        return True
    callspec = getattr(item, "callspec", None)
    values = {str(v) for v in callspec.params.values()} if callspec is not None else set()
    if values & SLOW_PARAMS or any(part in SLOW_PARAMS for part in (callspec.id.split("-") if callspec is not None else [])):
        return True
    # a test that starts the moto server, unless it is the local variant of a parametrized one
    return "moto_endpoint" in getattr(item, "fixturenames", ()) and "local" not in values


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """The order the tests ran in, on the run's last line even under -q (pytest-randomly's header is not shown)."""
    seed = getattr(config.option, "randomly_seed", None) if config.pluginmanager.has_plugin("randomly") else None
    line = f"test order: pytest-randomly seed {seed}" if seed is not None else "test order: file order (pytest-randomly off)"
    terminalreporter.write_line(line)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadscope` that survives a crashed worker (tests/xdist_crash.py): without it a crash hung the run."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist_crash import crash_safe_loadscope

    return crash_safe_loadscope(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
    _heaviest_modules_first(items)


MODULE_SECONDS = {path: float(seconds) for seconds, path in (line.split() for line in
                  (TESTS / "module_seconds.txt").read_text().splitlines() if line.strip() and not line.startswith("#"))}


def _heaviest_modules_first(items: list[pytest.Item]) -> None:
    """On the workers of a parallel run (`-n 3 --dist loadscope --no-loadscope-reorder`, README), the modules in
    order of their measured seconds (tests/module_seconds.txt), each module's tests kept together in their
    shuffled order: the workers take modules in this order, longest first, so the run does not end with one
    worker alone in a long module. A serial run keeps pytest-randomly's order (shuffled before this hook)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(modules, key=lambda m: -MODULE_SECONDS.get(m, 0.0))  # stable: unlisted keep their order
    items[:] = [item for module in ordered for item in modules[module]]


REPO = TESTS.parent
BUCKET = "flash-test-lake"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server process exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture(scope="session", autouse=True)
def _isolated_calibration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests must not teach this installation's latency model (nor read what benchmarks taught it)."""
    old = os.environ.get("FLASH_CALIBRATION_PATH")
    os.environ["FLASH_CALIBRATION_PATH"] = str(tmp_path_factory.mktemp("calibration") / "calibration.json")
    yield
    if old is None:
        os.environ.pop("FLASH_CALIBRATION_PATH", None)
    else:
        os.environ["FLASH_CALIBRATION_PATH"] = old


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server process on 127.0.0.1 (started once per session) and its endpoint URL."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ["AWS_ACCESS_KEY_ID"] = "testing"
    os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "_moto_server.py"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc=proc)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        stop_process(proc, timeout=10)


def stop_process(proc: subprocess.Popen, timeout: float = 20, group_signal: int | None = None) -> None:
    """Stop a server the tests started: SIGTERM (or ``group_signal`` to its whole process group, e.g. SIGINT as a
    terminal's Ctrl-C), then SIGKILL after ``timeout`` seconds."""
    import os
    import signal

    if group_signal is None:
        proc.terminate()
    else:
        os.killpg(proc.pid, group_signal)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if group_signal is None:
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def lake(tmp_path: Path) -> Catalog:
    return Catalog(tmp_path / "lake")


def fresh_bucket(endpoint: str) -> str:
    """A new, empty bucket on the moto server, for one test. moto lists a prefix by walking every key of its
    bucket (a LIST took 9 ms in an empty bucket, 21 ms beside 10,000 keys, 57 ms beside 30,000), so S3 tests that
    shared one bucket slowed each other down as a run went on."""
    import boto3

    name = f"t-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_lake(moto_endpoint: str) -> Catalog:
    """A lake in a fresh bucket of the moto server for each test."""
    return Catalog(f"s3://{fresh_bucket(moto_endpoint)}/lake-{uuid.uuid4().hex[:12]}", endpoint_url=moto_endpoint)


@pytest.fixture(params=["local", "s3"])
def any_lake(request: pytest.FixtureRequest) -> Catalog:
    if request.param == "local":
        return request.getfixturevalue("lake")
    return request.getfixturevalue("s3_lake")


def catalog_env(catalog: Catalog) -> dict[str, str]:
    """Environment for a subprocess that opens ``catalog.uri`` (the S3 endpoint travels in an env var)."""
    env = dict(os.environ)
    endpoint = getattr(catalog.storage, "endpoint_url", None)
    if endpoint:
        env["FLASH_S3_ENDPOINT_URL"] = endpoint
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env
