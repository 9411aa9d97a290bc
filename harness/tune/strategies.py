"""Search strategies of the autotuner, behind one small ask/tell interface.

A strategy walks a :class:`Space` (the configurations that survived static pruning) and never
proposes a configuration twice. The tuner asks for a batch (``ask(n)``), evaluates it in parallel
on every GPU, and tells each result back (``tell(config, ms)``; ``ms = inf`` for a failed
config); a configuration pruned later (e.g. on registers after compiling) is told with
:meth:`Strategy.drop` and costs no budget.

- ``exhaustive``: every configuration, the spec's default first.
- ``random``: a seeded sample without replacement.
- ``model``: Bayesian optimisation with a Gaussian-process surrogate over the ordinal tunable
  grid (log2 coordinates for power-of-two style values), pure numpy: a space-filling random
  start (default config first), then batches chosen by expected improvement of log(ms) times a
  kernel-smoothed probability that the config is correct, made batch-parallel with the
  "kriging believer" heuristic, plus a local-search fallback around the best configs when the
  model expects nothing more. On 1000+ config spaces it reaches within 5% of the exhaustive
  optimum with <= 20% of the evaluations (tests/harness/test_tune_strategies.py asserts it).
"""

from __future__ import annotations

import math
import random as _random
from abc import ABC, abstractmethod
from typing import Iterable, Sequence

import numpy as np

Key = tuple[int, ...]  # a config as the index of each tunable's value

STRATEGIES = ("exhaustive", "random", "model", "auto")


class Space:
    """The tunables (names and ordered values) and the feasible configurations, as index keys."""

    def __init__(self, tunables: dict[str, list[int]], configs: Iterable[dict[str, int]]) -> None:
        self.names = list(tunables)
        self.values = {n: list(v) for n, v in tunables.items()}
        self._index = {n: {v: i for i, v in enumerate(vals)} for n, vals in self.values.items()}
        self.keys: list[Key] = []
        seen: set[Key] = set()
        for cfg in configs:
            key = self.key(cfg)
            if key not in seen:
                seen.add(key)
                self.keys.append(key)
        self._coords: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def key(self, config: dict[str, int]) -> Key:
        return tuple(self._index[n][config[n]] for n in self.names)

    def config(self, key: Key) -> dict[str, int]:
        return {n: self.values[n][i] for n, i in zip(self.names, key)}

    def coord_table(self) -> list[np.ndarray]:
        """Per tunable: each value's coordinate in [0, 1] (log2 scale when every value > 0)."""
        table = []
        for n in self.names:
            vals = np.asarray(self.values[n], dtype=float)
            x = np.log2(vals) if np.all(vals > 0) else vals
            span = x.max() - x.min()
            table.append((x - x.min()) / span if span > 0 else np.zeros_like(x))
        return table

    def coords(self, keys: Sequence[Key]) -> np.ndarray:
        table = self.coord_table()
        arr = np.asarray(keys, dtype=int).reshape(len(keys), len(self.names))
        if not self.names:
            return np.zeros((len(keys), 0))
        return np.stack([table[d][arr[:, d]] for d in range(len(self.names))], axis=1)

    def neighbours(self, key: Key) -> list[Key]:
        """Configs one step away along one tunable's (ordered) values."""
        out = []
        for d, n in enumerate(self.names):
            for step in (-1, 1):
                j = key[d] + step
                if 0 <= j < len(self.values[n]):
                    out.append(key[:d] + (j,) + key[d + 1 :])
        return out


