"""Run a piece of a test as an unprivileged user, so that file permissions apply to it.

Root reads and writes any file whatever its mode (CAP_DAC_OVERRIDE), so a test of "the file
is unreadable" or "the folder is read-only" proves nothing when run as root, as CI is. Here
the piece runs in a forked child that first enters a new user namespace: it keeps its user id
on the files (it still owns tmp_path and can reach it through pytest's 0700 folders) but
holds no capability over them, so the mode bits are enforced as for any user. Run by an
ordinary user, the child just runs the piece.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

CLONE_NEWUSER = 0x10000000


def _drop_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWUSER): {os.strerror(err)}")


def can_drop_privileges() -> bool:
    """Whether `unprivileged` can make file permissions real here (ordinary user, or root
    with user namespaces allowed)."""
    if os.geteuid() != 0:
        return True
    try:
        return run_unprivileged(lambda: True)
    except OSError:
        return False


def run_unprivileged(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a forked child without privileges over files; its result, or its
    exception raised again here (with the child's traceback in the message)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            if os.geteuid() == 0:
                _drop_privileges()
            outcome = ("ok", fn(*args))
        except BaseException as e:  # reported to the parent, which raises it
            outcome = ("error", (e, traceback.format_exc()))
        try:
            payload = pickle.dumps(outcome)
        except Exception:  # pytest's outcomes (pytest.fail, a failed raises) do not pickle
            e, tb = outcome[1] if outcome[0] == "error" else (None, "")
            message = f"{type(e).__name__}: {e}" if e is not None else "unpicklable result"
            payload = pickle.dumps(("error", (AssertionError(message), tb)))
        with os.fdopen(write_end, "wb") as f:
            f.write(payload)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        payload = f.read()
    _, status = os.waitpid(pid, 0)
    if not payload:
        raise RuntimeError(f"the unprivileged child died (wait status {status})")
    kind, value = pickle.loads(payload)
    if kind == "ok":
        return value
    exc, tb = value
    exc.add_note(f"in the unprivileged child:\n{tb}")
    raise exc
