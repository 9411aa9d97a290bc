"""The dry run's prompts are a GPU run's (issue 36, item 3): the roofline from the preset's
data-sheet rates (said to be such), the playbook's seed shown as the parent ("not measured"),
and ideas whose kernels compiled not called failed in the next round."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import kerngen.cli.app
from tests.fakes.llm_server import ChatServer, Reply, softmax_spec_dict

runner = CliRunner(env={"COLUMNS": "250"})
IDEAS = {"analysis": "three passes", "ideas": [{"text": "one block per row", "category": "memory_access"}]}


class Model:
    def __init__(self) -> None:
        self.ideas: list[str] = []
        self.systems: list[str] = []

    def __call__(self, req) -> Reply:
        messages = req.body["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        if "single word OK" in user:
            return Reply.completion("OK")
        self.systems.append(messages[0]["content"])
        if user.startswith("# Round"):
            self.ideas.append(user)
            return Reply.completion(json.dumps(IDEAS))
        return Reply.completion(json.dumps(softmax_spec_dict()))


def dry_run(tmp_path, model, *flags: str, problem: str = "softmax") -> None:
    """``kerngen generate PROBLEM --dry-run`` (one idea, one branch) against ``model``."""
    with ChatServer() as server:
        server.default = model
        res = runner.invoke(kerngen.cli.app.app, [
            "generate", problem, "--dry-run", "--proposer", "llm", "--model", "m", "--base-url", server.url,
            "--ideas", "1", "--branches", "1", "--runs-dir", str(tmp_path), *flags])
    assert res.exit_code == 0, res.output


def test_the_dry_run_prompts_show_what_a_gpu_run_would(tmp_path):
    model = Model()
    dry_run(tmp_path, model, "--rounds", "2", "--repairs", "0", "--patience", "5")
    round0, round1 = model.ideas[0], model.ideas[-1]
    # the playbook's seed is round 0's parent, as on a GPU, and said to be unmeasured
    assert "## The kernel to improve (node 0)" in round0 and "not measured (dry run" in round0
    # round 1 knows round 0's idea compiled; it was not run, not "failed: not_run"
    tried = round1.split("## Ideas already tried")[1].split("# Your task")[0]
    assert "compiled, not measured (dry run" in tried
    assert "failed" not in tried and "not_run" not in tried
    # the roofline from the H100's data-sheet bandwidth, said to be a data sheet's
    system = model.systems[0]
    assert "Roofline floor: 0.641 ms (memory-bound, from data-sheet peaks)" in system
    assert "memory bandwidth: 3350 GB/s (data-sheet peak, not measured)" in system


def test_the_3xtf32_bound_stands_beside_the_ffma_floor_for_fp32_gemm(tmp_path):
    model = Model()
    dry_run(tmp_path, model, "--shape", "2048x2048x2048", "--rounds", "1", "--repairs", "0", "--no-playbook-seed",
            problem="matmul")
    system = model.systems[0]
    # 2*2048^3 FLOP: 0.2568 ms at 66.9 TFLOP/s (FFMA), 0.1042 ms at 989.4/2/3 TFLOP/s (3xTF32): the H100 SXM's
    # data sheet (harness/gpu/peaks.py, the roofline's table too)
    assert "at the FFMA rate (66.9 TFLOP/s) a kernel needs at least 0.2568 ms" in system
    assert "a 3xTF32 kernel on the tensor cores" in system and "165 TFLOP/s) at least 0.1042 ms" in system
    assert "tensormap" in system  # an fp32 GEMM on Hopper may use TMA: its schema is offered


def test_a_tf32_dry_run_states_its_precision_and_that_its_tolerance_was_not_measured(tmp_path):
    model = Model()
    dry_run(tmp_path, model, "--shape", "2048x2048x2048", "--precision", "tf32", "--rounds", "1", "--repairs", "0",
            "--no-playbook-seed", problem="matmul")
    system = model.systems[0]
    check = system.split("# The correctness check")[1].split("# The launch plan")[0]
    assert "checked at TF32 precision" in check and "not known here (a dry run measures nothing)" in check
    assert "rules out TF32" not in system and "1xTF32 on the tensor cores" in check
    assert "at this problem's TF32 precision a 1xTF32 kernel" in system  # the bound TF32 allows, beside FFMA's


def test_a_repair_sees_the_chain_and_the_next_round_sees_why_an_idea_failed(tmp_path):
    """Every answer fails to compile: the third repair (of the second repair's kernel) is shown the
    first answer's and the first repair's causes, one line each, and the next round's ideas prompt
    says why the idea failed."""
    broken = softmax_spec_dict("broken")
    broken["source"] = broken["source"].replace("float inv = 1.f / red[0];", "float inv = 1.f / red[0]")
    repairs: list[str] = []

    class Failing(Model):
        def __call__(self, req) -> Reply:
            user = next(m["content"] for m in req.body["messages"] if m["role"] == "user")
            if user.startswith("# Repair"):
                repairs.append(user)
            if "single word OK" in user or user.startswith("# Round"):
                return super().__call__(req)
            return Reply.completion(json.dumps(broken))

    model = Failing()
    dry_run(tmp_path, model, "--rounds", "2", "--repairs", "3", "--patience", "5", "--no-playbook-seed")
    assert "Earlier attempts" not in repairs[0]  # the first repair has no earlier attempt to show
    chain = repairs[2].split("Earlier attempts of this branch, each refused:")[1].split("This kernel failed.")[0]
    assert chain.count("\n- ") == 2 and "- first answer: compile_error: kernel.cu(" in chain
    assert "- repair 1: compile_error: kernel.cu(" in chain
    tried = model.ideas[-1].split("## Ideas already tried")[1].split("# Your task")[0]
    assert "1/1 branches failed: compile_error after 3 repairs (kernel.cu(" in tried
    assert "KERNGEN_META" not in model.systems[0] and "SHAPE_DOC" not in model.systems[0]  # the loader's lines
