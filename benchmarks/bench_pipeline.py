"""Benchmark: the in-process pipeline harness vs single-process training of the same model.

For each configuration, both train the same model from the same seed on the same microbatches
(the embedded corpus, byte tokenizer) in one run, on this CPU, and we print side by side:
tokens/s of each and their ratio, the largest loss difference (against a plain float32 loop, see
``PlainSingleProcess``: rounding-level; docs/model.md), and memory per part:
parameter bytes (weights + gradients + two AdamW moments; a part also holds its int64 exact gradient
sum, 8 bytes per parameter, which a plain single process does not need) and the bytes of activations autograd
saves (distinct non-parameter storages seen by a saved-tensor hook; allocator overhead and
transient workspaces are not counted) per microbatch and at peak. Wall times are never asserted.

    python benchmarks/bench_pipeline.py            # default sweep (a few minutes on 2 cores)
    python benchmarks/bench_pipeline.py --quick    # tiny configurations only
    python benchmarks/bench_pipeline.py --presets  # parameter-count table of every preset
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.model.aggregate import make_optimizer
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.data import load_documents, sampler_for, tokenize_documents
from gwtfp2p.model.harness import PipelineHarness, microbatch_id
from gwtfp2p.model.ledger import Ledger
from gwtfp2p.model.presets import PRESETS, count_parameters
from gwtfp2p.model.tokenizer import ByteTokenizer


@dataclass(frozen=True)
class Case:
    family: str
    preset: str
    stages: int
    replicas: int
    data_holders: int
    microbatches_per_dh: int
    microbatch_size: int
    seq_len: int
    iterations: int


QUICK = [Case("gpt2", "tiny", 2, 1, 1, 4, 4, 64, 4), Case("llama", "tiny", 4, 3, 2, 2, 4, 64, 4)]
DEFAULT = [
    *QUICK,
    Case("gpt2", "small", 2, 1, 1, 4, 4, 128, 3),
    Case("llama", "small", 3, 2, 2, 2, 4, 128, 3),
    Case("gpt2", "124m", 4, 1, 1, 2, 2, 128, 2),
    Case("llama", "124m", 4, 1, 1, 2, 2, 128, 2),
]


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def unsplit_saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Activation bytes autograd saves for one microbatch of the unsplit model (a metered forward)."""
    meter = [0]
    with torch.enable_grad(), Ledger(model).metering(meter):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    del loss
    return meter[0]


class PlainSingleProcess:
    """The baseline as one would write it: ``loss.backward()`` per microbatch accumulating into
    ``.grad`` (float32), ``/= n``, ``clip_grad_norm_`` over the whole model, one AdamW step (the
    run's hyper-parameters and weight-decay groups). No exact sums: nothing here slows it down."""

    def __init__(self, spec: RunSpec, vocab: int) -> None:
        self.model = build_from_spec(spec, vocab)
        self.params = list(self.model.parameters())
        self.optimizer = make_optimizer(self.params, spec)
        self.max_norm = spec.grad_clip

    def step(self, microbatches: list[torch.Tensor]) -> list[float]:
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for ids in microbatches:
            loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            losses.append(float(loss.detach()))
        for p in self.params:
            p.grad /= len(microbatches)
        torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.optimizer.step()
        return losses


