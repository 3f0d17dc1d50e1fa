"""Start or join Ray: local by default, an existing cluster when an address is configured."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flash_pipeline.errors import ClusterFailure, FlashError

_lock = threading.Lock()
_warmed = False


class _NotOnMainThread(logging.Filter):
    """Drops Ray's warning that it cannot set its SIGTERM handler when ``ray.init`` runs off the main thread: a
    Dagster run (and a keeper thread) always joins from another thread, and the run's own shutdown stops Ray."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _quiet_ray_warnings() -> None:
    log = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, _NotOnMainThread) for f in log.filters):
        log.addFilter(_NotOnMainThread())


def configured_ray_address() -> str | None:
    """The Ray cluster the environment names: ``FLASH_RAY_ADDRESS``, else Ray's own ``RAY_ADDRESS`` (which
    `ray job submit` sets for the job's driver: a compaction submitted as a Ray job joins that cluster)."""
    return os.environ.get("FLASH_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or None


def ensure_ray(num_cpus: int | None = None, address: str | None = None) -> Any:
    """Initialise Ray once per process. ``address`` (or FLASH_RAY_ADDRESS, or RAY_ADDRESS) joins a running cluster."""
    import ray

    global _warmed
    with _lock:
        if ray.is_initialized():
            if not _warmed:  # Ray started by the caller: warm its workers once, on the first compaction
                warm_up_workers()
                _warmed = True
            return ray
        _quiet_ray_warnings()
        address = address or configured_ray_address()
        if not address:
            address = running_local_head()
            if address:  # a `ray start --head` of this machine, which enables token authentication by default
                send_auth_token_if_any()
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": True, "namespace": "flash-compactor"}
        if address:
            require_reachable(address)
            if _on_loopback(address):  # a local cluster that listens on 127.0.0.1 only: find its raylet there
                loopback_only(ray)
                # a `ray start --head` of this machine given by its address: it wants this machine's token too (Ray
                # logged 20 InvalidAuthToken warnings over 22 s, then "no Ray cluster" at the right address)
                send_auth_token_if_any()
            try:
                with _keeping_sigterm_handler():
                    ray.init(address=address, **kwargs)
            except ConnectionError as exc:  # something answers there, but not a Ray GCS (or not to us)
                from flash_pipeline.errors import FlashError

                reason = " ".join(str(exc).split())
                if "auth" in reason.lower() or "unauthenticated" in reason.lower():
                    raise FlashError(f"the Ray cluster at {address} refused this client's authentication "
                                     f"({reason[:200]}): set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or "
                                     "RAY_AUTH_TOKEN_PATH) to the cluster's token") from None
                raise FlashError(f"no Ray cluster at {address} ({reason}): correct --ray-address / "
                                 "FLASH_RAY_ADDRESS / RAY_ADDRESS; without an address a local Ray is used") from None
        else:
            if num_cpus is None and os.environ.get("FLASH_RAY_NUM_CPUS", "").strip():
                from flash_pipeline.settings import ray_num_cpus_setting

                num_cpus = ray_num_cpus_setting()
            loopback_only(ray)
            # address "local": a new Ray of this process. Without it Ray would connect to the head recorded in its
            # temp dir even when that head is gone (a `ray start --head` killed without `ray stop`), and hang
            # Ray's C++ core installs its own (it aborts the process) even off the main thread
            with _keeping_sigterm_handler():
                _init_in_keeper_thread(
                    lambda: ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                                     _system_config=LOCAL_SYSTEM_CONFIG, **kwargs)
                )
        warm_up_workers()
        _warmed = True
        return ray


# A local Ray serves every compaction of this process and of the processes that join it (Dagster runs, other
# commands). Ray keeps at most one idle worker per CPU and kills the others after one second, so drivers taking
# turns would start (and warm) new worker processes for every round; idle workers are kept for a minute instead.
LOCAL_SYSTEM_CONFIG = {"idle_worker_killing_time_threshold_ms": 60_000, "num_workers_soft_limit": 8}