class Strategy(ABC):
    """ask(n) -> up to n configs never proposed before ([] when done); tell(config, ms)."""

    name = "base"

    def __init__(self, space: Space, *, seed: int = 0, budget: int | None = None,
                 default: dict[str, int] | None = None) -> None:
        self.space = space
        self.seed = seed
        self.budget = budget if budget is not None else len(space)
        self.default = space.key(default) if default is not None and _in_space(space, default) else None
        self.proposed: set[Key] = set()
        self.observed: dict[Key, float] = {}
        self.dropped: set[Key] = set()

    # the interface -------------------------------------------------------------------------
    def ask(self, n: int) -> list[dict[str, int]]:
        keys = self._ask(max(0, n))
        for k in keys:
            self.proposed.add(k)
        return [self.space.config(k) for k in keys]

    def tell(self, config: dict[str, int], ms: float) -> None:
        """Result of an evaluated config (``inf`` when it failed). Also accepts configs the
        strategy never proposed (cached results), which then count as proposed."""
        key = self.space.key(config)
        self.proposed.add(key)
        self.observed[key] = float(ms) if ms == ms else math.inf  # NaN -> failed

    def drop(self, config: dict[str, int]) -> None:
        """The config was pruned after being proposed: it is infeasible and costs no budget."""
        key = self.space.key(config)
        self.proposed.add(key)
        self.dropped.add(key)

    # helpers -------------------------------------------------------------------------------
    def remaining(self) -> list[Key]:
        return [k for k in self.space.keys if k not in self.proposed]

    @abstractmethod
    def _ask(self, n: int) -> list[Key]: ...


def _in_space(space: Space, config: dict[str, int]) -> bool:
    try:
        return space.key(config) in set(space.keys)
    except KeyError:
        return False


class Exhaustive(Strategy):
    name = "exhaustive"

    def __init__(self, space: Space, **kw) -> None:
        super().__init__(space, **kw)
        order = list(space.keys)
        if self.default is not None:
            order.remove(self.default)
            order.insert(0, self.default)
        self._order = order
        self._pos = 0

    def _ask(self, n: int) -> list[Key]:
        out: list[Key] = []
        while len(out) < n and self._pos < len(self._order):
            k = self._order[self._pos]
            self._pos += 1
            if k not in self.proposed:
                out.append(k)
        return out


class RandomSearch(Strategy):
    name = "random"

    def __init__(self, space: Space, **kw) -> None:
        super().__init__(space, **kw)
        order = list(space.keys)
        _random.Random(self.seed).shuffle(order)
        self._order = order
        self._pos = 0

    def _ask(self, n: int) -> list[Key]:
        out: list[Key] = []
        while len(out) < n and self._pos < len(self._order):
            k = self._order[self._pos]
            self._pos += 1
            if k not in self.proposed:
                out.append(k)
        return out


