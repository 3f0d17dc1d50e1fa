"""Environment settings (FLASH_*): one parser for on/off switches and one for bounded numbers, so that every
bad value is the same kind of one-line error naming the variable, the accepted values and the default."""

from __future__ import annotations

import os

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
    raise FlashError(f"{name} must be 1 or 0 (on/off, true/false), not {raw!r}; unset it for the default ({default_text})")


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
        raise FlashError(f"{name} must be one of {', '.join(choices)}, not {raw!r}; unset it for the default ({default})")
    return raw


def kernel_form() -> str:
    """FLASH_KERNELS: how the compiled kernels run (kernels/jit.py): auto (the default: a few rows as Python
    without loading Numba), compiled (Numba from the first call) or interpreted (never Numba: slow, for checks)."""
    return env_choice("FLASH_KERNELS", ("auto", "compiled", "interpreted"), "auto")


def sha_extensions_switch() -> bool:
    """FLASH_SHA_EXTENSIONS=off: digest keys with the portable SHA-1 kernel even on a CPU with the SHA
    extensions (kernels/sha1_ni.py); here, not there, so that a job checks it before importing Numba."""
    return env_switch("FLASH_SHA_EXTENSIONS", True, "on where the CPU has them")
