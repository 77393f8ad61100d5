"""Benchmark: the exact (fixed-point) gradient sum against the plain float32 sum, and what it buys.

Cost (default): the 124m presets split in 4 stages, byte vocabulary and GPT-2's 50257-token one.
For one stage and the data holder's head+tail, on this CPU, side by side in one run (medians of
runs alternating between the two):
  * per microbatch: forward + backward through the part's executor with the plain sum (autograd
    accumulates every microbatch into the float32 buffer) against the exact one (backward into a
    zeroed buffer, then ``round(g * 2**40)`` to int64 and added; the tied rows held);
  * per iteration, R replicas: reduce (float32 adds and ``/ count`` against int64 adds and the
    rounded mean) plus the norm for clipping (``torch.nn.utils.get_total_norm`` against the
    deterministic pairwise tree);
  * memory and wire bytes, from the tensor sizes.
Fidelity (``--drift``): max |Δloss| over 200 iterations of the tiny presets between the in-process
pipeline (global clipping) and single-process trainers on plain transformers classes
(``tests/unit/model/plain_reference.py``) at three learning rates; plus a plot.

    python benchmarks/bench_exact_sum.py                 # cost (a few minutes on 2 cores)
    python benchmarks/bench_exact_sum.py --drift         # fidelity table and docs/img/exact-sum-drift.png
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import RunSpec
from gwtfp2p.model.aggregate import GradContribution, mean_gradient
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.fixedpoint import CHUNK, FixedPointSum
from gwtfp2p.model.gradnorm import BLOCK, GROUP, sq_norm
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.replica import build_parts

ROOT = Path(__file__).resolve().parents[1]


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _alternate_s(fns: dict[str, Callable[[int], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, run alternately (shared load hits all alike); one warm-up each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(i)
            if i:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _views(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    return [v.view(s) for v, s in zip(flat.split([s.numel() for s in shapes]), shapes, strict=True)]


class _PlainSumStage(StageExecutor):
    """The same executor with the plain sum: nothing is folded, so autograd keeps accumulating every
    microbatch's gradient into the flat float32 buffer (what the executors did before exact sums)."""

    def _fold(self, params=None) -> None:
        pass


class _PlainSumDataHolder(DataHolderExecutor):
    """The data holder's executor with the plain sum (no fold, no held tied rows)."""

    def _fold(self, params=None) -> None:
        pass

    def _fold_rows(self, param, rows) -> None:
        pass

    def _hold_tied_rows(self, mb_id: str) -> None:
        pass

    def _restore_tied_rows(self, mb_id: str) -> None:
        pass


def microbatch_costs(kind: str, module: torch.nn.Module, spec: RunSpec, inputs: torch.Tensor,
                     repeats: int) -> dict[str, float]:
    """One microbatch's forward + backward through the part's executor, with the plain sum and with
    the exact one (backward into a zeroed buffer, then the fold): the only difference between them."""
    grad_out = torch.randn(inputs.shape, generator=torch.Generator().manual_seed(1)) * 1e-3  # stages only
    if kind == "dh":
        executors = {"plain_mb_s": _PlainSumDataHolder(copy.deepcopy(module), spec),
                     "exact_mb_s": DataHolderExecutor(copy.deepcopy(module), spec)}
    else:
        executors = {"plain_mb_s": _PlainSumStage(copy.deepcopy(module), spec, 1),
                     "exact_mb_s": StageExecutor(copy.deepcopy(module), spec, 1)}

    folding = _time_folds(executors["exact_mb_s"])

    def run(executor: StageExecutor | DataHolderExecutor) -> Callable[[int], None]:
        def once(i: int) -> None:
            if isinstance(executor, DataHolderExecutor):
                hidden = executor.head_forward(f"m{i}", inputs)
                _, grad = executor.tail_backward(f"m{i}", hidden)
                executor.head_backward(f"m{i}", grad)
            else:
                executor.forward(f"m{i}", inputs)
                executor.backward(f"m{i}", grad_out)
        return once

    times = _alternate_s({name: run(executor) for name, executor in executors.items()}, repeats)
    return {**times, "fold_s": statistics.median(_per_microbatch(folding, repeats + 1)[1:])}


def _time_folds(executor: StageExecutor | DataHolderExecutor) -> list[float]:
    """Wrap the executor's fold steps (on this instance) so that their seconds are recorded."""
    spent: list[float] = []
    for name in ("_fold", "_fold_rows", "_hold_tied_rows", "_restore_tied_rows"):
        method = getattr(executor, name, None)
        if method is None:
            continue

        def timed(*args, _method=method, **kwargs):
            start = time.perf_counter()
            _method(*args, **kwargs)
            spent.append(time.perf_counter() - start)
        setattr(executor, name, timed)
    return spent