def run_case(case: Case, tokens: torch.Tensor) -> dict:
    """Train the case both ways; returns its figures."""
    spec = RunSpec(model_family=case.family, model_preset=case.preset, n_stages=case.stages, seed=0,
                   microbatch_size=case.microbatch_size, seq_len=case.seq_len,
                   microbatches_per_dh=case.microbatches_per_dh, grad_clip=1.0, lr=3e-4)
    vocab = ByteTokenizer.vocab_size
    samplers = [sampler_for(spec, tokens, d, case.data_holders) for d in range(case.data_holders)]
    harness = PipelineHarness(spec, vocab, replicas=case.replicas, data_holders=case.data_holders)
    reference = PlainSingleProcess(spec, vocab)
    unsplit_bytes = unsplit_saved_bytes(reference.model, samplers[0].microbatch(0, 0))
    times = {"single": 0.0, "harness": 0.0}
    dloss = 0.0
    for it in range(case.iterations + 1):  # iteration 0 warms up and is not timed
        batches = {d: s.iteration(it, case.microbatches_per_dh) for d, s in enumerate(samplers)}
        start = time.perf_counter()
        ref_losses = reference.step([x for d in sorted(batches) for x in batches[d]])
        mid = time.perf_counter()
        result = harness.run_iteration(it, batches, order_seed=it)
        end = time.perf_counter()
        if it > 0:
            times["single"] += mid - start
            times["harness"] += end - mid
        pipe = [result.losses[microbatch_id(d, it, i)] for d in sorted(batches) for i in range(len(batches[d]))]
        dloss = max(dloss, *(abs(a - b) for a, b in zip(ref_losses, pipe, strict=True)))
    n_tokens = case.iterations * case.data_holders * case.microbatches_per_dh * case.microbatch_size * case.seq_len
    return {"case": case, "single_tps": n_tokens / times["single"], "harness_tps": n_tokens / times["harness"],
            "dloss": dloss, "loss": result.mean_loss, "unsplit_bytes": unsplit_bytes,
            "reference_param_bytes": 4 * sum(p.numel() * p.element_size() for p in reference.params),
            "parts": _part_memory(harness)}


def _part_memory(harness: PipelineHarness) -> list[tuple[str, dict[str, int]]]:
    parts = [("data holder", harness.data_holders[0].memory_stats())]
    for k, group in enumerate(harness.stages, start=1):
        stats = [r.memory_stats() for r in group]
        parts.append((f"stage {k}", max(stats, key=lambda s: s["peak_saved_activation_bytes"])))
    return parts


def print_results(results: list[dict]) -> None:
    print("| model | S | replicas | DHs | mb x B x T | single tok/s | harness tok/s | ratio | max dloss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        c = r["case"]
        print(f"| {c.family}-{c.preset} | {c.stages} | {c.replicas} | {c.data_holders} | "
              f"{c.data_holders * c.microbatches_per_dh} x {c.microbatch_size} x {c.seq_len} | "
              f"{r['single_tps']:.0f} | {r['harness_tps']:.0f} | {r['harness_tps'] / r['single_tps']:.2f} | "
              f"{r['dloss']:.1e} |")
    print()
    print("| model | part | params+grads+AdamW (+exact sum) MiB | activations/microbatch MiB | peak saved MiB | "
          "tail transient MiB |")
    print("|---|---|---|---|---|---|")
    for r in results:
        c = r["case"]
        name = f"{c.family}-{c.preset} S={c.stages}"
        print(f"| {name} | unsplit model | {_mib(r['reference_param_bytes'])} | {_mib(r['unsplit_bytes'])} | "
              f"- | - |")
        for part, m in r["parts"]:
            tail = _mib(m["peak_tail_activation_bytes"]) if "peak_tail_activation_bytes" in m else "-"
            print(f"| {name} | {part} | {_mib(m['parameter_bytes'])} | "
                  f"{_mib(m['activation_bytes_per_microbatch'])} | {_mib(m['peak_saved_activation_bytes'])} | "
                  f"{tail} |")


def print_presets() -> None:
    print("| family | preset | layers | hidden | heads (kv) | params, native vocab | params, byte vocab |")
    print("|---|---|---|---|---|---|---|")
    for family, table in PRESETS.items():
        for name, p in table.items():
            native = count_parameters(family, name)
            byte = count_parameters(family, name, ByteTokenizer.vocab_size)
            print(f"| {family} | {name} | {p.n_layers} | {p.hidden} | {p.heads} ({p.kv_heads or p.heads}) | "
                  f"{native:,} ({p.native_vocab}) | {byte:,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny configurations only")
    parser.add_argument("--presets", action="store_true", help="print the preset table and exit")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: tiny ops on a shared 2-core box run "
                             "slower with more; 0 keeps torch's default)")
    args = parser.parse_args()
    if args.presets:
        print_presets()
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    tokens = tokenize_documents(load_documents(""), ByteTokenizer())
    print(f"corpus: {len(tokens):,} byte tokens; torch threads: {torch.get_num_threads()}\n")
    print_results([run_case(case, tokens) for case in (QUICK if args.quick else DEFAULT)])


if __name__ == "__main__":
    main()
