"""A server command run under an open-file limit (`ulimit -n`): a fresh interpreter sets it, then execs
the command. Not subprocess's preexec_fn: that forks the caller and runs Python in the child, and a
caller holding gRPC's poller thread (a test process that has used a gRPC client) saw the child abort
in gRPC's fork handler ("epoll_wait error: Bad file descriptor") before the exec."""

from __future__ import annotations

import sys

SHIM = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execvp(sys.argv[2], sys.argv[2:])"
)


def under_nofile(command: list[str], nofile: int | None) -> list[str]:
    """`command` with its open-file limit at `nofile` (None: unchanged)."""
    return list(command) if nofile is None else [sys.executable, "-c", SHIM, str(nofile), *command]