def _per_microbatch(spent: list[float], microbatches: int) -> list[float]:
    """The recorded fold seconds grouped per microbatch (the same number of calls each)."""
    calls = len(spent) // microbatches
    return [sum(spent[i * calls:(i + 1) * calls]) for i in range(microbatches)]


def step_costs(shapes: list[torch.Size], replicas: int, repeats: int) -> dict[str, float]:
    """The end of an iteration with ``replicas`` contributions of 4 microbatches each: reduce and the
    clip norm, float32 (adds, ``/ count``, ``get_total_norm``) against exact (int64 adds, the rounded
    mean, the pairwise-tree norm)."""
    numel = sum(s.numel() for s in shapes)
    gen = torch.Generator().manual_seed(0)
    float_sums = [torch.randn(numel, generator=gen) * 4e-4 for _ in range(replicas)]
    exact = [FixedPointSum(numel) for _ in range(replicas)]
    for acc, g in zip(exact, float_sums, strict=True):
        acc.add(g)
    contributions = [GradContribution(f"r{i}", a.total, 4, a.bound) for i, a in enumerate(exact)]

    def plain(_i: int) -> None:
        total = float_sums[0].clone()
        for g in float_sums[1:]:
            total.add_(g)
        total.div_(4 * replicas)
        torch.nn.utils.get_total_norm(_views(total, shapes), foreach=False)

    def exact_step(_i: int) -> None:
        mean, _ = mean_gradient(contributions, numel=numel)
        sq_norm(_views(mean, shapes))

    return _alternate_s({"plain_step_s": plain, "exact_step_s": exact_step}, repeats)


def cost(families: list[str], batch: int, seq: int, replicas: int, repeats: int) -> list[dict]:
    rows = []
    for family in families:
        for vocab in (257, 50257) if family == "gpt2" else (257,):
            spec = RunSpec(model_family=family, model_preset="124m", n_stages=4, seed=0, seq_len=seq,
                           microbatch_size=batch, vocab_size=vocab, tokenizer="bytes" if vocab == 257 else "hf")
            parts = build_parts(spec, vocab)
            ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(2))
            cases = [(f"{family} data holder (vocab {vocab})", "dh", parts.data_holder, ids)]
            if vocab == 257:
                hidden = torch.randn(batch, seq, parts.data_holder.config.hidden_size)
                cases.append((f"{family} stage (3 of 12 layers)", "stage", parts.stages[0], hidden))
            for name, kind, module, inputs in cases:
                shapes = [p.shape for p in module.parameters()]
                rows.append({"part": name, "numel": sum(s.numel() for s in shapes),
                             **microbatch_costs(kind, module, spec, inputs, repeats),
                             **step_costs(shapes, replicas, repeats)})
            del parts
    return rows


def print_cost(rows: list[dict], batch: int, seq: int, replicas: int) -> None:
    print(f"Per microbatch ({batch} x {seq} tokens, forward + backward) and per iteration ({replicas} replicas):")
    print("| part | params | plain mb s | exact mb s | exact / plain | fold ms (in exact) | fold / plain mb | "
          "plain step ms | exact step ms | exact - plain step ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['part']} | {r['numel'] / 1e6:.1f}M | {r['plain_mb_s']:.3f} | {r['exact_mb_s']:.3f} | "
              f"{r['exact_mb_s'] / r['plain_mb_s']:.2f} | {1e3 * r['fold_s']:.0f} | "
              f"{r['fold_s'] / r['plain_mb_s']:.1%} | {1e3 * r['plain_step_s']:.0f} | "
              f"{1e3 * r['exact_step_s']:.0f} | {1e3 * (r['exact_step_s'] - r['plain_step_s']):.0f} |")
    print()
    print("| part | gradient buffers MiB (plain -> exact) | contribution on the wire MiB | "
          "transients MiB (fold, norm, mean) |")
    print("|---|---|---|---|")
    for r in rows:
        n = r["numel"]
        print(f"| {r['part']} | {4 * n / 2**20:.0f} -> {4 * n / 2**20:.0f} + {8 * n / 2**20:.0f} | "
              f"{4 * n / 2**20:.0f} -> {8 * n / 2**20:.0f} | {12 * CHUNK / 2**20:.0f}, "
              f"{8 * GROUP * BLOCK / 2**20:.0f}, {8 * CHUNK / 2**20:.0f} |")


# -- fidelity ----------------------------------------------------------------------------------------
LEARNING_RATES = (3e-4, 1e-3, 3e-3)


def _windows(spec: RunSpec, iterations: int) -> list[list[torch.Tensor]]:
    """Each iteration's microbatches: 2 data holders x 2 of the embedded corpus (as the unit test)."""
    from gwtfp2p.model.corpus import default_corpus
    from gwtfp2p.model.data import MicrobatchSampler
    from gwtfp2p.model.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    stream = torch.tensor([i for doc in default_corpus()[:300] for i in [*tok.encode(doc), tok.eos_id]],
                          dtype=torch.int32)
    samplers = [MicrobatchSampler(stream, seq_len=spec.seq_len, microbatch_size=spec.microbatch_size,
                                  seed=spec.seed, shard=d, n_shards=2) for d in range(2)]
    return [[x for s in samplers for x in s.iteration(it, 2)] for it in range(iterations)]