# ----- the model-guided strategy ------------------------------------------------------------
_SQRT5 = math.sqrt(5.0)
_LENGTHSCALES = (0.08, 0.15, 0.3, 0.6, 1.2, 2.5)
_NOISES = (1e-4, 1e-3, 1e-2, 5e-2)
_POOL_LIMIT = 20000


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _sqdiff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-dimension squared differences, shape (len(a), len(b), d)."""
    diff = a[:, None, :] - b[None, :, :]
    return diff * diff


def _matern_from(sq: np.ndarray, ls: np.ndarray) -> np.ndarray:
    r = np.sqrt(np.maximum(sq @ (1.0 / (ls * ls)), 0.0))
    return (1.0 + _SQRT5 * r + 5.0 / 3.0 * r * r) * np.exp(-_SQRT5 * r)


class _GP:
    """Zero-mean GP on standardized targets, Matern 5/2 with one lengthscale per dimension
    (unit signal variance; ``noise`` relative to it)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, ls: np.ndarray, noise: float,
                 sq: np.ndarray | None = None) -> None:
        self.x, self.ls, self.noise = x, ls, noise
        self.mean, self.std = float(y.mean()), float(y.std()) or 1.0
        self.y = (y - self.mean) / self.std
        sq = _sqdiff(x, x) if sq is None else sq
        k = _matern_from(sq, ls) + (noise + 1e-8) * np.eye(len(x))
        self.chol = np.linalg.cholesky(k)
        self.alpha = np.linalg.solve(self.chol.T, np.linalg.solve(self.chol, self.y))

    def lml(self) -> float:
        return float(-0.5 * self.y @ self.alpha - np.log(np.diag(self.chol)).sum())

    def posterior(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Standardized mean, variance and V = L^-1 K(x, xs) (for batch variance updates)."""
        ks = _matern_from(_sqdiff(xs, self.x), self.ls)
        mu = ks @ self.alpha
        v = np.linalg.solve(self.chol, ks.T)
        var = np.maximum(1.0 - (v * v).sum(0), 1e-12)
        return mu, var, v


def _fit_gp(x: np.ndarray, y: np.ndarray, start: np.ndarray | None, noise0: float, sweeps: int = 2) -> _GP:
    """Pick lengthscales (coordinate search over a grid) and noise by the log marginal likelihood."""
    d = x.shape[1]
    ls = start.copy() if start is not None else np.full(d, 0.3)
    noise = noise0
    sq = _sqdiff(x, x)

    def fit(l: np.ndarray, nz: float) -> _GP | None:
        try:
            return _GP(x, y, l, nz, sq)
        except np.linalg.LinAlgError:
            return None

    best = fit(ls, noise)
    if best is None:
        noise = 5e-2
        best = fit(ls, noise)
        if best is None:  # pragma: no cover - the jitter makes this unreachable in practice
            raise np.linalg.LinAlgError("GP fit failed")
    best_lml = best.lml()
    for _sweep in range(sweeps):
        for dim in range(d):
            for value in _LENGTHSCALES:
                if value == ls[dim]:
                    continue
                trial = ls.copy()
                trial[dim] = value
                gp = fit(trial, noise)
                if gp is not None and (l := gp.lml()) > best_lml:
                    best, best_lml, ls = gp, l, trial
        for nz in _NOISES:
            if nz == noise:
                continue
            gp = fit(ls, nz)
            if gp is not None and (l := gp.lml()) > best_lml:
                best, best_lml, noise = gp, l, nz
    return best


class ModelGuided(Strategy):
    """Batch Bayesian optimisation over the ordinal grid (see the module docstring)."""

    name = "model"

    def __init__(self, space: Space, *, init: int | None = None, **kw) -> None:
        super().__init__(space, **kw)
        self._rng = np.random.default_rng(self.seed)
        d = max(1, len(space.names))
        self.n_init = init if init is not None else int(min(max(2 * d + 2, round(0.15 * self.budget)), 30))
        self._ls: np.ndarray | None = None
        self._noise = 1e-3
        self._fits = 0

    # initial design: default first, then greedy max-min distance among random candidates
    def _initial(self, n: int) -> list[Key]:
        out: list[Key] = []
        rem = self.remaining()
        if self.default is not None and self.default not in self.proposed and n > 0:
            out.append(self.default)
            rem = [k for k in rem if k != self.default]
        if not rem:
            return out
        chosen = list(self.proposed) + out
        chosen_x = self.space.coords(chosen) if chosen else None
        while len(out) < n and rem:
            picks = self._rng.choice(len(rem), size=min(len(rem), 20), replace=False)
            cand = [rem[i] for i in picks]
            if chosen_x is None or len(chosen_x) == 0:
                best = cand[0]
            else:
                cx = self.space.coords(cand)
                dist = np.sqrt(((cx[:, None, :] - chosen_x[None, :, :]) ** 2).sum(-1)).min(1)
                best = cand[int(np.argmax(dist))]
            out.append(best)
            rem.remove(best)
            bx = self.space.coords([best])
            chosen_x = bx if chosen_x is None else np.vstack([chosen_x, bx])
        return out

    def _pool(self) -> list[Key]:
        rem = self.remaining()
        if len(rem) <= _POOL_LIMIT:
            return rem
        picks = self._rng.choice(len(rem), size=_POOL_LIMIT // 2, replace=False)
        pool = {rem[i] for i in picks}
        for k in self._elites(10):
            pool.update(nb for nb in self.space.neighbours(k) if nb not in self.proposed)
        return list(pool)

    def _elites(self, n: int) -> list[Key]:
        ok = sorted((v, k) for k, v in self.observed.items() if math.isfinite(v))
        return [k for _, k in ok[:n]]

    def _ask(self, n: int) -> list[Key]:
        ok = {k: v for k, v in self.observed.items() if math.isfinite(v) and v > 0}
        if len(self.observed) < self.n_init or len(ok) < 3:
            out = self._initial(n)
            if out or len(ok) < 3:
                return out
        pool = self._pool()
        if not pool:
            return []
        try:
            return self._acquire(ok, pool, n)
        except (np.linalg.LinAlgError, FloatingPointError, ValueError):
            return self._local(n) or self._initial(n)

    def _acquire(self, ok: dict[Key, float], pool: list[Key], n: int) -> list[Key]:
        keys = list(ok)
        x = self.space.coords(keys)
        y = np.log(np.asarray([ok[k] for k in keys]))
        # full hyper-parameter search on the first fits, then a light one every other batch
        if self._ls is None or self._fits < 2:
            gp = _fit_gp(x, y, self._ls, self._noise, sweeps=2)
        elif self._fits % 2 == 0:
            gp = _fit_gp(x, y, self._ls, self._noise, sweeps=1)
        else:
            try:
                gp = _GP(x, y, self._ls, self._noise)
            except np.linalg.LinAlgError:
                gp = _fit_gp(x, y, self._ls, self._noise, sweeps=1)
        self._ls, self._noise = gp.ls, gp.noise
        self._fits += 1
        # configs asked for but not told yet (the tuner compiles the next batch while the GPU
        # measures this one) join as "believed" points: the batch is not spent next to them
        pending = [k for k in self.proposed if k not in self.observed and k not in self.dropped]
        px = self.space.coords(pool + pending)
        p_ok = self._p_ok(px)
        mu, var, v = gp.posterior(px)
        best_y = float(gp.y.min())
        out: list[Key] = []
        alive = np.zeros(len(px), dtype=bool)
        alive[: len(pool)] = True
        updates: list[tuple[np.ndarray, float]] = []

        def believe(i: int) -> np.ndarray:
            # kriging believer: observing the predicted mean at px[i] leaves the posterior mean
            # as it is and shrinks the variance around px[i] (rank-one update)
            cov = _matern_from(_sqdiff(px, px[i : i + 1])[:, 0:1, :], gp.ls)[:, 0] - v.T @ v[:, i]
            for c_j, d_j in updates:
                cov -= c_j * c_j[i] / d_j
            denom = float(var[i]) + gp.noise
            updates.append((cov, denom))
            return np.maximum(var - cov * cov / denom, 1e-12)

        for i in range(len(pool), len(px)):
            var = believe(i)
        for _ in range(min(n, len(pool))):
            sd = np.sqrt(np.maximum(var, 1e-12))
            z = (best_y - mu) / sd
            ei = sd * (z * _norm_cdf(z) + _norm_pdf(z)) * p_ok
            ei[~alive] = -1.0
            i = int(np.argmax(ei))
            if ei[i] <= 1e-9:
                break
            out.append(pool[i])
            alive[i] = False
            var = believe(i)
        if len(out) < n:
            taken = set(out)
            for k in self._local(n - len(out), exclude=taken):
                out.append(k)
                taken.add(k)
            if len(out) < n:
                out += [k for k in self._initial(n - len(out)) if k not in taken]
        return out

    def _p_ok(self, px: np.ndarray) -> np.ndarray:
        """Kernel-weighted share of correct results near each candidate (prior 0.9)."""
        keys = list(self.observed)
        if not keys or self._ls is None:
            return np.ones(len(px))
        okv = np.asarray([1.0 if math.isfinite(self.observed[k]) else 0.0 for k in keys])
        if okv.all():
            return np.ones(len(px))
        w = _matern_from(_sqdiff(px, self.space.coords(keys)), np.maximum(self._ls, 0.05) * 0.5)
        prior = 1.0
        return (w @ okv + 0.9 * prior) / (w.sum(1) + prior)

    def _local(self, n: int, exclude: set[Key] = frozenset()) -> list[Key]:  # type: ignore[assignment]
        out: list[Key] = []
        for k in self._elites(len(self.observed)):
            for nb in self.space.neighbours(k):
                if nb in self.proposed or nb in exclude or nb in out:
                    continue
                if nb in self._feasible():
                    out.append(nb)
                    if len(out) >= n:
                        return out
        return out

    def _feasible(self) -> set[Key]:
        if not hasattr(self, "_feasible_set"):
            self._feasible_set = set(self.space.keys)
        return self._feasible_set


def make_strategy(name: str, space: Space, *, budget: int, seed: int = 0,
                  default: dict[str, int] | None = None) -> Strategy:
    """``auto`` = exhaustive when the space fits the budget, else model-guided."""
    if name == "auto":
        name = "exhaustive" if len(space) <= budget else "model"
    cls = {"exhaustive": Exhaustive, "random": RandomSearch, "model": ModelGuided}.get(name)
    if cls is None:
        raise ValueError(f"unknown strategy {name!r} (choose from {', '.join(STRATEGIES)})")
    return cls(space, seed=seed, budget=budget, default=default)
