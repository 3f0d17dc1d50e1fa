"""Start or join Ray: local by default, an existing cluster when an address is configured."""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()


def ensure_ray(num_cpus: int | None = None, address: str | None = None) -> Any:
    """Initialise Ray once per process. ``address`` (or FLASH_RAY_ADDRESS) joins a running cluster."""
    import ray

    with _lock:
        if ray.is_initialized():
            return ray
        address = address or os.environ.get("FLASH_RAY_ADDRESS")
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": True, "namespace": "flash-compactor"}
        if address:
            ray.init(address=address, **kwargs)
        else:
            if num_cpus is None and os.environ.get("FLASH_RAY_NUM_CPUS"):
                num_cpus = int(os.environ["FLASH_RAY_NUM_CPUS"])
            ray.init(num_cpus=num_cpus, include_dashboard=False, **kwargs)
        return ray


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def cluster_memory() -> tuple[int, int]:
    """(heap memory, object store memory) of the cluster in bytes."""
    import ray

    res = ray.cluster_resources()
    return int(res.get("memory", 2 << 30)), int(res.get("object_store_memory", 1 << 30))
