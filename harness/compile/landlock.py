"""Landlock: let a process give up the file system, the network and signals, for good.

Linux >= 5.13 lets an unprivileged process restrict itself (and its future children) to a set of
directories, irreversibly (``landlock(7)``). The compile worker calls :func:`confine` after it has
loaded NVRTC: from then on it can read the CUDA header directories it was handed and nothing else
(no ``/proc/self/environ``, no ``.env``, no ``/etc/passwd``, no ``/proc/self/pagemap``), write no
file anywhere, open no TCP connection (ABI >= 4) and signal no process outside itself (ABI >= 6).

Already-open file descriptors (the pipes to the parent) keep working. No Python binding exists in
the standard library; the three system calls are made through ``ctypes`` (their numbers are the
same on x86-64 and arm64: the unified syscall table).
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
from typing import Iterable

_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# file-system rights, by the ABI version that introduced them
_FS_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_ALL = (1 << 0) | (1 << 1)  # BIND_TCP, CONNECT_TCP: ABI 4
_SCOPE_ALL = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET, SIGNAL: ABI 6
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_FILE = 1 << 5
MAKE_REG = 1 << 8
TRUNCATE = _FS_TRUNCATE
# the rights a rule on a regular file (not a directory) may carry
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV


class LandlockUnavailable(OSError):
    """The kernel has no Landlock (too old, or disabled at boot), or refused the ruleset."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where there is none."""
    if not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    v = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return int(v) if v > 0 else 0


def _handled_fs(abi: int) -> int:
    rights = _FS_V1
    if abi >= 2:
        rights |= _FS_REFER
    if abi >= 3:
        rights |= _FS_TRUNCATE
    if abi >= 5:
        rights |= _FS_IOCTL_DEV
    return rights


def confine(readable_dirs: Iterable[str]) -> int:
    """Restrict this process for the rest of its life: read-only access beneath
    ``readable_dirs``, no other file-system access, no TCP, no signals or abstract sockets
    outside its domain. Returns the ABI version used; raises :class:`LandlockUnavailable`."""
    return confine_rules((path, READ_FILE | READ_DIR) for path in readable_dirs)


def confine_rules(rules: Iterable[tuple[str, int]]) -> int:
    """:func:`confine` with a set of rights per path (a directory: beneath it; a regular file: that
    file, with the file rights of the set only): e.g. ``EXECUTE | READ_FILE`` on one executable."""
    abi = abi_version()
    if abi < 1:
        raise LandlockUnavailable("this kernel has no Landlock (Linux >= 5.13 with landlock enabled)")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    fs = _handled_fs(abi)
    if abi >= 6:
        attr = struct.pack("=QQQ", fs, _NET_ALL, _SCOPE_ALL)
    elif abi >= 4:
        attr = struct.pack("=QQ", fs, _NET_ALL)
    else:
        attr = struct.pack("=Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(_SYS_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise LandlockUnavailable(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path, rights in rules:
            try:
                dfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path that is gone is simply not reachable
            try:
                if not stat.S_ISDIR(os.fstat(dfd).st_mode):
                    rights &= _FILE_RIGHTS
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights & fs, dfd), 12)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH), rule,
                                ctypes.c_uint32(0)) < 0:
                    raise LandlockUnavailable(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(dfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise LandlockUnavailable(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            raise LandlockUnavailable(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    return abi
