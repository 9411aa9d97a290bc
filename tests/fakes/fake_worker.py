"""A stand-in GPU worker for CPU tests of the pool's isolation: it answers the protocol and
hangs, crashes or replies on command (the request's spec_hash says which)."""

import os
import sys
import time

from kerngen.harness.pool.protocol import Envelope, EvaluateRequest, PrepareRequest, Reply
from kerngen.harness.results import EvalResult, GpuFacts, Verdict


def gpu_name() -> str:
    """The GPU's name: "fake", or (a test of a mixed cluster) what FAKE_GPU_MODELS names its device:
    "0=A100,1=H100" names the worker whose CUDA_VISIBLE_DEVICES is 0 "A100"."""
    models = dict(p.split("=", 1) for p in os.environ.get("FAKE_GPU_MODELS", "").split(",") if "=" in p)
    return models.get(os.environ.get("CUDA_VISIBLE_DEVICES", ""), "fake")


def main() -> None:
    built: set[str] = set()
    for line in sys.stdin:
        env = Envelope.model_validate_json(line)
        req = env.request
        # what to do: the first kernel's name of the plan, else the spec hash
        what = req.plan.launches[0].kernel if isinstance(req, EvaluateRequest) and req.plan.launches else ""
        what = what or getattr(req, "spec_hash", "")
        problem = getattr(req, "problem", None)
        if problem is not None and problem.key() not in built:
            # like the real worker: the first request that needs a problem builds its state,
            # which takes a while for the "slow" (2, 2) shape
            time.sleep(2.0 if problem.shape == (2, 2) else 0.0)
            built.add(problem.key())
        if isinstance(req, PrepareRequest):
            reply = Reply(id=env.id)
        elif not isinstance(req, EvaluateRequest):
            reply = Reply(id=env.id, facts=GpuFacts(name=gpu_name(), arch="sm_90"))
        elif what == "hang":
            time.sleep(3600)
        elif what == "slow":  # a candidate that takes a second: a deadline passes while it runs
            time.sleep(1.0)
            reply = Reply(id=env.id, result=EvalResult(verdict=Verdict.ok, spec_hash=req.spec_hash,
                                                       config=req.plan.config))
        elif what == "crash":
            print("simulated illegal address", file=sys.stderr, flush=True)
            os._exit(11)
        else:
            time.sleep(0.05)  # long enough that a batch spreads over every worker
            result = EvalResult(verdict=Verdict.ok, message=f"pid {os.getpid()}", spec_hash=req.spec_hash,
                                config=req.plan.config)
            reply = Reply(id=env.id, result=result)
        sys.stdout.write(reply.model_dump_json() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
