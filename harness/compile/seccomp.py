"""A seccomp filter that takes the file system and the network from a process, for good.

Where the kernel has no Landlock (an older kernel, one built without it, gVisor, a Firecracker
guest kernel), the compile worker still must not open a file: the filter makes every system call
that names a path (``openat``, ``stat``, ``readlink``, ``execve`` ...), opens a socket, reads
another process (``ptrace``, ``process_vm_readv``) or could do any of that indirectly
(``io_uring``) fail with ``EACCES``, and so does every system call newer than this table (a
future ``openat3`` is refused, not allowed). ``newfstatat`` / ``statx`` with ``AT_EMPTY_PATH``
(glibc's ``fstat`` of an open descriptor) stay allowed. Seccomp filters work in containers where
user namespaces are off (Docker's default profile) and in gVisor; Landlock is applied as well
where the kernel has it.

A filter is a classic BPF program over ``struct seccomp_data`` (``nr`` at offset 0, ``arch`` at
4, ``args[i]`` at 16 + 8 i), installed with ``prctl(PR_SET_SECCOMP)`` after
``PR_SET_NO_NEW_PRIVS``; x86-64 and arm64 are known (any other arch: :class:`SeccompUnavailable`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000
_AT_EMPTY_PATH = 0x1000

# name -> number, per arch; "newer" is the first number this table does not know
_X86_64 = {
    "open": 2, "stat": 4, "lstat": 6, "access": 21, "socket": 41, "connect": 42, "execve": 59, "truncate": 76,
    "chdir": 80, "rename": 82, "mkdir": 83, "rmdir": 84, "creat": 85, "link": 86, "unlink": 87, "symlink": 88,
    "readlink": 89, "chmod": 90, "chown": 92, "lchown": 94, "ptrace": 101, "utime": 132, "mknod": 133,
    "uselib": 134, "statfs": 137, "pivot_root": 155, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166,
    "swapon": 167, "swapoff": 168, "setxattr": 188, "lsetxattr": 189, "getxattr": 191, "lgetxattr": 192,
    "listxattr": 194, "llistxattr": 195, "removexattr": 197, "lremovexattr": 198, "utimes": 235, "mq_open": 240,
    "inotify_add_watch": 254, "openat": 257, "mkdirat": 258, "mknodat": 259, "fchownat": 260, "futimesat": 261,
    "newfstatat": 262, "unlinkat": 263, "renameat": 264, "linkat": 265, "symlinkat": 266, "readlinkat": 267,
    "fchmodat": 268, "faccessat": 269, "utimensat": 280, "fanotify_mark": 301, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "process_vm_readv": 310, "process_vm_writev": 311, "renameat2": 316,
    "execveat": 322, "statx": 332, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "openat2": 437, "pidfd_getfd": 438, "faccessat2": 439, "mount_setattr": 442, "fchmodat2": 452,
    "setxattrat": 463, "getxattrat": 464, "listxattrat": 465, "removexattrat": 466, "open_tree_attr": 467,
    "file_getattr": 468, "file_setattr": 469, "newer": 470,
}  # fmt: skip
_AARCH64 = {
    "setxattr": 5, "lsetxattr": 6, "getxattr": 8, "lgetxattr": 9, "listxattr": 11, "llistxattr": 12,
    "removexattr": 14, "lremovexattr": 15, "inotify_add_watch": 27, "mknodat": 33, "mkdirat": 34,
    "unlinkat": 35, "symlinkat": 36, "linkat": 37, "renameat": 38, "umount2": 39, "mount": 40, "pivot_root": 41,
    "statfs": 43, "truncate": 45, "faccessat": 48, "chdir": 49, "chroot": 51, "fchmodat": 53, "fchownat": 54,
    "openat": 56, "readlinkat": 78, "newfstatat": 79, "utimensat": 88, "acct": 89, "ptrace": 117,
    "mq_open": 180, "socket": 198, "connect": 203, "execve": 221, "swapon": 224, "swapoff": 225,
    "fanotify_mark": 263, "name_to_handle_at": 264, "open_by_handle_at": 265, "process_vm_readv": 270,
    "process_vm_writev": 271, "renameat2": 276, "execveat": 281, "statx": 291, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "openat2": 437, "pidfd_getfd": 438, "faccessat2": 439,
    "mount_setattr": 442, "fchmodat2": 452, "setxattrat": 463, "getxattrat": 464, "listxattrat": 465,
    "removexattrat": 466, "open_tree_attr": 467, "file_getattr": 468, "file_setattr": 469, "newer": 470,
}  # fmt: skip
# machine -> (AUDIT_ARCH_*, table)
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64), "arm64": (0xC00000B7, _AARCH64)}
# the flags argument of the two stat calls that glibc's fstat() uses with AT_EMPTY_PATH
_FLAGS_ARG = {"newfstatat": 3, "statx": 2}


class SeccompUnavailable(OSError):
    """No seccomp filter could be installed (not Linux, an unknown arch, a kernel without it)."""


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def program(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for ``machine`` (default: this one)."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise SeccompUnavailable(f"no seccomp table for the {machine} architecture")
    audit, table = _ARCHES[machine]
    denied = sorted((nr, name) for name, nr in table.items() if name != "newer")
    # layout: arch check, nr load, x32 / newer check, one JEQ per call, ALLOW, DENY, KILL, then the
    # AT_EMPTY_PATH checks of the stat calls
    n = len(denied)
    allow = 4 + n
    deny, kill = allow + 1, allow + 2
    special = {name: kill + 1 + 4 * i for i, name in enumerate(_FLAGS_ARG)}
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, 4),
        (_JEQ, 0, kill - 2, audit),
        (_LD_W_ABS, 0, 0, 0),
        (_JGE, deny - 4, 0, table["newer"]),  # also catches x32's numbers (>= 1 << 30)
    ]
    for i, (nr, name) in enumerate(denied):
        here = 4 + i
        target = special.get(name, deny)
        prog.append((_JEQ, target - here - 1, 0, nr))
    prog += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | errno.EACCES), (_RET, 0, 0, _KILL)]
    for arg in _FLAGS_ARG.values():  # BPF jumps only forward: each check ends in its own returns
        prog += [(_LD_W_ABS, 0, 0, 16 + 8 * arg), (_JSET, 0, 1, _AT_EMPTY_PATH), (_RET, 0, 0, _ALLOW),
                 (_RET, 0, 0, _ERRNO | errno.EACCES)]
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in prog)
    return prog


def confine() -> str:
    """Install the filter on this process (and its future children), irreversibly. Returns the
    arch; raises :class:`SeccompUnavailable`."""
    if not hasattr(os, "uname") or os.uname().sysname != "Linux":
        raise SeccompUnavailable("seccomp needs Linux")
    prog = program()
    arr = (_Filter * len(prog))(*[_Filter(c, jt, jf, k) for c, jt, jf, k in prog])
    fprog = _Prog(len(prog), ctypes.cast(arr, ctypes.POINTER(_Filter)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SeccompUnavailable(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise SeccompUnavailable(f"prctl(PR_SET_SECCOMP): {os.strerror(ctypes.get_errno())}")
    return platform.machine()


def packed(machine: str | None = None) -> bytes:
    """The filter's bytes as the kernel reads them (for tests and a look with a BPF disassembler)."""
    return b"".join(struct.pack("=HBBI", *ins) for ins in program(machine))


__all__ = ["SeccompUnavailable", "confine", "packed", "program"]
