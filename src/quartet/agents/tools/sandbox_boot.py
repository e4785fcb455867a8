"""The child side of the Python tool's sandbox: run as a script, `python -I sandbox_boot.py CONFIG_JSON`.

Started by `quartet.agents.tools.sandbox` (whose docstring says what each mode holds); standard library
only, since inside bwrap it is the only file of the project the sandbox can see. Three processes, all in
the session the host started, so that one `killpg` from the host reaches them:

    outer   isolated (inside bwrap): on a root host, empty the bounding set and become the run's fresh
            uid; unisolated: unshare(network + PID namespaces, and a user namespace when not root) when
            allowed, and as root change to the fresh uid (keeping fsuid 0); then in both the resource
            limits and the seccomp filter (no execve, no sockets but AF_UNIX, no io_uring); fork:
    init    PID 1 of the PID namespace (or, without one, a child subreaper): starts the program,
            enforces the wall-clock limit, reaps, kills every process left, reports;
    program in a process group of its own; installs the audit-hook guard and runs `main.py` as __main__.

Why the uid change. RLIMIT_NPROC is checked against the real uid's process count and never applies to
root (uid 0 is exempt even inside a user namespace), so a root host's program gets a uid no one else uses.
Inside bwrap the change is complete: the mounts are made, and every file the program needs is readable
by anyone. Unisolated, the filesystem uid stays 0 so the interpreter loads even from a root-only directory;
without capabilities that is a file owner's access to root's files, with no override (a known gap).

The seccomp filter and the audit hook are defence in depth inside the boundary and the whole guard
without it: the hook answers ordinary Python (`socket`, `subprocess`) with a readable refusal, the filter
holds against native code that never calls the hook. Without a PID namespace init is a child subreaper:
orphans re-parent to it, even ones that called setsid(), and after the program ends it kills the
program's group, then every child it still has, until none is left. Status goes to the host as JSON lines
over a pipe (fd in the config); the program's process closes its copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CAP_VERSION_3 = 0x20080522
_CAP_SETGID = 6
_CAP_SETUID = 7
_AF_UNIX = 1

NETWORK_REFUSED = "network access is disabled in this sandbox"
SPAWN_REFUSED = "running other programs is disabled in this sandbox"
KILL_REFUSED = "signals to processes outside this program are disabled in this sandbox"
PROCESS_LIMIT = "process limit reached"
_SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile", "pty.spawn"}
)

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _Deadline(Exception):
    pass


def _report(fd: int, **fields: Any) -> None:
    os.write(fd, (json.dumps(fields) + "\n").encode())


def _capset(bits: int) -> bool:
    """Set the effective and permitted capabilities to `bits` (inheritable none); whether it worked."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = bits & 0xFFFFFFFF
    data[1].effective = data[1].permitted = bits >> 32
    return bool(_libc.capset(ctypes.byref(header), data) == 0)


def _drop_root(uid: int) -> bool:
    """Become `uid` for process accounting and signals, keep root's file access, hold no capability.

    RLIMIT_NPROC counts the real uid's processes and exempts root, so the program needs a real uid of its
    own; file access goes by the filesystem uid, kept at 0 so the interpreter (maybe under /root) still
    loads. Without capabilities a fsuid of 0 only has owner rights on root's files (no override), and the
    emptied bounding set means no later exec regains any. False if not permitted (no CAP_SETUID).
    """
    setuid_bits = (1 << _CAP_SETGID) | (1 << _CAP_SETUID)
    try:
        _libc.prctl(_PR_SET_KEEPCAPS, 1)
        for cap in range(64):
            _libc.prctl(_PR_CAPBSET_DROP, cap)  # fails quietly past the kernel's last capability
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # KEEPCAPS: permitted capabilities survive, effective ones go
    except OSError:
        return False
    ok = _capset(setuid_bits)
    _libc.setfsuid(0)
    _libc.setfsgid(0)
    if not _capset(0):  # fail closed: never run the program with capabilities left
        raise SystemExit("sandbox: cannot drop capabilities")
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    return ok and os.getresuid() == (uid, uid, uid)


