"""The figures and tables of docs/bandwidth.md, from saved measurements and from the code; measures nothing.

``--plot``: training quality per wire codec from ``docs/data/bench_codec-<preset>.json`` (written by
``bench_codec.py --quality``): the loss curves and the final-loss difference vs ``none``, as PNGs under
``docs/img/bandwidth-*`` and a printed summary. ``--seeds``: the final-loss differences of every saved
seed (``bench_codec-<preset>-seed<N>.json`` beside seed 0's file), printed and plotted. ``--bytes``: the
wire bytes of one microbatch per hop and of each part's aggregation contribution, computed with
``encoded_bytes`` and the parts' parameter counts (models built on the meta device: no weights, no
training), as a markdown table. ``--long FILE ...``: runs past 300 iterations (``bench_codec.py --json``),
each codec's running mean vs ``none``, as a table and ``docs/img/bandwidth-long.png`` (runs of one engine and
seed are merged when their ``none`` losses are equal bit for bit).

    .venv/bin/python benchmarks/codec_figures.py --plot --bytes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
GOAL_PERCENT = 2.0  # issue 16: final loss within 2 % of none
# (what it is, family, preset, microbatch size, sequence length): the shapes docs/bandwidth.md discusses
SHAPES = (
    ("issue 16's example", "gpt2", "124m", 4, 1024),
    ("bench_bandwidth.py default", "gpt2", "small", 8, 256),
    ("bench_codec.py --quality", "gpt2", "small", 4, 64),
    ("gwtf demo, test_shaped_links", "gpt2", "tiny", 4, 64),
)


def running_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and up to ``window - 1`` values before it."""
    return [statistics.fmean(values[max(0, i + 1 - window):i + 1]) for i in range(len(values))]


def percent_vs(losses: list[float], none: list[float]) -> list[float]:
    """Each loss minus ``none``'s of the same iteration, in % of it."""
    return [100.0 * (x - y) / y for x, y in zip(losses, none, strict=True)]


def final_differences(result: dict, window: int) -> dict[str, tuple[float, float]]:
    """Per codec: the mean loss of the last ``window`` iterations and its difference to ``none`` in %."""
    base = statistics.fmean(result["losses"]["none"][-window:])
    out = {}
    for codec in result["codecs"]:
        final = statistics.fmean(result["losses"][codec][-window:])
        out[codec] = (final, 100.0 * (final - base) / base)
    return out


def summarize(result: dict, window: int) -> None:
    n = result["iterations"]
    print(f"{result['spec']['model_family']} preset '{result['spec']['model_preset']}', {n} iterations "
          f"({result['engine']}), replicas in sync: {result['in_sync']}; final loss = mean of the last {window}")
    none = result["losses"]["none"]
    for codec, (final, percent) in final_differences(result, window).items():
        worst = max(map(abs, percent_vs(result["losses"][codec], none)))
        print(f"  {codec:<11}{final:8.4f} {percent:+7.2f} % vs none   worst single iteration {worst:5.2f} %   "
              f"{result['seconds'][codec] / n:5.2f} s per iteration")


def result_path(preset: str, seed: int) -> Path:
    """Where a quality run's JSON goes: ``bench_codec-<preset>.json`` for seed 0, ``-seed<N>`` for others."""
    return ROOT / "docs" / "data" / f"bench_codec-{preset}{seed_suffix(seed)}.json"


def seed_suffix(seed: int) -> str:
    return "" if seed == 0 else f"-seed{seed}"


def seed_runs(preset: str) -> list[dict]:
    """Every saved quality run of ``preset`` (seed 0's file and the ``-seed<N>`` ones), by seed."""
    paths = [result_path(preset, 0), *result_path(preset, 0).parent.glob(f"bench_codec-{preset}-seed*.json")]
    runs = [json.loads(path.read_text()) for path in paths if path.exists()]
    return sorted(runs, key=lambda run: run["spec"]["seed"])


