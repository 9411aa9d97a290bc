"""GPU tier of the LLM path: a short ``kerngen generate`` for a KernelBench level-2 GEMM file
(12_Gemm_Multiply_LeakyReLU, unchanged, at its own size) against the local chat server. The model
first forgets the bias: the check says where and how the output is wrong, the repair prompt
shows it, and the repaired kernel is correct. Where ``ncu`` is installed, the round's best kernel
is profiled and the next round's prompt carries its metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kerngen.agent.tree import load_run
from kerngen.harness.gpu.profile import find_ncu
from kerngen.harness.results import Verdict
from tests.fakes.llm_server import ChatServer, Reply

pytestmark = pytest.mark.gpu
GEMM = str(Path(__file__).resolve().parents[1] / "data" / "kernelbench" / "level2" / "12_Gemm_Multiply_LeakyReLU.py")

SOURCE = r'''#ifndef TILE
#define TILE 16
#endif
// out[m, n] = leaky_relu((x[m, :] . w[n, :] + b[n]) * mult), w is (N, K) as nn.Linear stores it
extern "C" __global__ void __launch_bounds__(TILE * TILE)
gemm_mul_leaky(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
               float* __restrict__ out, int M, int N, int K, float mult, float slope) {
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    const int wn = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int k = k0 + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = (row < M && k < K) ? x[(long long)row * K + k] : 0.0f;
        ws[threadIdx.y][threadIdx.x] = (wn < N && k < K) ? w[(long long)wn * K + k] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += xs[threadIdx.y][kk] * ws[threadIdx.x][kk];
        __syncthreads();
    }
    if (row < M && col < N) {
        const float v = (acc BIAS) * mult;
        out[(long long)row * N + col] = v > 0.0f ? v : v * slope;
    }
}
'''
PLAN = {
    "name": "gemm-tiled", "description": "shared-memory tiles of x and w, the epilogue fused",
    "tunables": {"TILE": [16, 32]}, "defaults": {"TILE": 16},
    "steps": [{"kernel": "gemm_mul_leaky", "grid": ["cdiv(gemm.weight.shape[0], TILE)", "cdiv(x.shape[0], TILE)"],
               "block": ["TILE", "TILE"],
               "args": [{"name": "x"}, {"name": "gemm.weight"}, {"name": "gemm.bias"}, {"name": "out"},
                        {"kind": "int32", "value": "x.shape[0]"}, {"kind": "int32", "value": "gemm.weight.shape[0]"},
                        {"kind": "int32", "value": "x.shape[1]"}, {"kind": "float32", "value": "multiplier"},
                        {"kind": "float32", "value": "negative_slope"}]}],
}


def _answer(bias: bool) -> str:
    source = SOURCE.replace("BIAS", "+ b[col]" if bias else "")
    return f"```cuda\n{source}```\n```json\n{json.dumps(PLAN)}\n```\n"


class Model:
    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, req) -> Reply:
        messages = req.body.get("messages", [])
        user = messages[-1]["content"] if messages else ""
        with self.lock:
            self.prompts.append(user)
        if "single word OK" in user:
            return Reply.completion("OK")
        if user.startswith("# Round"):
            return Reply.completion(json.dumps({"ideas": [
                {"text": "tile x and w through shared memory and fuse the epilogue", "category": "memory_access"}]}))
        if user.startswith("# Repair a kernel"):
            return Reply.completion(_answer(bias=True))
        return Reply.completion(_answer(bias=False))  # the first try forgets the bias


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llm-gpu")
    model = Model()
    with ChatServer() as server:
        server.default = model
        env = dict(os.environ, OPENAI_API_KEY="sk-test-not-a-real-key")
        proc = subprocess.run(
            [sys.executable, "-m", "kerngen", "generate", GEMM, "--proposer", "llm", "--model", "scripted",
             "--base-url", server.url, "--rounds", "2", "--beam", "1", "--ideas", "1", "--branches", "1",
             "--repairs", "1", "--no-tune", "--no-playbook-seed", "--patience", "3", "--runs-dir", str(tmp)],
            capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp.iterdir() if p.is_dir()]
    return load_run(run_dir), model


def test_a_correct_kernel_after_one_repair(session):
    run, model = session
    heads = [n for n in run.nodes.values() if n.kind == "branch" and n.round == 0]
    assert len(heads) == 1 and heads[0].result.verdict is Verdict.incorrect
    check = heads[0].result.check
    assert check is not None and check.failed is not None and check.pattern, check
    repairs = [p for p in model.prompts if p.startswith("# Repair a kernel")]
    assert repairs and check.pattern[:40] in repairs[0] and "shared memory" in repairs[0]  # the evidence, the idea
    fixed = [n for n in run.nodes.values() if n.repair_of == heads[0].id]
    assert len(fixed) == 1 and fixed[0].result.ok, fixed[0].result.message
    assert run.best is not None and run.best.result.ok


def test_the_profile_reaches_the_next_rounds_prompt(session):
    if find_ncu() is None:
        pytest.skip("ncu (Nsight Compute) is not installed on this GPU host")
    run, model = session
    profiled = [n for n in run.nodes.values() if n.profile is not None]
    assert profiled and not profiled[0].profile.error, profiled and profiled[0].profile.error
    ideas = [p for p in model.prompts if p.startswith("# Round 1")]
    assert ideas and "profile (ncu)" in ideas[0] and "DRAM" in ideas[0]
