"""Environment settings (FLASH_*): one parser for on/off switches and one for bounded numbers, so that every
bad value is the same kind of one-line error naming the variable, the accepted values and the default."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flash_pipeline.errors import FlashError

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def env_switch(name: str, default: bool, default_text: str) -> bool:
    """``name`` as on (1/true/yes/on) or off (0/false/no/off), any case; unset or empty: ``default``."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise FlashError(f"{name} must be 1 or 0 (on/off, true/false), not {raw!r}; unset it for the default "
                     f"({default_text})")


def env_number(name: str, default: float, low: float, high: float, what: str, default_text: str = "",
               whole: bool = False) -> float:
    """``name`` as a number from ``low`` to ``high`` (a whole number if ``whole``); unset or empty: ``default``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value: float = int(raw) if whole else float(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        hint = f"; unset it for the default ({default_text})" if default_text else ""
        raise FlashError(f"{name} must be {what}, not {raw!r}{hint}")
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """``name`` as one of ``choices``, any case; unset or empty: ``default``."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in choices:
        raise FlashError(f"{name} must be one of {', '.join(choices)}, not {raw!r}; unset it for the default "
                         f"({default})")
    return raw


def ray_num_cpus_setting() -> int | None:
    """FLASH_RAY_NUM_CPUS: the CPUs of a Ray this process starts (unset: the machine's)."""
    if not os.environ.get("FLASH_RAY_NUM_CPUS", "").strip():
        return None
    return int(env_number("FLASH_RAY_NUM_CPUS", 0, 1, 4096, "a whole number of CPUs from 1 to 4096",
                          "the machine's CPUs", whole=True))


def kernel_form() -> str:
    """FLASH_KERNELS: how the compiled kernels run (kernels/jit.py): auto (the default: small work as NumPy or
    Python without loading Numba), compiled (Numba from the first call), interpreted (never Numba, the kernels'
    Python source: slow, for checks) or numpy (never Numba, their NumPy forms where they have one)."""
    return env_choice("FLASH_KERNELS", ("auto", "compiled", "interpreted", "numpy"), "auto")


def sha_extensions_switch() -> bool:
    """FLASH_SHA_EXTENSIONS=off: digest keys with the portable SHA-1 kernel even on a CPU with the SHA
    extensions (kernels/sha1_ni.py); here, not there, so that a job checks it before importing Numba."""
    return env_switch("FLASH_SHA_EXTENSIONS", True, "on where the CPU has them")


def aot_kernels_switch() -> bool:
    """FLASH_AOT_KERNELS=off: never load or build the ahead-of-time compiled kernels (kernels/aot.py); every
    compiled call then goes through Numba as before."""
    return env_switch("FLASH_AOT_KERNELS", True, "on")


def aot_build_niceness() -> int:
    """FLASH_AOT_NICE: the niceness of a background build of the kernels (19, the lowest priority, by default)."""
    return int(env_number("FLASH_AOT_NICE", 19, 0, 19, "a whole number from 0 to 19", "19", whole=True))


def aot_kernels_dir() -> str | None:
    """FLASH_AOT_DIR: where the ahead-of-time compiled kernels are kept (None: the default of kernels/aot.py)."""
    return os.environ.get("FLASH_AOT_DIR") or None