def summarize_seeds(runs: list[dict], window: int) -> dict[str, list[float]]:
    """Per codec: its final loss vs none in % for each run (by seed), printed with their mean and range."""
    per_codec: dict[str, list[float]] = {}
    for run in runs:
        for codec, (_, percent) in final_differences(run, window).items():
            per_codec.setdefault(codec, []).append(percent)
    seeds = ", ".join(f"{run['spec']['seed']} ({run['iterations']} it.)" for run in runs)
    print(f"final loss vs none, mean of the last {window} iterations; seeds {seeds}")
    for codec, values in per_codec.items():
        shown = "  ".join(f"{v:+6.2f}" for v in values)
        print(f"  {codec:<11} {shown}   mean {statistics.fmean(values):+6.2f} %, "
              f"range {min(values):+.2f} to {max(values):+.2f} %")
    return per_codec


def plot_seeds(per_codec: dict[str, list[float]], window: int, path: Path) -> None:
    """The final loss vs none of every seed, one column per codec, with the issue's goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for k, values in enumerate(per_codec.values()):
        ax.scatter([k] * len(values), values, color=f"C{k}", s=18)
        ax.hlines(statistics.fmean(values), k - 0.25, k + 0.25, color=f"C{k}", linewidth=1.5)
    ax.set_xticks(range(len(per_codec)), list(per_codec))
    for y in (-GOAL_PERCENT, GOAL_PERCENT):
        ax.axhline(y, color="red", linewidth=0.6, linestyle="--")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_ylim(-1.25 * GOAL_PERCENT, 1.25 * GOAL_PERCENT)
    ax.set_ylabel("final loss vs none (%)")
    n_seeds = len(next(iter(per_codec.values())))
    ax.set_title(f"{n_seeds} seeds: mean loss of the last {window} iterations vs none (dots: seeds, bars: mean)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_quality(result: dict, window: int, img_dir: Path) -> list[Path]:
    """Both figures of a quality run under ``img_dir``; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    preset = result["spec"]["model_preset"]
    paths = [img_dir / f"bandwidth-loss-{preset}.png", img_dir / f"bandwidth-final-{preset}.png"]
    for draw, path in zip((plot_curves, plot_finals), paths, strict=True):
        fig = draw(plt, result, window)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths


def plot_curves(plt: ModuleType, result: dict, window: int) -> Figure:
    """The loss per iteration (all, then the last 50) and the difference to none, with its running mean."""
    from gwtfp2p.model.presets import get_preset

    spec, n, none = result["spec"], result["iterations"], result["losses"]["none"]
    shape = get_preset(spec["model_family"], spec["model_preset"])
    title = (f"{spec['model_family']} preset '{spec['model_preset']}' ({shape.n_layers} layers, hidden "
             f"{shape.hidden}), {spec['microbatches_per_dh']} x {spec['microbatch_size']} x {spec['seq_len']} "
             f"tokens per iteration, seed {spec['seed']}, {n} iterations ({result['engine']})")
    fig, (full, zoom, diff_ax) = plt.subplots(3, 1, figsize=(9, 10), height_ratios=(2, 1.4, 1.4))
    tail = max(1, n - 50)
    for k, codec in enumerate(result["codecs"]):
        losses, color = result["losses"][codec], f"C{k}"
        full.plot(losses, color=color, linewidth=0.8, label=codec)
        zoom.plot(range(tail, n), losses[tail:], color=color, linewidth=0.8, marker=".", markersize=3, label=codec)
        diff = percent_vs(losses, none)
        diff_ax.plot(diff, color=color, linewidth=0.4, alpha=0.35)
        diff_ax.plot(running_mean(diff, window), color=color, linewidth=1.3, label=f"{codec}, mean of last {window}")
    full.set_title(title, fontsize=8.5)
    full.set_ylabel("training loss")
    full.legend()
    zoom.set_ylabel(f"loss, last {n - tail} iterations")
    zoom.legend(fontsize=8, ncol=4)
    for y in (-GOAL_PERCENT, GOAL_PERCENT):
        diff_ax.axhline(y, color="red", linewidth=0.6, linestyle="--")
    diff_ax.axhline(0, color="grey", linewidth=0.5)
    diff_ax.set_ylabel("vs none (%)")
    diff_ax.set_xlabel("iteration")
    diff_ax.legend(fontsize=8, ncol=2)
    return fig


