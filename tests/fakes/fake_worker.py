"""A stand-in GPU worker for CPU tests of the pool's isolation: it answers the protocol and
hangs, crashes or replies on command (the request's spec_hash says which)."""

import os
import sys
import time

from kerngen.harness.protocol import Envelope, EvaluateRequest, Reply
from kerngen.harness.results import EvalResult, GpuFacts, Verdict


def main() -> None:
    for line in sys.stdin:
        env = Envelope.model_validate_json(line)
        req = env.request
        if not isinstance(req, EvaluateRequest):
            reply = Reply(id=env.id, facts=GpuFacts(name="fake", arch="sm_90"))
        elif req.spec_hash == "hang":
            time.sleep(3600)
        elif req.spec_hash == "crash":
            print("simulated illegal address", file=sys.stderr, flush=True)
            os._exit(11)
        else:
            reply = Reply(id=env.id, result=EvalResult(verdict=Verdict.ok, message=f"pid {os.getpid()}"))
        sys.stdout.write(reply.model_dump_json() + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