def drift(family: str, iterations: int) -> dict[float, dict[str, list[float]]]:
    """Per learning rate, per comparison: max |Δloss| over the iteration's microbatches, per iteration."""
    from gwtfp2p.model.harness import PipelineHarness, microbatch_id
    from tests.unit.model.plain_reference import PlainTrainer, plain_model
    out: dict[float, dict[str, list[float]]] = {}
    for lr in LEARNING_RATES:
        specs = {mode: RunSpec(model_family=family, model_preset="tiny", n_stages=2, seed=3, lr=lr, grad_clip=1.0,
                               microbatch_size=2, seq_len=16, microbatches_per_dh=2, clip_mode=mode)
                 for mode in ("global", "per_part")}
        harnesses = {mode: PipelineHarness(spec, 257, replicas=[2, 1], data_holders=2) for mode, spec in specs.items()}
        spec = specs["global"]
        plains = {g: PlainTrainer(plain_model(family, 257, spec.seed), lr=lr, betas=(spec.beta1, spec.beta2),
                                  eps=spec.adam_eps, weight_decay=spec.weight_decay, max_norm=spec.grad_clip,
                                  gradient=g) for g in ("exact", "conventional")}
        rows: dict[str, list[float]] = {"plain exact": [], "plain conventional": [], "per-part pipeline": []}
        for it, microbatches in enumerate(_windows(spec, iterations)):
            batches = {0: microbatches[:2], 1: microbatches[2:]}
            ids = [microbatch_id(d, it, i) for d in (0, 1) for i in (0, 1)]
            ours = {m: _losses(h.run_iteration(it, batches, order_seed=it).losses, ids) for m, h in harnesses.items()}
            theirs = {g: p.step(microbatches) for g, p in plains.items()}
            rows["plain exact"].append(_max_delta(ours["global"], theirs["exact"]))
            rows["plain conventional"].append(_max_delta(ours["global"], theirs["conventional"]))
            rows["per-part pipeline"].append(_max_delta(ours["per_part"], theirs["exact"]))
        rows["clipped"] = [float(plains["exact"].clipped)]
        out[lr] = rows
    return out


def _losses(losses: dict[str, float], ids: list[str]) -> list[float]:
    return [losses[i] for i in ids]


def _max_delta(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def print_drift(series: dict[str, dict[float, dict[str, list[float]]]]) -> None:
    print("max |Δloss| over all microbatches and iterations, pipeline (global clipping) vs:")
    print("| model | lr | clipped iterations | plain exact | plain conventional | per-part pipeline vs plain exact |")
    print("|---|---|---|---|---|---|")
    for family, by_lr in series.items():
        for lr, rows in by_lr.items():
            n = len(rows["plain exact"])
            print(f"| {family}-tiny | {lr:g} | {int(rows['clipped'][0])} / {n} | {max(rows['plain exact']):.1e} | "
                  f"{max(rows['plain conventional']):.1e} | {max(rows['per-part pipeline']):.1e} |")


def plot_drift(series: dict[str, dict[float, dict[str, list[float]]]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4), sharey=True, squeeze=False)
    for ax, (family, by_lr) in zip(axes[0], series.items(), strict=True):
        for lr, rows in by_lr.items():
            line = ax.plot(_running_max(rows["plain conventional"]), label=f"plain conventional, lr {lr:g}")[0]
            ax.plot(_running_max(rows["per-part pipeline"]), linestyle="--", color=line.get_color(),
                    label=f"per-part pipeline, lr {lr:g}")
        exact = max(max(rows["plain exact"]) for rows in by_lr.values())
        ax.set_title(f"{family}-tiny: pipeline vs plain exact = {exact:g} at every iteration")
        ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("running max |Δloss| vs the pipeline (global clip)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path.relative_to(ROOT)}")


def _running_max(values: list[float]) -> list[float]:
    out, best = [], 1e-9  # the floor keeps zeros on the log scale
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="gpt2,llama")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--drift", action="store_true", help="the fidelity table and plot instead of the cost")
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.drift:
        series = {family: drift(family, args.iterations) for family in args.families.split(",")}
        print_drift(series)
        plot_drift(series, ROOT / "docs" / "img" / "exact-sum-drift.png")
        return
    rows = cost(args.families.split(","), args.batch, args.seq, args.replicas, args.repeats)
    print(f"torch threads: {torch.get_num_threads()}\n")
    print_cost(rows, args.batch, args.seq, args.replicas)


if __name__ == "__main__":
    main()