def plot_finals(plt: ModuleType, result: dict, window: int) -> Figure:
    """The final loss of each codec vs none in %, with the issue's goal."""
    finals = final_differences(result, window)
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    codecs = list(finals)
    bars = ax.bar(codecs, [finals[c][1] for c in codecs], color=[f"C{k}" for k in range(len(codecs))])
    ax.bar_label(bars, labels=[f"{finals[c][1]:+.2f} %" for c in codecs], fontsize=8)
    for y in (-GOAL_PERCENT, GOAL_PERCENT):
        ax.axhline(y, color="red", linewidth=0.6, linestyle="--")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_ylim(-1.25 * GOAL_PERCENT, 1.25 * GOAL_PERCENT)
    ax.set_ylabel("final loss vs none (%)")
    ax.set_title(f"mean loss of the last {window} of {result['iterations']} iterations vs none "
                 f"(goal: within {GOAL_PERCENT:g} %)", fontsize=9)
    return fig


LONG_COLOURS = {"float16": "C1", "bfloat16": "C2", "blockwise8": "C3", "float32-m16": "black"}  # as plot_curves


def merge_long_runs(results: list[dict]) -> dict[str, dict]:
    """The runs by name (engine, seed); runs of one engine and seed become one, their codecs side by side, only
    if their ``none`` losses are equal bit for bit (the same training, so each codec is compared with it)."""
    runs: dict[str, dict] = {}
    for result in results:
        name = f"{result['engine']}, seed {result['spec']['seed']}"
        if name not in runs:
            runs[name] = {**result, "codecs": list(result["codecs"]), "losses": dict(result["losses"])}
            continue
        run = runs[name]
        if result["losses"]["none"] != run["losses"]["none"]:
            raise SystemExit(f"--long: two runs named '{name}' trained differently (their none losses differ); "
                             "pass runs of one seed made by the same code with the same settings")
        for codec in result["codecs"]:
            if codec not in run["codecs"]:
                run["codecs"].append(codec)
                run["losses"][codec] = result["losses"][codec]
    return runs


def long_differences(run: dict, window: int) -> dict[str, list[float]]:
    """Per codec but ``none``: its loss vs ``none`` in %, as a ``window``-iteration running mean."""
    none = run["losses"]["none"]
    return {codec: running_mean(percent_vs(run["losses"][codec], none), window) for codec in run["codecs"][1:]}


def long_table(runs: dict[str, dict], window: int, marks: tuple[int, ...] = (300, 500, 1000)) -> None:
    """Markdown: per run and codec, the ``window``-iteration mean loss vs none at ``marks``, and the widest
    excursion of that mean after the first mark."""
    print(f"| run | codec | {' | '.join(f'at {m}' for m in marks)} | widest after {marks[0]} |")
    print("|---|---|" + "---:|" * (len(marks) + 1))
    for name, run in runs.items():
        for codec, diff in long_differences(run, window).items():
            at = [f"{diff[m - 1]:+.2f} %" if m <= len(diff) else "—" for m in marks]
            widest = max(diff[marks[0]:], key=abs, default=0.0)
            print(f"| {name} | `{codec}` | {' | '.join(at)} | {widest:+.2f} % |")


