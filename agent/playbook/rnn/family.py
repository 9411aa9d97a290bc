"""Playbook family ``lstm``: one ``nn.LSTM`` (``aten.lstm.input``) whose output sequence the model reads.

What it takes: a region whose nodes are the LSTM, its output sequence ``lstm(...)[0]`` (the region's output), and
the ``torch.zeros`` that ``nn.LSTM`` makes for h0 / c0 when none is passed (folded: the kernels start from zero);
h0 / c0 may also be tensors the region reads. Unidirectional, fp32, with or without biases, batch_first or not,
any number of layers, eval mode (or dropout 0).

How (:mod:`.build`): per layer, (a) the input projection of every step at once, ``G = X W_ih^T + b_ih + b_hh`` into
scratch, is the ``gemm`` family's own kernel (3xTF32 ``tf32x3`` or FFMA ``tiled``, both fp32-accurate) built for a
``linear`` + ``add`` graph made here, so no second GEMM is written; (b) the recurrence is ``lstm_layer.cu.j2``: a
block owns JB hidden units and keeps their four gates' rows of W_hh in shared memory, so the pointwise update (i, f,
g, o as PyTorch orders them) fuses into the block that computed the gates and c never leaves registers; h is
double-buffered in global memory (one grid barrier per step). ``persistent`` runs the T steps in one cooperative
launch per layer (the recurrence is latency-bound: a launch per step would cost a launch per step). ``splitk``
(offered first) runs a layer in one cooperative launch too, organised for a latency-bound step
(``lstm_splitk.cu.j2``, docs/lstm-recurrence.md): a block owns a tile of units x batch rows, stages its rows of h
once a step, splits the step's product over K across its warps with a register tile a lane, and loads the next
step's gx before the barrier. ``step`` launches once per step (c in scratch), offered only while 2 L + L T launches fit a spec's MAX_STEPS (short
sequences): the simple reference the persistent one is checked against. The layers' specs are joined in order by
:func:`.regions_spec.join` (the GEMMs' tunables fixed at their defaults: the recurrence is where the time is).

Refused, each with its reason: bidirectional, dropout in training, proj_size, packed sequences, unbatched
(2-D) input, dtypes other than fp32, and a region that reads h_n / c_n (``lstm(...)[1]``, ``[2]``) rather than the
output sequence.
"""

from __future__ import annotations

from kerngen.agent.playbook.entry import A, C, PAR, Entry
from kerngen.agent.playbook.family import Facts, Family, FamilyMatch
from kerngen.agent.playbook.graph import Graph, Node
from kerngen.agent.playbook.leads import Lead
from kerngen.agent.playbook.not_covered import NotCovered
from kerngen.agent.playbook.rnn.build import lstm_persistent, lstm_persistent_ffma, lstm_splitk, lstm_step

__all__ = ["LSTM", "LstmFacts"]

NAME = "lstm"
ZEROS = ("zeros",)  # what nn.LSTM makes for a missing (h0, c0)


class LstmFacts(Facts):
    node: str  # the lstm node's name (the per-layer tensors are named after it)
    x: str
    h0: str | None  # None: zeros made in the forward (the kernels start from zero)
    c0: str | None
    weights: tuple[str, ...]  # w_ih, w_hh (, b_ih, b_hh) per layer
    batch: int
    steps: int
    d_in: int
    hidden: int
    layers: int
    batch_first: bool
    biases: bool


def _hx(g: Graph, ref: str, want: tuple[int, ...], what: str) -> str | None:
    n = g.node(ref)
    if n is None:
        if g.shape(ref) != want or g.dtype(ref) != "float32":
            raise NotCovered(f"LSTM {what} of shape {g.shape(ref)} ({g.dtype(ref)}): the playbook's LSTM reads "
                             f"fp32 {what} of shape {want}")
        return ref
    if n.op not in ZEROS or n.shape != want:
        raise NotCovered(f"LSTM {what} computed by {n.op} in the region: not covered (zeros or a tensor it reads)")
    return None


def _refusal(n: Node, g: Graph) -> str | None:
    if n.overload != "input":
        return "LSTM over packed sequences (aten.lstm.data) is not covered by the playbook"
    if n["bidirectional"]:
        return "bidirectional LSTM is not covered by the playbook (one direction only)"
    if n["train"] and float(n["dropout"]) > 0 and int(n["num_layers"]) > 1:
        return "LSTM dropout between layers in training mode is not covered by the playbook"
    x = g.shape(n["input"])
    if x is None or len(x) != 3:
        return f"LSTM over an input of shape {x} is not covered (batched 3-D input only)"
    if g.dtype(n["input"]) != "float32":
        return f"LSTM in {g.dtype(n['input'])} is not covered by the playbook (fp32 only)"
    return None