def _become(uid: int) -> None:
    """Inside bwrap as root: empty the bounding set, become `uid` entirely (no capability left), or exit.

    bwrap kept CAP_SETPCAP, CAP_SETUID and CAP_SETGID for this alone; changing every uid away from 0
    clears the permitted, effective and ambient sets.
    """
    for cap in range(64):
        _libc.prctl(_PR_CAPBSET_DROP, cap)  # fails quietly past the kernel's last capability
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if not _capset(0) or os.getresuid() != (uid, uid, uid):  # fail closed
        raise SystemExit("sandbox: cannot drop root")


def _isolate(cfg: dict[str, Any]) -> tuple[bool, bool]:
    """Namespaces and the program's identity; (namespaces in force, RLIMIT_NPROC in force)."""
    root = os.geteuid() == 0
    processes = int(cfg["max_processes"]) + 3  # outer, init (and bwrap's init in its user namespace)
    if cfg["isolated"]:  # inside bwrap: namespaces are built; a root host's run still needs its own uid
        if root:
            _become(int(cfg["uid"]))
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        return True, True
    flags = _CLONE_NEWNET | _CLONE_NEWPID | (0 if root else _CLONE_NEWUSER)  # root needs no user namespace
    namespaces = bool(cfg["namespaces"]) and _libc.unshare(flags) == 0
    if root:
        nproc = _drop_root(int(cfg["uid"]))  # a fresh uid: a process count of its own
    else:  # a user namespace has its own count; outside one, the user's existing tasks count
        nproc = True
        processes += 0 if namespaces else _user_tasks(os.getuid())
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    return namespaces, nproc


def _user_tasks(uid: int) -> int:
    """Tasks (threads) owned by `uid`: what RLIMIT_NPROC counts in the initial user namespace."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue
    return count


def _set_limits(cfg: dict[str, Any]) -> None:
    cpu = int(cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL a second later
    memory = int(cfg["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(cfg["file_bytes"]),) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def list_processes() -> list[tuple[int, int, str, int]]:
    """(pid, parent pid, state letter, owner uid) of every process in /proc; vanished ones skipped."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                owner = os.stat(f"/proc/{name}").st_uid
            except OSError:
                continue
            found.append((int(name), int(fields[1]), fields[0], owner))
    return found