def plot_long(runs: dict[str, dict], window: int, path: Path) -> None:
    """One panel per run: each codec's loss vs none, its ``window``-iteration running mean, with the goal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.4 * len(runs)), sharex=True, squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        widest = 1.2 * GOAL_PERCENT  # the y range: the goal, or the widest excursion if wider (never clipped)
        for codec, diff in long_differences(run, window).items():
            widest = max(widest, *(abs(x) for x in diff))
            ax.plot(diff, color=LONG_COLOURS.get(codec, "C4"), linewidth=1.1, label=codec)
        for y in (-GOAL_PERCENT, GOAL_PERCENT):
            ax.axhline(y, color="red", linewidth=0.6, linestyle="--")
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_ylim(-1.05 * widest, 1.05 * widest)
        ax.set_ylabel("vs none (%)")
        ax.set_title(f"{name}: loss vs none, mean of the last {window} iterations", fontsize=9)
        ax.legend(fontsize=8, ncol=4, loc="lower left")
    axes[-1, 0].set_xlabel("iteration")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def part_sizes(family: str, preset: str, n_stages: int = 2) -> list[int]:
    """Parameters of each part (data holder, stage 1..S) with the byte tokenizer, counted on the meta device."""
    import torch
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    from gwtfp2p.model.partition import split_model
    from gwtfp2p.model.presets import model_config

    cls = GPT2LMHeadModel if family == "gpt2" else LlamaForCausalLM
    with torch.device("meta"):
        model = cls(model_config(family, preset, 257))
    return [sum(p.numel() for p in group) for group in split_model(model, n_stages).groups()]


def bytes_tables() -> None:
    """Markdown: per shape and codec, forward/backward bytes per hop and each part's contribution."""
    from gwtfp2p.config import WIRE_CODECS, encoded_bytes
    from gwtfp2p.model.presets import get_preset

    for what, family, preset, microbatch, seq_len in SHAPES:
        values = microbatch * seq_len * get_preset(family, preset).hidden
        parts = part_sizes(family, preset)
        print(f"\n{family}-{preset}, {microbatch} x {seq_len} tokens ({what}): {values:,} values per hop; "
              f"parts (data holder, stage 1, stage 2): {', '.join(f'{p:,}' for p in parts)} parameters\n")
        print("| codec | forward per hop | backward per hop | forward + backward | vs none | "
              "contribution: data holder / stage 1 / stage 2 |")
        print("|---|---:|---:|---:|---:|---|")
        base = 2 * encoded_bytes("none", values, 4)
        for codec in WIRE_CODECS:
            hop = encoded_bytes(codec, values, 4)
            contribution = [p * 8 if codec == "none" else encoded_bytes(codec, p, 4) for p in parts]
            shown = " / ".join(f"{c:,} B" if c < MIB else f"{c / MIB:.2f} MiB" for c in contribution)
            print(f"| `{codec}` | {hop:,} B | {hop:,} B | {2 * hop:,} B | {base / (2 * hop):.2f}x | {shown} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", action="store_true", help="plot and summarize the saved quality run")
    parser.add_argument("--seeds", action="store_true", help="summarize and plot every saved seed of --preset")
    parser.add_argument("--bytes", action="store_true", help="print the computed bytes tables")
    parser.add_argument("--preset", default="small", help="which docs/data/bench_codec-<preset>.json")
    parser.add_argument("--window", type=int, default=20, help="iterations averaged for the final loss")
    parser.add_argument("--long", nargs="+", type=Path, metavar="JSON",
                        help="long quality runs (bench_codec.py --json): their table and docs/img/bandwidth-long.png")
    args = parser.parse_args()
    if args.long:
        runs = merge_long_runs([json.loads(p.read_text()) for p in args.long])
        long_table(runs, args.window)
        plot_long(runs, args.window, ROOT / "docs" / "img" / "bandwidth-long.png")
        print("plot: docs/img/bandwidth-long.png")
    if args.plot:
        result = json.loads(result_path(args.preset, 0).read_text())
        summarize(result, args.window)
        for path in plot_quality(result, args.window, ROOT / "docs" / "img"):
            print(f"plot: {path.relative_to(ROOT)}")
    if args.seeds:
        runs = seed_runs(args.preset)
        path = ROOT / "docs" / "img" / f"bandwidth-seeds-{args.preset}.png"
        plot_seeds(summarize_seeds(runs, args.window), args.window, path)
        print(f"plot: {path.relative_to(ROOT)}")
    if args.bytes:
        bytes_tables()


if __name__ == "__main__":
    main()