# ----- the registry: every FLASH_* variable any layer reads, declared once ---------------------------------------
@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, kind of value, default (as text) and one-line meaning. Declared here
    once; ``docs/settings.md`` is generated from this table (``python -m flash_pipeline.settings``) and a test
    fails when code reads a variable not declared here (tests/test_settings.py)."""

    name: str
    kind: str
    default: str
    meaning: str
    layer: str = "engine"  # engine (flash_pipeline), dagster (assets, resources, sensors) or tests


SETTINGS: tuple[Setting, ...] = (
    # the lake and the engine
    Setting("FLASH_KERNELS", "auto|compiled|interpreted|numpy", "auto",
            "how the compiled kernels run: auto (small work as NumPy or Python without loading Numba), compiled, "
            "interpreted (checks only), numpy (NumPy forms where a kernel has one, else its Python source)"),
    Setting("FLASH_SHA_EXTENSIONS", "on|off", "on where the CPU has them",
            "off: digest keys with the portable SHA-1 kernel even on a CPU with the SHA extensions"),
    Setting("FLASH_AOT_KERNELS", "on|off", "on",
            "off: never load or build the kernels compiled ahead of time (a fresh process then loads Numba for "
            "large work, ~0.4 s of one core)"),
    Setting("FLASH_AOT_DIR", "path", "the kernels' __pycache__, else ~/.cache/flash-compactor/kernels",
            "where the kernels compiled ahead of time are kept (built in the background after a process used Numba)"),
    Setting("FLASH_AOT_NICE", "whole number (0-19)", "19",
            "the niceness of a background build of the kernels (on a machine whose cores are busy, a build at 19 "
            "may take many minutes)"),
    Setting("FLASH_EXECUTOR", "auto|in-process|ray", "auto",
            "where a compaction's steps run when the command does not say (auto: in process for small inputs, "
            "Ray for large)"),
    Setting("FLASH_IN_PROCESS_MAX_BYTES", "bytes", "per machine (docs/compaction.md)",
            "the input size up to which auto runs a compaction in process"),
    Setting("FLASH_RAY_ADDRESS", "Ray address", "unset (a local Ray)",
            "the Ray cluster compactions join (else Ray's RAY_ADDRESS, else one started here)"),
    Setting("FLASH_RAY_NUM_CPUS", "whole number", "the machine's CPUs", "CPUs of a Ray started by this process"),
    Setting("FLASH_RAY_CONNECT_TIMEOUT", "seconds (0.1-3600)", "as in cluster.py",
            "how long joining a Ray address may take before the command says it is unreachable"),
    Setting("FLASH_CALIBRATION_PATH", "path", "~/.cache/flash-compactor/calibration.json",
            "where the latency planner keeps this machine's calibration"),
    Setting("FLASH_PROGRESS_SECONDS", "seconds", "1",
            "progress lines (and bars) at most this often per step, none for a step that ends sooner"),
    Setting("FLASH_THP", "on|off", "off", "on: keep transparent huge pages in the processes that run a round's steps"),
    Setting("FLASH_MALLOC_REUSE", "on|off", "on",
            "off: do not reuse freed memory across a round's steps (runtime/memory.py)"),
    Setting("FLASH_MAX_REPLANS", "whole number (0-10000)", "as in catalog/commits.py",
            "how often a writer re-plans on a moved base before exiting 3"),
    Setting("FLASH_DV_MAX_DEAD_FRACTION", "fraction (0-1)", "catalog/deletion_vectors.py's MAX_DEAD_FRACTION",
            "with deletion vectors: the most dead rows a carried file may hold (the benchmark forces vectors with 1)"),
    Setting("FLASH_DELTA_LOG", "on|off", "on", "off: publish no Delta log for new compacted versions"),
    Setting("FLASH_ICEBERG", "on|off", "on", "off: publish no Iceberg snapshot for new compacted versions"),
    Setting("FLASH_ICEBERG_CATALOG", "JSON object of pyiceberg catalog properties, or a catalog name", "unset",
            "also register every Iceberg snapshot in this catalog (REST, Glue, SQL...; docs/catalog-layout.md)"),
    Setting("FLASH_FSYNC", "on|off", "off",
            "on: fsync every compacted data, index and round-state file of a local lake before its commit"),
    Setting("FLASH_READ_AHEAD", "whole number (0-64)", "per storage (docs/compaction.md)",
            "reads a command keeps in flight side by side (object stores)"),
    Setting("FLASH_S3_ENDPOINT_URL", "URL", "unset (AWS)", "the S3 endpoint of s3:// lakes (else AWS_ENDPOINT_URL)"),
    Setting("FLASH_S3_RETRY_MODE", "standard|adaptive|legacy", "standard", "botocore's retry mode (--s3-retry-mode)"),
    Setting("FLASH_S3_MAX_ATTEMPTS", "whole number", "5", "botocore's attempts per call (--s3-max-attempts)"),
    Setting("FLASH_S3_CONNECT_TIMEOUT", "seconds", "5", "connect timeout of an S3 call (--s3-connect-timeout)"),
    Setting("FLASH_S3_READ_TIMEOUT", "seconds", "30", "read timeout of an S3 call (--s3-read-timeout)"),
    Setting("FLASH_S3_RETRY_DEADLINE", "seconds", "120",
            "outer retries of a failing S3 call until this long after its first try (--s3-retry-deadline)"),
    Setting("FLASH_SNS_ENDPOINT_URL", "URL", "unset (AWS)",
            "the SNS endpoint of compaction events (else AWS_ENDPOINT_URL)"),
    Setting("FLASH_DEBUG", "1", "unset", "print the traceback of an unexpected error besides its one line"),
    Setting("FLASH_LAKE", "directory or s3://bucket/prefix", "./demo_lake",
            "the lake of flash-compactor dev and the Dagster project"),
    # the Dagster layer
    Setting("FLASH_TABLES", "path", "tables.yaml", "the table configuration of the Dagster project", "dagster"),
    Setting("FLASH_SENSORS", "0", "unset (sensors running)", "0: the sensors start stopped", "dagster"),
    Setting("FLASH_DEMO_LOADS", "0", "unset (the load schedule running)",
            "0: the demo's PySpark load schedule starts stopped", "dagster"),
    Setting("FLASH_LOAD_CRON", "cron", "*/3 * * * *", "the demo load schedule's cron", "dagster"),
    Setting("FLASH_RECONCILE_SECONDS", "seconds", "21600",
            "how often the new-delta sensor compares every partition with its state", "dagster"),
    Setting("FLASH_RECONCILE_BATCH", "whole number", "200", "partitions a sensor tick reconciles at most", "dagster"),
    Setting("FLASH_SPARK_MASTER", "Spark master", "local[2]", "the Spark master of the loads", "dagster"),
    Setting("FLASH_SPARK_DRIVER_MEMORY", "Spark size", "1g", "the Spark driver's memory of the loads", "dagster"),
    Setting("FLASH_SPARK_LOG_LEVEL", "Spark level", "ERROR", "the Spark driver's log level", "dagster"),
    Setting("FLASH_SQS_QUEUE_URL", "URL", "unset", "the SQS queue of the dispatch sensor", "dagster"),
    Setting("FLASH_SQS_DLQ_URL", "URL", "unset", "its dead-letter queue", "dagster"),
    Setting("FLASH_SQS_ENDPOINT_URL", "URL", "unset (AWS)", "the SQS endpoint", "dagster"),
    # fault injection, for the resilience tests only
    Setting("FLASH_CRASH_AT", "a crash point", "unset",
            "tests only: the process that reaches this point (flash_pipeline/faults.py) is killed", "tests"),
    Setting("FLASH_CRASH_MARKER", "path", "unset", "tests only: a file that makes a worker crash happen once", "tests"),
    Setting("FLASH_CRASH_SIGNAL", "INT|TERM", "KILL", "tests only: the signal of the crash", "tests"),
)
DECLARED = {s.name: s for s in SETTINGS}


def settings_markdown() -> str:
    """docs/settings.md: the table of every setting, generated from :data:`SETTINGS`."""
    lines = ["# Settings (`FLASH_*` environment variables)", "",
             "Generated from `flash_pipeline/settings.py` "
             "(`python -m flash_pipeline.settings > docs/settings.md`); a test",
             "fails when the code reads a variable that is not declared there, or when this page is out of date.", ""]
    for layer, title in (("engine", "The engine and the commands"), ("dagster", "The Dagster layer"),
                         ("tests", "Fault injection (tests only)")):
        lines += [f"## {title}", "", "| variable | value | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{s.name}` | {s.kind} | {s.default} | {s.meaning} |" for s in SETTINGS if s.layer == layer]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_markdown(), end="")
