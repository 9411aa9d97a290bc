"""On-disk cache of autotuning results: one append-only JSONL file per key.

The key is everything a measured time depends on: the kernel spec's content hash, the problem
(:meth:`ProblemRef.key`), the GPU name, the NVRTC version and the driver version; a change to any
of them is a different file, i.e. a re-tune. Each evaluated (or resource-pruned) config is one
line, written and fsync'ed as its result lands, so a kill in the middle loses nothing that was
evaluated. Reading tolerates a truncated or corrupt line (a kill mid-write); a later line for the
same config wins (re-measurements).

Location: ``$KERNGEN_CACHE_DIR/tune/`` (default ``~/.cache/kerngen/tune/``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ValidationError

from kerngen.harness.cache_dir import cache_root
from kerngen.harness.results import EvalResult

FORMAT = 1


class TuneKey(BaseModel):
    spec_hash: str
    problem_key: str
    gpu: str
    nvrtc: str
    driver: str
    protocol: str = ""  # the measurement protocol (EvalOptions): results under another one are not reused

    def digest(self) -> str:
        data = json.dumps(self.model_dump(), sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:24]

    def filename(self) -> str:
        return f"{self.spec_hash}-{self.problem_key}-{self.digest()}.jsonl"


class CacheRecord(BaseModel):
    """One line: an evaluated config (``result``) or one pruned after compiling (``pruned``)."""

    v: int = FORMAT
    key: str = ""  # TuneKey.digest() (guards against a file renamed by hand)
    config: dict[str, int]
    result: EvalResult | None = None
    pruned: str = ""
    prune_kind: str = ""
    t: float = 0.0  # unix time written


def config_id(config: dict[str, int]) -> str:
    return json.dumps(config, sort_keys=True)


class TuneCache:
    """Append-only JSONL per :class:`TuneKey` under ``<root>/tune/``."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.dir = (Path(root).expanduser() if root is not None else cache_root()) / "tune"
        self._lock = threading.Lock()

    def path(self, key: TuneKey) -> Path:
        return self.dir / key.filename()

    def load(self, key: TuneKey) -> dict[str, CacheRecord]:
        """Config id -> its latest record. Truncated or foreign lines are skipped."""
        path = self.path(key)
        out: dict[str, CacheRecord] = {}
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return out
        except OSError:
            return out
        digest = key.digest()
        for raw in data.split(b"\n"):
            raw = raw.strip()
            if not raw:
                continue
            try:
                rec = CacheRecord.model_validate(json.loads(raw))
            except (ValidationError, ValueError, TypeError):
                continue  # a line cut by a kill, or garbage
            if rec.v != FORMAT or (rec.key and rec.key != digest):
                continue
            out[config_id(rec.config)] = rec
        return out

    def append(self, key: TuneKey, record: CacheRecord) -> None:
        """Write one line and make it durable (flush + fsync) before returning."""
        record = record.model_copy(update={"key": key.digest(), "t": record.t or time.time()})
        # json.dumps keeps inf/nan (e.g. an error of inf in a check's evidence) as Infinity/NaN
        line = json.dumps(record.model_dump(), separators=(",", ":"), allow_nan=True) + "\n"
        path = self.path(key)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = False
            try:
                if path.stat().st_size > 0:
                    with path.open("rb") as fh:
                        fh.seek(-1, os.SEEK_END)
                        needs_newline = fh.read(1) != b"\n"
            except FileNotFoundError:
                pass
            with path.open("ab") as fh:
                if needs_newline:  # a previous writer was killed mid-line: start a fresh line
                    fh.write(b"\n")
                fh.write(line.encode())
                fh.flush()
                os.fsync(fh.fileno())

    def clear(self, key: TuneKey) -> None:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass
