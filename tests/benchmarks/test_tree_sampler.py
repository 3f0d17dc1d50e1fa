"""The benchmark's memory sampler (benchmarks/measure.py TreeSampler) on a process tree whose pages are shared: a
parent that filled 192 MiB, then forked a child that keeps them (copy-on-write, never written). The summed RSS
counts those pages twice; the summed PSS, once. This is the difference between the two peak columns of
benchmarks/results.md for Ray's tree of processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

psutil = pytest.importorskip("psutil")

from benchmarks.measure import TreeSampler  # noqa: E402

SHARED = r"""
import os, sys, time
block = bytearray(192 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1  # every page resident
if os.fork() == 0:
    time.sleep(3)
    os._exit(0)
print("forked", flush=True)
os.wait()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PSS is read from /proc/PID/smaps_rollup")
def test_tree_sampler_counts_a_shared_page_once_by_pss_and_once_per_process_by_rss() -> None:
    MiB = 2**20
    proc = subprocess.Popen([sys.executable, "-c", SHARED], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "forked"
    with TreeSampler(proc.pid, interval=0.05, pss_every=2) as sampler:
        time.sleep(1.0)
    proc.wait(timeout=30)
    rss, pss = sampler.peak(), sampler.peak_pss()
    assert pss is not None and len(sampler.pss_samples) >= 3
    assert max(count for _, _, count in sampler.samples) == 2
    assert rss >= 2 * 192 * MiB, rss  # the shared block, once per process
    assert 192 * MiB <= pss <= 192 * MiB + (rss - 2 * 192 * MiB) + 16 * MiB, (pss, rss)  # once in all
    assert sampler.pss_before(time.time()) is not None


def test_timed_runs_sample_rss_only() -> None:
    """The default sampler (a timed run's) never reads PSS: it stalls a multi-process engine (TreeSampler)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    with TreeSampler(proc.pid, interval=0.05) as sampler:
        proc.wait(timeout=30)
    assert len(sampler.samples) >= 3 and sampler.samples[0][1] > 0
    assert sampler.pss_samples == [] and sampler.peak_pss() is None
