"""The walls around a candidate's process: no network, writes only under its scratch folder, no
secrets in its environment, bounded CPU time and memory, and every process it starts ending
with it.

A candidate's process is started in two steps (`core.evaluate.zygote`): a relay process takes
new namespaces (`enter_namespaces`: a network namespace with only a loopback that is down, and a
PID namespace; a user namespace first when not root) and forks the candidate's process, which
is PID 1 of the new PID namespace: when it ends, the kernel kills every process left in it,
those that made new sessions or process groups too. The candidate's process then confines itself
(`confine`) before it imports the candidate: resource limits, Landlock (writes beneath the
scratch folder only, no TCP, no signals to processes outside, no abstract Unix sockets outside),
no new privileges, and a seccomp filter that refuses it new Unix sockets. Landlock is a Linux
security module (5.13+; TCP rules 6.7+, scoping 6.12+); without it the sandbox cannot be built
and the evaluator says so.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from core.runtime.errors import KilnInputError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x10000000, 0x20000000, 0x40000000)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000

# Landlock's filesystem rights that change the file system (the rights to read and execute
# are left alone: Python, Triton's compiler and CUDA read and run files all over the disk).
FS_WRITE_FILE, FS_REMOVE_DIR, FS_REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
FS_MAKE = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_RIGHTS = FS_WRITE_FILE | FS_TRUNCATE  # the rights a rule on a single file may hold

# Environment variables a judging process keeps: how to find programs, libraries and the GPU,
# and the settings of torch and Triton. Everything else (API keys, tokens, cloud credentials)
# stays with the optimizer.
ENV_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                       "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "VIRTUAL_ENV",
                       "LD_LIBRARY_PATH", "CC", "CXX", "TERM"})
ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TRITON_", "TORCH_", "NCCL_", "NVSHMEM_", "OMP_",
                "MKL_", "KILN_")
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


class SandboxError(RuntimeError):
    """The sandbox could not be built on this machine."""


def scrubbed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with only the variables a judging process needs, and none that looks secret."""
    return {name: value for name, value in environ.items()
            if (name in ENV_NAMES or name.startswith(ENV_PREFIXES))
            and not SECRET_NAME.search(name)}


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    version = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(version))


def require_sandbox() -> None:
    """Refuse to judge where the candidate's process cannot be walled in."""
    if landlock_abi() < 1:
        raise KilnInputError(
            "this machine's kernel has no Landlock, which the evaluator's sandbox needs to keep "
            "a candidate's writes in its scratch folder",
            "judge on Linux 5.13 or later with Landlock enabled (CONFIG_SECURITY_LANDLOCK, "
            "'landlock' in the lsm= boot parameter)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _check(result: int, doing: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"{doing} failed: {os.strerror(errno)} (errno {errno})")
    return result


def _handled_rights(abi: int) -> tuple[int, int, int, int]:
    """(filesystem rights, network rights, scopes, size of the ruleset struct) for this ABI."""
    fs = FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE
    fs |= FS_REFER if abi >= 2 else 0
    fs |= FS_TRUNCATE if abi >= 3 else 0
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    return fs, net, scoped, size


def restrict_writes(writable: Iterable[Path], tcp: bool = False) -> None:
    """Landlock for this process and its children: writes only beneath `writable` (folders, or
    single files such as /dev/null), no TCP at all (unless `tcp`), no signals or abstract Unix
    sockets beyond this process's own domain. Irreversible."""
    abi = landlock_abi()
    if abi < 1:
        raise SandboxError("Landlock is not available in this kernel")
    fs, net, scoped, size = _handled_rights(abi)
    if tcp:
        net, scoped = 0, 0
    attr = _RulesetAttr(fs, net, scoped)
    ruleset = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                                   ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        for path in writable:
            if not path.exists():
                continue
            rights = fs if path.is_dir() else fs & FILE_RIGHTS
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(rights, fd)
                _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                     ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                                     ctypes.byref(rule), ctypes.c_uint32(0)),
                       f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                             ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _write_proc(path: str, text: str) -> None:
    with open(path, "w") as handle:  # noqa: PTH123 - /proc files, written once
        handle.write(text)


def enter_namespaces() -> None:
    """A network namespace of its own for this process (only a loopback, down), and a PID
    namespace for its next child; a user namespace first when it is not root, mapping its
    own ids, so that the child may make PID namespaces in turn (`PidNamespaces`)."""
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET | CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare (network and PID namespaces)")
    if uid != 0:
        _write_proc("/proc/self/setgroups", "deny")
        _write_proc("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_proc("/proc/self/gid_map", f"{gid} {gid} 1")


def mount_own_proc() -> None:
    """A /proc of this process's own PID namespace, in a mount namespace of its own. In a PID
    namespace under the parent's /proc, /proc/<getpid()> names another process, and CUDA's
    driver, which looks itself up there, does not start (error 304, "OS call failed")."""
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare (mount namespace)")
    _check(_libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None),
           "mount (/ private to this namespace)")
    _check(_libc.mount(b"proc", b"/proc", b"proc",
                       ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), None),
           "mount (a /proc of its own PID namespace)")