def _recognise(g: Graph) -> FamilyMatch | None:
    live = g.live()
    lstms = [n for n in live if n.op == "lstm"]
    if not lstms:
        return None
    n = lstms[0]
    why = _refusal(n, g)
    if why:
        raise NotCovered(why)
    out = g.node(g.output)
    if out is None or out.op != "getitem" or out["input"] != n.name:
        return None  # more than the LSTM in the region: the partitioner tries a shorter run
    if out["index"] != 0:
        raise NotCovered("the model reads the LSTM's h_n / c_n: not covered (the playbook's LSTM writes its output "
                         "sequence, lstm(...)[0])")
    hx = tuple(n["hx"])
    allowed = {n.name, out.name, *(r for r in hx if g.node(r) is not None)}
    if len(lstms) > 1 or any(m.name not in allowed for m in live):
        return None
    layers, biases = int(n["num_layers"]), bool(n["has_biases"])
    weights = tuple(n["params"])
    per = 4 if biases else 2
    x = g.shape(n["input"])
    batch_first = bool(n["batch_first"])
    batch, steps, d_in = (x[0], x[1], x[2]) if batch_first else (x[1], x[0], x[2])
    w_hh = g.shape(weights[1]) if len(weights) > 1 else None
    if len(weights) != layers * per or w_hh is None or w_hh[0] != 4 * w_hh[1]:
        raise NotCovered("LSTM with proj_size (a projected hidden state) is not covered by the playbook")
    hidden = w_hh[1]
    want = (layers, batch, hidden)
    h0, c0 = (_hx(g, r, want, what) for r, what in zip(hx, ("h0", "c0")))
    if (h0 is None) != (c0 is None):
        raise NotCovered("LSTM with one of h0 / c0 given and the other zeros: not covered by the playbook")
    facts = LstmFacts(node=n.name, x=str(n["input"]), h0=h0, c0=c0, weights=weights, batch=batch, steps=steps,
                      d_in=d_in, hidden=hidden, layers=layers, batch_first=batch_first, biases=biases)
    return FamilyMatch.of(g, facts, f"lstm: {layers} layer(s), input {d_in}, hidden {hidden}, {steps} steps, "
                          f"batch {batch}{'' if batch_first else ' (sequence first)'}")


IDEAS = (
    Entry("lstm-splitk", "Per layer the 3xTF32 input projection, then one cooperative launch whose blocks each own a "
          "tile of hidden units x batch rows (their W_hh rows in shared memory, only their batch rows of h read a "
          "step): h staged by cp.async once a step, the step's product split over K across the warps with a "
          "register tile per lane, the partial sums met in shared memory, the next step's gx loaded before the "
          "grid barrier.", C, "one L2 round trip a step and a product bound by the FMA pipe, not shared memory",
          "splitk", round0=True),
    Entry("lstm-splitk-warps", "More or fewer warps splitting K, more copy groups in flight, other tiles: latency "
          "hiding against the partial sums' traffic.", PAR, "the step's latency against its shared-memory traffic",
          "splitk", ({"KW": 16}, {"KW": 4}, {"NG": 4}, {"JB": 8}), after=frozenset({"splitk"})),
    Entry("lstm-persistent", "Per layer, the input projection of every step as one 3xTF32 GEMM, then one cooperative "
          "persistent kernel for the recurrence: each block keeps its hidden units' W_hh rows in shared memory, fuses "
          "the gates' pointwise update and keeps c in registers; a grid barrier between steps.", C,
          "the recurrence bound by one W_hh product per step, not by launches", "persistent", round0=True),
    Entry("lstm-persistent-ffma", "The same persistent recurrence with the input projection as the FFMA tiled GEMM.",
          C, "the projection without tensor cores", "persistent_ffma", round0=True),
    Entry("lstm-step", "One launch per step (W_hh staged per launch, c in scratch): the plain recurrence.", C,
          "a reference for short sequences", "step", round0=True),
    Entry("lstm-units", "More or fewer hidden units per block: fewer blocks at the barrier against more work each.",
          PAR, "barrier cost against per-block work", "persistent", ({"JB": 2}, {"JB": 8}),
          after=frozenset({"persistent", "persistent_ffma"})),
    Entry("lstm-rows", "More batch rows per thread: each W_hh value read from shared memory serves more FMAs.", A,
          "fewer shared-memory reads per FMA", "persistent", ({"BR": 4}, {"BR": 1}, {"KC": 128}),
          after=frozenset({"persistent", "persistent_ffma"})),
)

LSTM = Family(name=NAME, leads=frozenset({Lead.rnn}), recognise=_recognise,
              constraints=("one nn.LSTM", "its output sequence read", "zeros or tensors for h0 / c0"),
              variants={"splitk": lstm_splitk, "persistent": lstm_persistent, "persistent_ffma": lstm_persistent_ffma,
                        "step": lstm_step},
              ideas=IDEAS)