def _kill_all(pgid: int) -> None:
    """Kill the program's group and, repeatedly, every child of this process until none is left."""
    signal.setitimer(signal.ITIMER_REAL, 5.0)  # never hang here; the host's kill is the backstop
    try:
        while True:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)  # atomic against fork: no child of the group escapes it
            for pid in [p for p, parent, _, _ in list_processes() if parent == os.getpid()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.waitpid(-1, 0)
    except (ChildProcessError, _Deadline):
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# Syscall numbers: execve, execveat, socket, clone, unshare, setns, ptrace (clone3 and io_uring_setup are
# 435 and 425 on both).
_SYSCALLS = {
    "x86_64": (0xC000003E, 59, 322, 41, 56, 272, 308, 101),
    "aarch64": (0xC00000B7, 221, 281, 198, 220, 97, 268, 117),
}
_CLONE_NEW_ANY = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET


def _seccomp_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """A classic BPF program for the program's processes; None off x86-64 and aarch64.

    Refused (EPERM): execve/execveat (no other program), socket() of any family but AF_UNIX and io_uring
    (which can open sockets too): what native code (ctypes) could use to pass the audit hook; and unshare,
    setns, clone with a namespace flag and ptrace: new namespaces are kernel attack surface, and ptrace
    would reach the boot's own processes. clone3 answers ENOSYS (its flags are behind a pointer), so libc
    falls back to clone. Hand-written because it is ~25 instructions and this script must stay
    standard-library only (libseccomp's bindings are not a wheel).
    """
    if machine not in _SYSCALLS:
        return None
    arch, execve, execveat, sock, clone, unshare, setns, ptrace = _SYSCALLS[machine]
    ld = 0x20  # BPF_LD|W|ABS
    jeq = 0x15  # BPF_JMP|JEQ|K
    jge = 0x35  # BPF_JMP|JGE|K
    ret = 0x06  # BPF_RET|K
    and_ = 0x54  # BPF_ALU|AND|K
    returns = {"allow": 0x7FFF0000, "refuse": 0x00050000 | errno.EPERM, "nosys": 0x00050000 | errno.ENOSYS}
    code: list[tuple[int, str | int, str | int, int] | str] = [
        (ld, 0, 0, 4),  # the syscall's architecture
        (jeq, 0, "kill", arch),
        (ld, 0, 0, 0),  # the syscall number
        (jge, "refuse", 0, 0x40000000),  # x32 numbers
        *[(jeq, "refuse", 0, nr) for nr in (execve, execveat, 425, unshare, setns, ptrace)],
        (jeq, "nosys", 0, 435),  # clone3
        (jeq, "socket", 0, sock),
        (jeq, "clone", "allow", clone),
        "socket",
        (ld, 0, 0, 16),  # the first argument's low 32 bits: the family
        (jeq, "allow", "refuse", _AF_UNIX),
        "clone",
        (ld, 0, 0, 16),  # the first argument's low 32 bits: the flags
        (and_, 0, 0, _CLONE_NEW_ANY),
        (jeq, "allow", "refuse", 0),
        "kill",
        (ret, 0, 0, 0x80000000),  # another ABI: kill the process
        *[item for name, value in returns.items() for item in (name, (ret, 0, 0, value))],
    ]
    labels: dict[str, int] = {}
    for item in code:
        if isinstance(item, str):
            labels[item] = sum(1 for i in code[: code.index(item)] if not isinstance(i, str))
    program: list[tuple[int, int, int, int]] = []
    for item in code:
        if isinstance(item, str):
            continue
        op, jt, jf, k = item
        here = len(program) + 1  # jumps count from the next instruction
        program.append((
            op,
            labels[jt] - here if isinstance(jt, str) else jt,
            labels[jf] - here if isinstance(jf, str) else jf,
            k,
        ))  # fmt: skip
    return program


def _install_seccomp() -> bool:
    """Load the filter into this process (children inherit it); whether it is in force."""
    program = _seccomp_filter(os.uname().machine)
    if program is None:
        return False
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    filters = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
    fprog = _SockFprog(len(program), filters)
    return bool(_libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0)


def _fork_budget(count: int) -> int:
    """A pipe holding `count` tokens: each fork takes one (atomic across processes), none come back."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"x" * max(count, 0))
    os.close(write_end)
    os.set_blocking(read_end, False)
    return read_end


def _install_guard(tokens: int | None, limit: int) -> None:
    def guard(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith("socket."):
            if event == "socket.__new__" and args[1] == _AF_UNIX:
                return  # socketpair(), e.g. asyncio's self-pipe; connect/bind stay refused below
            raise PermissionError(NETWORK_REFUSED)
        if event in _SPAWN_EVENTS:
            raise PermissionError(SPAWN_REFUSED)
        if event in ("os.fork", "os.forkpty") and tokens is not None:
            try:
                taken = os.read(tokens, 1)
            except BlockingIOError:
                taken = b""
            if not taken:
                raise BlockingIOError(errno.EAGAIN, f"{PROCESS_LIMIT} (at most {limit} processes)")
        if event in ("os.kill", "os.killpg"):
            target = int(args[0])
            group = event == "os.killpg" or target < 0
            allowed = abs(target) in (0, os.getpgrp()) if group else _same_group(target)
            if not allowed or target == -1:
                raise PermissionError(KILL_REFUSED)

    sys.addaudithook(guard)


def _same_group(pid: int) -> bool:
    """Whether `pid` is in the program's process group (a vanished pid passes: kill() reports it)."""
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return True


def _run_program(cfg: dict[str, Any], nproc: bool) -> None:
    """Run the program's file as __main__ under the guard; exit with its status.

    The fork budget stands in for RLIMIT_NPROC where that is not in force (a root host that could not
    change uid); it caps forks made in all, the kernel limit caps processes alive at once.
    """
    path = str(cfg["code_path"])
    with open(path, encoding="utf-8") as f:
        source = f.read()
    limit = int(cfg["max_processes"])
    _install_guard(None if nproc else _fork_budget(limit - 1), limit)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.argv = [path]
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(compile(source, path, "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:
        namespace.clear()  # free what the program held: after a MemoryError printing needs memory too
        try:
            traceback.print_exception(
                type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None
            )
        except MemoryError:
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode())
        sys.exit(1)
    sys.exit(0)


def _wait_for_program(program: int, deadline: float) -> tuple[int, Any] | None:
    """Reap exited children (orphans too) until the program exits; its (wait status, resource usage), or
    None when `deadline` (monotonic) passes first. Needs SIGCHLD blocked: it sleeps in sigtimedwait."""
    while True:
        while True:  # everything that exited so far: one pending SIGCHLD may stand for several
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return None  # not reached while the program is unreaped
            if pid == 0:
                break
            if pid == program:
                return status, usage
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        signal.sigtimedwait([signal.SIGCHLD], remaining)


def _init(cfg: dict[str, Any], namespaces: bool) -> None:
    """Start the program, wait for it within the wall-clock limit, clean up, report, exit.

    Returns only in the forked program's process, which then runs the program.
    """
    status_fd = int(cfg["status_fd"])
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    # SIGCHLD stays pending (blocked) so the wait below sleeps on it with a timeout: a deadline raised as an
    # exception could land between a wait that reaped the program and the line that keeps its status.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    program = os.fork()
    if program == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.close(status_fd)
        _libc.prctl(_PR_SET_DUMPABLE, 1)  # its own processes may read each other's /proc files
        os.setpgid(0, 0)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        return
    with contextlib.suppress(OSError):  # the child sets it too; whichever runs first wins the race
        os.setpgid(program, program)
    _report(status_fd, program_pid=program)

    def on_alarm(signum: int, frame: object) -> None:
        raise _Deadline

    signal.signal(signal.SIGALRM, on_alarm)  # for _kill_all's bound
    ended = _wait_for_program(program, time.monotonic() + float(cfg["wall_s"]))
    wall_limit = ended is None
    if ended is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(program, signal.SIGKILL)
        _, status, usage = os.wait4(program, 0)
        ended = (status, usage)
    if not namespaces:  # with namespaces the kernel kills the rest when this PID 1 exits
        _kill_all(program)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(program, signal.SIGKILL)
    status, usage = ended
    _report(
        status_fd,
        exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        cpu_s=usage.ru_utime + usage.ru_stime,
        wall_limit=wall_limit,
    )
    os._exit(0)


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    namespaces, nproc = _isolate(cfg)
    _set_limits(cfg)
    seccomp = _install_seccomp()  # inherited by init and the program
    _report(int(cfg["status_fd"]), namespaces=namespaces, nproc_limit=nproc, seccomp=seccomp)
    # Not dumpable (this process and init): the program, of the same uid, cannot open their /proc files,
    # e.g. the status pipe's fd; the program's process sets itself dumpable again.
    _libc.prctl(_PR_SET_DUMPABLE, 0)
    if os.fork() == 0:  # with namespaces: PID 1 of the new PID namespace
        _init(cfg, namespaces)
        _run_program(cfg, nproc)  # only the program's process gets here
    else:
        os.wait()


if __name__ == "__main__":
    main()