@contextlib.contextmanager
def _keeping_sigterm_handler() -> Any:
    """ray.init replaces the process's SIGTERM handler: in the main thread with ``sys.exit``, and in any thread
    with its C++ core's, which prints a stack and aborts (exit 134). The host's own (the CLI's, which stops the
    sessions at their next step and prints one line; a Dagster run worker's) is put back."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(previous):
            signal.signal(signal.SIGTERM, previous)


def send_auth_token_if_any() -> None:
    """Present this user's Ray token when joining the local head found by :func:`running_local_head`. A head
    started with ``ray start --head`` enables token authentication by default (the token in ~/.ray/auth_token),
    but a driver that joins it only sends the token when RAY_AUTH_MODE=token. An explicit RAY_AUTH_MODE is left
    alone, and so are configured addresses of other machines (their clusters document their own
    authentication); a loopback address is this machine's head."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(token_file):
        os.environ["RAY_AUTH_MODE"] = "token"
        try:  # Ray read its config when it was imported: make it read the mode again
            from ray import _raylet

            getattr(_raylet, "Config").initialize("")  # Ray's private Cython config class (no type stub)
        except Exception:  # noqa: BLE001 - a private hook; without it the join fails with Ray's own message
            pass


def ray_target(address: str | None = None) -> str:
    """What :func:`ensure_ray` is about to do, for the progress line printed before it (starting takes seconds)."""
    found = address or configured_ray_address() or running_local_head()
    return (f"joining the Ray at {found}" if found
            else "starting a local Ray (seconds; `ray start --head` once makes every run join it)")


def running_local_head() -> str | None:
    """The address of a Ray head started on this machine with ``ray start --head`` that still answers, else None.

    Ray records the last head it started in its temp dir (``ray_current_cluster``); joining it costs a fraction
    of starting a Ray of our own, and every command and Dagster run then shares that one Ray. A stale record
    (the head was stopped without ``ray stop``) is ignored."""
    import socket

    try:
        from ray._private.utils import read_ray_address

        found = read_ray_address()
    except Exception:  # noqa: BLE001 - a private helper of Ray's: without it, we start our own Ray
        return None
    if not found:
        return None
    host, _, port = found.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=0.5):
            return found
    except (OSError, ValueError):
        return None


CONNECT_TIMEOUT_SECONDS = 5.0


def require_reachable(address: str) -> None:
    """Refuse in one line a Ray address nothing answers at. ``ray.init`` retries an unreachable GCS for minutes
    (a mistyped ``--ray-address`` kept a three-row compaction waiting over five minutes, printing Ray's own
    warnings); a TCP connect answers at once for a closed port, within ``FLASH_RAY_CONNECT_TIMEOUT`` seconds
    (default 5) for a host that does not answer. ``auto`` and ``local`` are Ray's own lookups: left to Ray."""
    import socket

    from flash_pipeline.errors import FlashError

    if address in ("auto", "local"):
        return
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise FlashError(f"Ray address {address!r} is not HOST:PORT (or ray://HOST:PORT): correct --ray-address / "
                         "FLASH_RAY_ADDRESS / RAY_ADDRESS")
    from flash_pipeline.settings import env_number

    timeout = env_number("FLASH_RAY_CONNECT_TIMEOUT", CONNECT_TIMEOUT_SECONDS, 0.1, 3600, "seconds from 0.1 to 3600",
                         f"{CONNECT_TIMEOUT_SECONDS:g}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise FlashError(
            f"no Ray cluster answers at {address} ({exc.strerror or type(exc).__name__}): start it (ray start --head) "
            "or correct --ray-address / FLASH_RAY_ADDRESS / RAY_ADDRESS; without an address a local Ray is used"
        ) from None


