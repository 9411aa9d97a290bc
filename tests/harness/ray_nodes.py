"""Two Ray nodes on one host of two GPUs, each owning one GPU: a head (``ray start --head`` with
``CUDA_VISIBLE_DEVICES=0``) and a second node (``ray start --address`` with ``CUDA_VISIBLE_DEVICES=1``),
their own ports and temp dirs, so that a driver on this host talks to two nodes over Ray's protocol.
The second node can be lost (its raylet killed, SIGKILL: a node gone, not a graceful stop) and
started again. Used by the GPU tier (``test_gpu_ray_nodes.py``) and by ``scripts/device/i38.sh``:

    python3 -m tests.harness.ray_nodes ROOT head|node|kill-node|stop

Every process is found by what its command line names of this cluster (its temp dir, its ports):
only this cluster's processes are ever signalled, never Ray's others on the host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HEAD_PORT = 6390
NODE_PORTS = {"--node-manager-port": 6395, "--object-manager-port": 6396}
WORKER_PORTS = {"head": (11000, 11999), "node": (12000, 12999)}


class TwoNodes:
    def __init__(self, root: str | Path, port: int = HEAD_PORT) -> None:
        self.root = Path(root)  # short (Ray's socket paths live under it): /tmp/NAME
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.node_up = False

    def _start(self, which: str, gpu: str, *args: str) -> float:
        """``ray start`` of one node, this host's GPU ``gpu`` its only one; seconds it took."""
        lo, hi = WORKER_PORTS[which]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, RAY_AUTH_MODE="disabled")  # a closed host of ours
        # kerngen moves a request and a cubin (kilobytes) per candidate: a small object store will do
        # (Ray's default takes 30% of the RAM of each node, in /dev/shm)
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--num-gpus", "1",
               "--object-store-memory", str(1 << 30),
               "--temp-dir", str(self.root / which), "--min-worker-port", str(lo), "--max-worker-port", str(hi),
               "--disable-usage-stats"]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start ({which}) failed: {(proc.stdout + proc.stderr)[-2000:]}")
        return time.monotonic() - t0

    def start_head(self) -> float:
        return self._start("head", "0", "--head", "--port", str(self.port), "--include-dashboard=false")

    def start_node(self) -> float:
        ports = [str(x) for kv in NODE_PORTS.items() for x in kv]
        took = self._start("node", "1", "--address", self.address, *ports)
        self.node_up = True
        return took

    def _pids(self, needle: str, also: str = "") -> list[int]:
        """Processes whose full command line holds ``needle`` and ``also``, read from /proc (``ps`` may cut a
        long command line, such as a raylet's, at its column width: the GPU host's did)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if needle in args and also in args:
                pids.append(int(entry.name))
        return pids

    @staticmethod
    def _has_port(pid: int, port: int) -> bool:
        """``--node_manager_port=PORT`` or ``--node_manager_port PORT`` in the process's arguments."""
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        for i, a in enumerate(args):
            if a == f"--node_manager_port={port}".encode() or (
                    a == b"--node_manager_port" and i + 1 < len(args) and args[i + 1] == str(port).encode()):
                return True
        return False

    def kill_node(self) -> int:
        """SIGKILL to the second node's raylet (its node gone: the actors on it die with it)."""
        port = NODE_PORTS["--node-manager-port"]
        pids = [p for p in self._pids("raylet", "node_manager_port") if self._has_port(p, port)]
        if not pids:
            raise RuntimeError("no raylet of the second node to kill")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        self.node_up = False
        return pids[0]

    def stop(self) -> None:
        """End every process of this cluster (those whose command line names its temp dir)."""
        for pid in self._pids(str(self.root)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait_gpus(self, gpus: int, timeout_s: float = 60.0) -> None:
        """The cluster shows ``gpus`` GPUs, all free (a lost node leaves it once Ray declares it dead)."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False);"
                "r = ray.cluster_resources().get('GPU', 0), ray.available_resources().get('GPU', 0);"
                "print(int(r[0]), int(r[1]))")
        deadline = time.monotonic() + timeout_s
        while True:
            out = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True,
                                 env=dict(os.environ, RAY_AUTH_MODE="disabled"), timeout=120).stdout.split()
            if out == [str(gpus), str(gpus)]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster shows {out} GPUs (total, free), not {gpus}")
            time.sleep(1.0)


def main(argv: list[str]) -> int:
    root, what = argv[0], argv[1]
    nodes = TwoNodes(root)
    if what == "head":
        print(f"head on GPU 0 at {nodes.address}: {nodes.start_head():.1f} s")
    elif what == "node":
        print(f"second node on GPU 1: {nodes.start_node():.1f} s")
    elif what == "kill-node":
        print(f"killed the second node's raylet (pid {nodes.kill_node()})")
    elif what == "stop":
        nodes.stop()
    elif what == "wait":
        nodes.wait_gpus(int(argv[2]))
    else:
        print(f"unknown: {what}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
