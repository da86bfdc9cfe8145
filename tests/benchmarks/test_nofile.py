"""benchmarks.nofile: the command runs under the limit, and nothing of Python runs in a forked child."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.nofile import under_nofile


def test_the_command_runs_under_the_limit():
    probe = [sys.executable, "-c", "import resource; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"]
    assert (
        subprocess.run(under_nofile(probe, 300), capture_output=True, text=True).stdout.split() == ["300"] * 2
    )
    assert under_nofile(probe, None) == probe