def _on_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def loopback_only(ray: Any) -> None:
    """Make a local Ray listen on 127.0.0.1 only: nothing on this machine's other interfaces can reach it.

    Ray binds its gRPC servers to the node IP, which it takes from the machine's outward-facing address unless
    "clusters" are disabled (its switch for laptops); with them disabled the node IP is the loopback address.
    The switch is read when a process asks for its node IP, so both the environment (inherited by the GCS,
    raylet and workers) and this process's already-imported constant are set. A configured cluster address
    (``--ray-address``/FLASH_RAY_ADDRESS) never comes here."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


_keeper: threading.Thread | None = None


def _init_in_keeper_thread(init: Any) -> None:
    """Start a local Ray from a thread that lives as long as the process.

    Ray spawns its GCS and raylet with a parent-death signal, which Linux sends when the spawning *thread*
    exits: a Ray started from a short-lived thread (a thread pool, a Dagster run) would die with it.
    """
    global _keeper
    started = threading.Event()
    failure: list[BaseException] = []

    def keep() -> None:
        try:
            init()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller below
            failure.append(exc)
        finally:
            started.set()
        if not failure:
            threading.Event().wait()  # park forever: the thread's life is Ray's life

    _keeper = threading.Thread(target=keep, name="flash-ray-keeper", daemon=True)
    _keeper.start()
    started.wait()
    if failure:
        raise failure[0]


def _warm() -> int:
    """Import the engine and load its compiled kernels in a worker, so no compaction pays for it."""
    import numpy as np
    import pyarrow as pa

    from flash_pipeline.compactor.kernels import aot, compiled, digest, jit
    from flash_pipeline.compactor.steps import materialize  # noqa: F401 - imported to load it in the worker

    release_memory_promptly()
    ahead = aot.available()  # kernels compiled ahead of time: no Numba to load (kernels/aot.py)
    if not ahead:
        jit.load()  # a warm worker serves rounds of any size: the compiled kernels, not their Python source

    digest.primary_key_digests(pa.table({"a": [1], "b": ["x"]}), ["a", "b"])
    digest.hash_buckets(np.zeros((1, 20), dtype=np.uint8), 1)
    compiled.dedupe_kernel(np.zeros((1, 20), dtype=np.uint8), np.zeros((1, 0), dtype=np.uint8),
                           np.zeros(1, dtype=np.bool_))
    if not ahead:
        compiled.load_cached_kernels()  # the signatures incremental rounds use (read-only arrays from Ray) too
    return os.getpid()


def release_memory_promptly() -> None:
    """With Arrow's jemalloc pool (``ARROW_DEFAULT_MEMORY_POOL=jemalloc``), return freed memory to the OS at once,
    so a round's peak is not carried into the next. The default pool here is mimalloc, which has no such knob:
    its pages go back at the end of a session's last tasks (runtime/memory.py ``task_memory``)."""
    import pyarrow as pa

    try:
        pa.jemalloc_set_decay_ms(0)
    except Exception:  # noqa: BLE001 - only the jemalloc pool has this knob
        pass


# how long the warm-up may hold a command before its first step: a joined cluster that another client keeps busy
# would otherwise hold it, silently, until every CPU was free at once (150 s in an adversarial run)
WARM_UP_WAIT_SECONDS = 10.0


def warm_up_workers() -> None:
    """Start one worker per CPU up front (part of starting Ray, not of any compaction's latency). Waited for at
    most WARM_UP_WAIT_SECONDS: on a busy cluster the rounds queue for CPUs anyway, and their progress says so."""
    import ray

    task = ray.remote(num_cpus=1)(_warm)
    refs = [task.remote() for _ in range(cluster_cpus())]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=WARM_UP_WAIT_SECONDS)
    ray.get(ready)  # a warm-up that failed says so now


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def cluster_memory() -> tuple[int, int]:
    """(heap memory, object store memory) of the cluster in bytes."""
    import ray

    res = ray.cluster_resources()
    return int(res.get("memory", 2 << 30)), int(res.get("object_store_memory", 1 << 30))


def flash_error_inside(exc: BaseException) -> "FlashError | None":
    """The FlashError a Ray task raised, however deeply Ray wrapped it (a task whose input task failed wraps the
    failure once more), or None when the failure is something else."""
    from flash_pipeline.errors import FlashError

    for _ in range(16):
        inner = getattr(exc, "cause", None)
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc if isinstance(exc, FlashError) else None


def cluster_failure(exc: BaseException, what: str) -> "ClusterFailure | None":
    """The one line for a failure of the Ray cluster itself under ``what`` (a raylet or node that died, an object
    lost, Ray's memory monitor killing a task), or None for anything else. A task's own exception arrives as
    RayTaskError and keeps its own report. Before, a dead raylet surfaced as "unexpected LocalRayletDiedError"
    with Ray's advice about raylet.out and no table named."""
    if "ray" not in sys.modules:
        return None
    from ray.exceptions import RayError, RayTaskError

    from flash_pipeline.errors import ClusterFailure

    if not isinstance(exc, RayError) or isinstance(exc, RayTaskError):
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
    return ClusterFailure(f"{what}: the Ray cluster failed under the compaction ({reason}); nothing of an unfinished "
                          "partition was committed: check the cluster (ray status), restart it if it is down, and run "
                          "the command again")


def request_cpus(cpus: int) -> None:
    """Ask a Ray cluster's autoscaler for CPUs (a no-op on clusters without one)."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(num_cpus=cpus)
    except Exception:  # noqa: BLE001 - only an autoscaling cluster can honour this
        pass
