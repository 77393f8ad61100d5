"""Benchmark: the wire codecs (none, float16, bfloat16, blockwise8): bytes, speed, training quality.

``--bytes``: bytes per microbatch per hop (forward, backward) and per contribution (each part, per
iteration) for GPT-2 124m with the issue's microbatch (4 × 1024 tokens) and for the quality runs'
shapes, from real encodings. ``--speed``: encode and decode MiB/s of a 16 MiB float32 tensor on this
CPU (median of 5). ``--quality``: training from the same seed, every codec side by side in lockstep
(forward, backward and aggregate codec alike), loss per iteration saved after each iteration to
``docs/data/bench_codec-<preset>.json`` (``-seed<N>`` added for a seed other than 0) and plotted to
``docs/img/codec-loss-<preset>.png``:

* ``--engine harness`` (default): ``PipelineHarness`` with the codecs where a swarm decodes
  (``tests/codec_reference.py``): 1 data holder, 2 stages × 2 replicas: the swarm's arithmetic.
* ``--engine lean``: the same parts and AdamW recipe, one replica each, in plain autograd with the codec
  at each hop (an autograd function) and on each part's mean gradient; no fixed point, no hashes (for
  the 124m preset, whose harness iterations take minutes on this CPU). It also runs controls that are
  not wire codecs (``CONTROL_CODECS``: a perturbation far below any codec's rounding, to tell a codec's
  effect from two trainings wandering apart).

``--json PATH`` writes a quality run there (and its plot beside it) instead of ``docs/data/``.

    python benchmarks/bench_codec.py --bytes --speed
    python benchmarks/bench_codec.py --quality --preset small --iterations 300
    python benchmarks/bench_codec.py --quality --engine lean --preset 124m --iterations 300 --budget-h 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codec_figures import result_path, seed_suffix  # benchmarks/, beside this: the saved runs' names

from gwtfp2p.config import WIRE_CODECS, RunSpec
from gwtfp2p.daemon.lifecycle.parts import load_sampler
from gwtfp2p.model.aggregate import make_optimizer
from gwtfp2p.model.gradnorm import clip_scale
from gwtfp2p.model.harness import PipelineHarness
from gwtfp2p.model.presets import get_preset
from gwtfp2p.model.replica import build_parts
from gwtfp2p.transport.compression import WireCodecs, decode, encode, roundtrip, wire_nbytes
from tests.codec_reference import with_codecs

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def bytes_table(family: str, preset: str, microbatch: int, seq_len: int, n_stages: int = 2) -> list[dict]:
    """Per codec: wire bytes of one microbatch's forward and backward per hop, and of each part's contribution."""
    hidden = get_preset(family, preset).hidden
    spec = RunSpec(model_family=family, model_preset=preset, n_stages=n_stages, microbatch_size=microbatch,
                   seq_len=seq_len)
    parts = build_parts(spec)
    numels = [sum(p.numel() for p in group) for group in parts.groups()]
    sample = torch.randn(microbatch, seq_len, hidden)
    rows = []
    for codec in WIRE_CODECS:
        hop = sample.numel() * 4 if codec == "none" else encode(sample, codec).numel()
        assert hop == wire_nbytes(codec, torch.float32, sample.numel())
        contribution = [wire_nbytes("none", torch.int64, n) if codec == "none" else wire_nbytes(codec, torch.float32, n)
                        for n in numels]
        rows.append({"codec": codec, "forward_bytes": hop, "backward_bytes": hop, "hop_bytes": 2 * hop,
                     "contribution_bytes": contribution})
    return rows


def print_bytes() -> None:
    for family, preset, mb, seq in (("gpt2", "124m", 4, 1024), ("gpt2", "124m", 4, 64), ("gpt2", "small", 4, 64)):
        rows = bytes_table(family, preset, mb, seq)
        base = rows[0]["hop_bytes"]
        print(f"\n{family}-{preset}, microbatch {mb} x {seq} tokens, 2 stages: bytes per microbatch per hop "
              f"(forward + backward) and per contribution (data holder part, stage 1, stage 2; per iteration)")
        print(f"{'codec':<11}{'forward':>12}{'backward':>12}{'per hop':>12}{'vs none':>9}   contributions")
        for r in rows:
            parts = " / ".join(f"{b / MIB:.2f}" for b in r["contribution_bytes"])
            print(f"{r['codec']:<11}{r['forward_bytes']:>12,}{r['backward_bytes']:>12,}{r['hop_bytes']:>12,}"
                  f"{base / r['hop_bytes']:>8.2f}x   {parts} MiB")


def print_speed(rounds: int = 5) -> None:
    x = torch.randn(4 * MIB)  # 16 MiB of float32
    print(f"\nencode / decode of 16 MiB float32 on this CPU ({torch.get_num_threads()} threads), median of {rounds}")
    for codec in WIRE_CODECS[1:]:
        enc, dec = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            payload = encode(x, codec)
            enc.append(time.perf_counter() - t)
            t = time.perf_counter()
            decode(payload, codec, torch.float32, tuple(x.shape))
            dec.append(time.perf_counter() - t)
        err = (roundtrip(x, codec) - x).pow(2).mean().sqrt() / x.pow(2).mean().sqrt()
        print(f"{codec:<11} encode {16 / statistics.median(enc):7.0f} MiB/s   "
              f"decode {16 / statistics.median(dec):7.0f} MiB/s   relative RMS error {float(err):.2e}")


# Controls, not wire codecs (lean engine only): float32 with its mantissa rounded to this many significant
# bits (round half to even; relative error <= 2**-bits), a perturbation far smaller than float16's 11 bits,
# to tell a codec's systematic effect on the loss from the divergence any perturbation of training starts.
CONTROL_CODECS = {"float32-m16": 16}


def lean_roundtrip(x: torch.Tensor, codec: str) -> torch.Tensor:
    """What a receiver gets for ``x`` under a wire codec or a control (``CONTROL_CODECS``)."""
    if codec not in CONTROL_CODECS:
        return roundtrip(x, codec)
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, |mantissa| in [0.5, 1)
    steps = 2.0 ** CONTROL_CODECS[codec]
    return torch.ldexp(torch.round(mantissa * steps) / steps, exponent)


class WireHop(torch.autograd.Function):
    """A hop of the lean engine: the forward codec on the way out, the backward codec on the way back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, codecs: tuple[str, str]) -> torch.Tensor:  # type: ignore[override]
        ctx.codec = codecs[1]
        return lean_roundtrip(x.detach(), codecs[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return lean_roundtrip(grad.contiguous(), ctx.codec), None


class LeanPipeline:
    """One replica per part, the swarm's parts, AdamW recipe and global clipping, in plain autograd.
    ``codecs``: (forward, backward, aggregate), each a wire codec or a control (``CONTROL_CODECS``)."""

    def __init__(self, spec: RunSpec, codecs: tuple[str, str, str]) -> None:
        self.spec, self.codecs, self.parts = spec, codecs, build_parts(spec)
        self.groups = self.parts.groups()
        self.optimizers = [make_optimizer(group, spec) for group in self.groups]

    def run_iteration(self, batches: list[torch.Tensor]) -> float:
        dh, losses = self.parts.data_holder, []
        for ids in batches:
            hidden = dh.head(ids)
            for stage in self.parts.stages:
                hidden = stage(WireHop.apply(hidden, self.codecs[:2]))
            loss = dh.tail(WireHop.apply(hidden, self.codecs[:2]), ids)
            (loss / len(batches)).backward()
            losses.append(float(loss))
        total_sq = 0.0
        for group in self.groups:  # each part's mean gradient travels in the aggregate codec
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            flat = lean_roundtrip(flat, self.codecs[2])
            offset = 0
            for p in group:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            total_sq += float(flat.double().pow(2).sum())
        scale = clip_scale(total_sq, self.spec.grad_clip)
        for group, optimizer in zip(self.groups, self.optimizers, strict=True):
            for p in group:
                p.grad.mul_(scale)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        return sum(losses) / len(losses)


def quality(args: argparse.Namespace) -> None:
    spec = RunSpec(model_family="gpt2", model_preset=args.preset, n_stages=2, seed=args.seed, lr=args.lr,
                   microbatch_size=args.microbatch, seq_len=args.seq_len, microbatches_per_dh=args.microbatches)
    sampler = load_sampler(spec, 0, 1)
    codecs = list(args.codecs)
    if args.engine == "harness":
        runs = {c: with_codecs(PipelineHarness(spec, replicas=[2, 2]), WireCodecs(c, c, c)) for c in codecs}
    else:
        runs = {c: LeanPipeline(spec, (c, c, c)) for c in codecs}
    out = args.json or result_path(args.preset, args.seed)
    result = {"spec": vars(spec), "engine": args.engine, "codecs": codecs, "losses": {c: [] for c in codecs},
              "seconds": {c: 0.0 for c in codecs}, "in_sync": True if args.engine == "harness" else None}
    started = time.time()
    for t in range(args.iterations):
        batches = sampler.iteration(t, spec.microbatches_per_dh)
        for codec, run in runs.items():
            began = time.perf_counter()
            if args.engine == "harness":
                r = run.run_iteration(t, {0: batches})
                result["in_sync"] = result["in_sync"] and r.replicas_in_sync()
                loss = r.mean_loss
            else:
                loss = run.run_iteration(batches)
            result["seconds"][codec] += time.perf_counter() - began
            result["losses"][codec].append(loss)
        result["iterations"] = t + 1
        out.write_text(json.dumps(result, indent=1))
        print(f"iteration {t}: " + "  ".join(f"{c} {result['losses'][c][-1]:.4f}" for c in codecs), flush=True)
        if args.budget_h and time.time() - started > args.budget_h * 3600:
            print(f"stopped after {t + 1} iterations: the {args.budget_h} h budget is spent")
            break
    summarize(result)
    plot(result, args.json.with_suffix(".png") if args.json else plot_path(args.preset, args.seed))


def plot_path(preset: str, seed: int) -> Path:
    """Where a quality run's quick plot goes (docs/bandwidth.md's figures come from ``codec_figures.py``)."""
    return ROOT / "docs" / "img" / f"codec-loss-{preset}{seed_suffix(seed)}.png"


def final_loss(losses: list[float], window: int) -> float:
    """The mean of the last ``window`` losses (one batch's loss is noisy)."""
    return statistics.fmean(losses[-window:])


def summarize(result: dict) -> None:
    n = result["iterations"]
    window = max(1, min(20, n // 10))
    base = final_loss(result["losses"]["none"], window)
    print(f"\nfinal loss (mean of the last {window} of {n} iterations), same seed and batches; replicas in sync: "
          f"{result['in_sync']}")
    for codec, losses in result["losses"].items():
        final = final_loss(losses, window)
        print(f"{codec:<11} {final:.4f}  {100 * (final - base) / base:+6.2f} % vs none   "
              f"{result['seconds'][codec] / n:.2f} s per iteration")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(2, 1))
    none = torch.tensor(result["losses"]["none"])
    for codec, losses in result["losses"].items():
        values = torch.tensor(losses)
        top.plot(values.numpy(), label=codec, linewidth=1)
        bottom.plot((100 * (values - none) / none).numpy(), label=codec, linewidth=1)
    spec = result["spec"]
    top.set_title(f"gpt2-{spec['model_preset']}, {spec['microbatches_per_dh']} x {spec['microbatch_size']} x "
                  f"{spec['seq_len']} tokens per iteration, seed {spec['seed']} ({result['engine']})")
    top.set_ylabel("training loss")
    top.legend()
    bottom.set_ylabel("vs none (%)")
    bottom.set_xlabel("iteration")
    bottom.axhline(0, color="grey", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--quality", action="store_true")
    parser.add_argument("--engine", choices=("harness", "lean"), default="harness")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--microbatch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--codecs", nargs="+", default=list(WIRE_CODECS), choices=(*WIRE_CODECS, *CONTROL_CODECS),
                        help=f"wire codecs; with --engine lean also the controls {', '.join(CONTROL_CODECS)}")
    parser.add_argument("--json", type=Path, help="write the quality run here instead of docs/data/")
    parser.add_argument("--budget-h", type=float, default=0.0, help="stop after this many hours (0: none)")
    parser.add_argument("--replot", action="store_true", help="plot and summarize the saved JSON of --preset")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small matrices: one is fastest here)")
    args = parser.parse_args()
    if args.engine != "lean" and set(args.codecs) & set(CONTROL_CODECS):
        parser.error("the control codecs need --engine lean (the harness runs wire codecs only)")
    if "none" not in args.codecs:
        parser.error("--codecs: include none (every figure is a difference to it)")
    torch.set_num_threads(args.threads)
    if args.replot:
        result = json.loads(result_path(args.preset, args.seed).read_text())
        summarize(result)
        plot(result, plot_path(args.preset, args.seed))
        return
    if args.bytes:
        print_bytes()
    if args.speed:
        print_speed()
    if args.quality:
        quality(args)


if __name__ == "__main__":
    main()
