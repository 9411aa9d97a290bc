"""The playbook's front end (agent/playbook/graph.py): every built-in and every KernelBench level-1 and level-2 file
traced once into one ATen graph (inputs by the forward's names, parameters by their state names, shapes on every
node), the time each trace takes, and the graph run on real tensors agreeing with the model."""

from __future__ import annotations

import glob
import statistics
from pathlib import Path

import pytest
import torch

from kerngen.agent.playbook import PlaybookProposer, seed_specs
from kerngen.agent.playbook.graph import Ref, trace
from kerngen.problems.load import load_problem
from kerngen.problems.registry import builtin_names
from tests.resources import kernelbench

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(glob.glob(str(kernelbench("level[12]", "*.py"))))


def _check(problem, g) -> None:
    info = problem.info
    assert [t.name for t in g.inputs] == [t.name for t in info.inputs]
    assert [t.name for t in g.params] == [t.name for t in info.params]
    assert g.out.shape == tuple(info.outputs[0].shape) and g.out.dtype == info.outputs[0].dtype
    known = {t.name for t in (*g.inputs, *g.params)} | set(g.constants)
    for n in g.nodes:
        for r in n.refs:
            assert r in known, (n.name, r)  # every operand is defined before its reader
        known.add(n.name)
        assert n.op and n.fn is not None


@pytest.mark.needs_kernelbench
def test_every_builtin_and_kernelbench_file_is_traced_once_and_fast():
    files = [load_problem(name) for name in builtin_names()] + [load_problem(f) for f in FILES]
    times = []
    for p in files:
        g = trace(p)
        _check(p, g)
        assert trace(p) is g  # kept on the problem: every family reads this one graph
        times.append(g.trace_s)
    assert len(times) == len(builtin_names()) + len(FILES)
    # measured here (2 shared cores): a mean of about 0.1 s a file, the largest graph under 2 s
    assert statistics.mean(times) < 1.0 and max(times) < 10.0, (statistics.mean(times), max(times))


def test_the_proposer_traces_a_problem_once(monkeypatch):
    calls = []
    real = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = load_problem(str(ROOT / "tests" / "data" / "playbook" / "kb_softmax_scaled.py"))
    p.__dict__.pop("_playbook_graph", None)
    prop = PlaybookProposer(p)  # two regions: both read the one graph
    assert prop.match is not None and prop.match.family == "regions" and len(calls) == 1


def test_the_graph_runs_as_the_model(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x, s):
        y = F.relu(self.bn(self.conv(x)), inplace=True)
        return torch.logsumexp(y, dim=1, keepdim=True) * s + torch.tensor(0.5, device=x.device)


def get_inputs():
    return [torch.randn(2, 3, 8, 8), 1.5]


def get_init_inputs():
    return []
''')
    p = load_problem(str(path))
    g = trace(p)
    assert g.scalars == {"s": 1.5} and list(g.constants.values()) == [0.5]  # both specialised by the trace
    assert [n.op for n in g.live()] == ["conv2d", "batch_norm", "relu", "logsumexp", "mul", "add"]  # relu_ pure
    bn = next(n for n in g.nodes if n.op == "batch_norm")
    assert bn["running_mean"] == Ref("bn.running_mean") and bn["training"] is False and bn.module == "bn"
    model, inputs = p.build_model("cpu", 2), p.make_inputs("cpu", 3)
    want = p.run_reference(model, inputs)[0]
    got = g.run(p.bindings(model, inputs, []))
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_a_forward_that_changes_its_input_is_named(tmp_path):
    from kerngen.agent.playbook.not_covered import NotCovered

    path = tmp_path / "inplace.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                    "        x.mul_(2)\n        return x + 1\n\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    with pytest.raises(NotCovered, match="changes 'x' in place"):
        trace(load_problem(str(path)))


def test_traces_on_several_threads_at_once_all_succeed():
    """A directory run on two GPUs reads two problems at once, each on its own thread; torch.export keeps
    process-wide state (its proxy mode slot, the module hierarchy), so two traces at once failed there
    ('ProxyTorchDispatchMode slot already occupied', 2 H200s, 2026-11-28). Traces are serialized."""
    from concurrent.futures import ThreadPoolExecutor

    names = [n for n in ("softmax", "layernorm", "gelu", "conv2d", "matmul", "rmsnorm") if n in builtin_names()]

    def one(name: str) -> int:
        return len(trace(load_problem(name)).nodes)

    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(one, names * 4))
    assert len(counts) == 4 * len(names) and all(c > 0 for c in counts)


def test_inputs_a_sampler_cannot_make_on_meta_are_made_small_on_the_cpu(tmp_path):
    """A get_inputs that reads a value (.item(): a torch.distributions sampler does on torch 2.11, the GPU host's) cannot
    run on the meta device: it is traced from real CPU inputs where they are small (the GPU tier's memory-plan test had
    no kernel for tests/data/kernelbench/100_HingeLoss_cuda.py), never where they are big."""
    sampler = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
               "    def forward(self, p, t):\n        return torch.mean(torch.clamp(1 - p * t, min=0))\n\n\n"
               "def get_inputs():\n    scale = torch.rand(()).item() + 1\n"
               "    return [torch.rand(N, 64) * scale, torch.randint(0, 2, (N, 1)).float() * 2 - 1]\n"
               "\n\ndef get_init_inputs():\n    return []\n")
    small = tmp_path / "small.py"
    small.write_text("N = 128\n" + sampler)
    g = trace(load_problem(str(small)))
    assert [t.shape for t in g.inputs] == [(128, 64), (128, 1)]
    assert seed_specs(load_problem(str(small))), "the loss family covers it"
    big = tmp_path / "big.py"
    big.write_text("N = 1 << 20\n" + sampler)  # 260 MiB of inputs, over the trace's 256: not made again to be traced
    from kerngen.agent.playbook.not_covered import NotCovered

    with pytest.raises(NotCovered, match="meta device"):
        trace(load_problem(str(big)))