class PidNamespaces:
    """A new PID namespace for each child: `before_fork` makes one for the next child, and
    `after_fork` sets this process's children back into its own (a process may make a PID
    namespace again only once its children's is its own)."""

    def __init__(self) -> None:
        self.own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def before_fork(self) -> None:
        _check(_libc.unshare(ctypes.c_int(CLONE_NEWPID)), "unshare (PID namespace)")

    def after_fork(self) -> None:
        _check(_libc.setns(ctypes.c_int(self.own), ctypes.c_int(CLONE_NEWPID)),
               "setns (back to its own PID namespace)")


def die_with_parent() -> None:
    """SIGKILL for this process when the thread that forked it ends."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")


def become_subreaper() -> None:
    """Orphaned descendants of this process become its children, not init's."""
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")


@dataclass(frozen=True)
class Limits:
    """What a candidate's process may use. `memory_bytes`: beyond what it holds when it starts;
    on the CPU its address space (RLIMIT_AS), on CUDA its heap (RLIMIT_DATA: CUDA reserves more
    address space than any limit could allow) and its device memory (the caching allocator's
    share of the device)."""

    cpu_seconds: float
    memory_bytes: int
    device_memory_bytes: int | None = None


def _current_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def apply_limits(limits: Limits, device: str) -> None:
    """Resource limits for this process: CPU seconds (SIGKILL at the limit), memory, no core
    files."""
    seconds = max(1, int(limits.cpu_seconds + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if device == "cpu":
        cap = _current_bytes("VmSize") + limits.memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    else:
        cap = _current_bytes("VmData") + limits.memory_bytes
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


# seccomp: the architectures whose socket(2) is refused Unix sockets, and the BPF it takes.
SOCKET_SYSCALLS = {0xC000003E: 41, 0xC00000B7: 198}  # AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64
X32_SYSCALL_BIT = 0x40000000
AF_UNIX = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
LOAD, JUMP_EQUAL, JUMP_AT_LEAST, RETURN = 0x20, 0x15, 0x35, 0x06
SECCOMP_ALLOW, SECCOMP_EACCES = 0x7FFF0000, 0x00050000 | 13


def refuse_unix_sockets() -> None:
    """No new Unix socket for this process and its children: a network namespace leaves
    sockets bound to a path in the file system (a container runtime's, a Ray node's) within
    reach, and Landlock does not govern connecting to them. The candidate's own socket to the
    judge is made before; socketpair(2) stays allowed, since a pair reaches nothing else.
    Needs no_new_privs (`restrict_writes` sets it). Irreversible."""
    block = 7
    allow = block * len(SOCKET_SYSCALLS)
    deny = allow + 1
    program: list[tuple[int, int, int, int]] = []  # (code, jump if true, if false, k)
    for arch, number in SOCKET_SYSCALLS.items():
        at = len(program)
        program += [
            (LOAD, 0, 0, 4),  # the architecture: another one goes on to the next block
            (JUMP_EQUAL, 0, block - 2, arch),
            (LOAD, 0, 0, 0),  # the syscall's number: x32's are refused outright
            (JUMP_AT_LEAST, deny - (at + 4), 0, X32_SYSCALL_BIT),
            (JUMP_EQUAL, 0, allow - (at + 5), number),
            (LOAD, 0, 0, 16),  # socket's first argument, the domain
            (JUMP_EQUAL, deny - (at + 7), allow - (at + 7), AF_UNIX),
        ]
    program += [(RETURN, 0, 0, SECCOMP_ALLOW), (RETURN, 0, 0, SECCOMP_EACCES)]
    filters = (_SockFilter * len(program))(*[_SockFilter(*i) for i in program])
    fprog = _SockFprog(len(program), filters)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
           "seccomp (no Unix sockets)")


def device_paths(device: str) -> list[Path]:
    """Files outside the scratch folder a candidate's process must be able to open for writing:
    /dev/null, and on CUDA the GPU's device files and /dev/shm (CUDA IPC's reference counts)."""
    paths = [Path("/dev/null"), Path("/dev/zero")]
    if device == "cuda":
        paths += sorted(Path("/dev").glob("nvidia*")) + [Path("/dev/shm")]
    return paths


def confine(scratch: Path, device: str, limits: Limits) -> None:
    """Everything but the namespaces, for the candidate's own process, before it imports the
    candidate: limits, then Landlock."""
    apply_limits(limits, device)
    restrict_writes([scratch, *device_paths(device)])
    refuse_unix_sockets()
