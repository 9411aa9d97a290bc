"""Content-addressed on-disk cache of NVRTC results (cubins and failures).

Layout under the root (``cubin/`` of :func:`kerngen.harness.cache_dir.cache_root`)::

    ab/abcdef....json    the record: {"ok": true, "info": CompileInfo, "cubin_sha256": ...}
                         or {"ok": false, "message": ..., "log": ...} for a failed compile
    ab/abcdef....cubin   the module (only for ok records)

Every file is written to a temporary name in the same folder and moved into place with
``os.replace``; the cubin goes first and the JSON record last, so a record never points at a torn
module. A record that does not parse, or whose cubin is missing or does not match its hash, is a
miss (and is removed).

Logs are redacted (:mod:`.redact`) when stored and again when served: a cache written before a
secret was known as one, or by an older kerngen (schema 1, whose failure logs could hold host
files that NVRTC included), never serves it. Schema 1 records are misses.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kerngen.harness.compile import headers
from kerngen.harness.atomic import write_atomic
from kerngen.harness.cache_dir import cache_root
from kerngen.harness.compile.nvrtc_info import nvrtc_version
from kerngen.redact import redact
from kerngen.harness.results import CompileInfo

SCHEMA = 2  # 2: compiled in the sandbox, logs redacted


def default_root() -> Path:
    return cache_root() / "cubin"


class CacheEntry:
    """What :meth:`CompileCache.get` returns: a cubin with its info, or a cached failure."""

    __slots__ = ("ok", "cubin", "info", "message", "log")

    def __init__(self, ok: bool, cubin: bytes = b"", info: CompileInfo | None = None, message: str = "", log: str = ""):
        self.ok, self.cubin, self.info, self.message, self.log = ok, cubin, info, message, log


class CompileCache:
    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()

    # ----- keys -------------------------------------------------------------------------------
    @staticmethod
    def key_for(job: Any) -> str:
        """sha256 over (source, options, arch, NVRTC version, header fingerprint)."""
        payload = json.dumps(
            {
                "schema": SCHEMA,
                "source": job.source,
                "options": list(job.options),
                "arch": job.arch,
                "nvrtc": nvrtc_version(),
                "headers": headers.fingerprint(),
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / key[:2]
        return folder / f"{key}.json", folder / f"{key}.cubin"

    # ----- reading ----------------------------------------------------------------------------
    def get(self, key: str) -> CacheEntry | None:
        meta, blob = self._paths(key)
        try:
            record = json.loads(meta.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError):
            self._drop(key)
            return None
        try:
            if not isinstance(record, dict) or record.get("schema") != SCHEMA or record.get("key") != key:
                raise ValueError("foreign record")
            if not record["ok"]:
                return CacheEntry(False, message=redact(str(record["message"])), log=redact(str(record.get("log", ""))))
            cubin = blob.read_bytes()
            if hashlib.sha256(cubin).hexdigest() != record["cubin_sha256"]:
                raise ValueError("cubin does not match its hash")
            info = CompileInfo.model_validate(record["info"])
            return CacheEntry(True, cubin=cubin, info=info.model_copy(update={"log": redact(info.log)}))
        except (OSError, ValueError, KeyError, TypeError):
            self._drop(key)
            return None

    # ----- writing ----------------------------------------------------------------------------
    def put(self, key: str, cubin: bytes, info: CompileInfo) -> None:
        meta, blob = self._paths(key)
        write_atomic(blob, cubin)
        record = {
            "schema": SCHEMA,
            "key": key,
            "ok": True,
            "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
            "info": info.model_copy(update={"log": redact(info.log)}).model_dump(mode="json"),
        }
        write_atomic(meta, json.dumps(record).encode())

    def put_failure(self, key: str, message: str, log: str) -> None:
        meta, _ = self._paths(key)
        record = {"schema": SCHEMA, "key": key, "ok": False, "message": redact(message), "log": redact(log)}
        write_atomic(meta, json.dumps(record).encode())

    def _drop(self, key: str) -> None:
        for p in self._paths(key):
            try:
                p.unlink()
            except OSError:
                pass

    def clear(self) -> int:
        """Remove every entry; returns how many records were removed."""
        n = 0
        if self.root.is_dir():
            for p in self.root.glob("*/*"):
                if p.suffix == ".json":
                    n += 1
                try:
                    p.unlink()
                except OSError:
                    pass
        return n
