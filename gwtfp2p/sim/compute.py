"""Compute model: per-node forward/backward seconds and memory slots from the model and a GPU class.

FLOPs per microbatch follow the usual dense-transformer count (2·params·tokens for the matmuls plus
4·seq·d·tokens per layer for attention; backward = 2 × forward). Saved-activation memory per layer
per microbatch follows Korthikanti et al. 2022 (no recomputation, 16-bit): tokens·d·(34 + 5·a·s/d)
bytes. Static memory is 16 bytes per stage parameter (weights, master copy, Adam moments, grads).
Owns the arithmetic and the named presets; nothing here knows about routers or time.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.config import ConfigError, encoded_bytes

GIB = 2**30
STATIC_BYTES_PER_PARAM = 16  # fp16 weights + fp32 master + Adam m, v + fp16 grads
STATE_BYTES_PER_PARAM = 12  # what a joiner downloads: fp32 weights + Adam m, v
GRAD_BYTES_PER_PARAM = 2  # the all-reduce runs in bf16
USABLE_MEMORY_FRACTION = 0.9  # the rest goes to the CUDA context, allocator slack, buffers


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer and its microbatch shape."""

    name: str
    family: str  # "llama" (SwiGLU, untied head) or "gpt" (GELU MLP, tied head)
    d_model: int
    n_layers: int
    n_heads: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    microbatch: int  # sequences per microbatch
    bytes_per_element: int = 2  # a hidden-state value on the wire under ``none``
    codec: str = "none"  # the run's wire codec (``RunSpec``): sizes on the wire follow it (none: bf16 as computed)
    grad_bytes_per_param: int = GRAD_BYTES_PER_PARAM  # a gradient value in the all-reduce under ``none``

    @property
    def tokens(self) -> int:
        return self.microbatch * self.seq_len

    @property
    def layer_params(self) -> int:
        d = self.d_model
        if self.family == "llama":
            return 4 * d * d + 3 * d * self.ffn_hidden + 2 * d
        return 4 * d * d + 2 * d * self.ffn_hidden + 9 * d + self.ffn_hidden

    @property
    def head_params(self) -> int:
        """Token embeddings (and learned positions for GPT) at the data holder."""
        positions = self.seq_len * self.d_model if self.family == "gpt" else 0
        return self.vocab_size * self.d_model + positions

    @property
    def tail_params(self) -> int:
        """Final norm and LM head (tied to the embeddings for GPT)."""
        head = 0 if self.family == "gpt" else self.vocab_size * self.d_model
        return head + 2 * self.d_model

    @property
    def total_params(self) -> int:
        return self.head_params + self.tail_params + self.n_layers * self.layer_params

    def stage_layers(self, n_stages: int) -> tuple[int, ...]:
        """A balanced split of the layers over ``n_stages`` relay stages."""
        if not 1 <= n_stages <= self.n_layers:
            raise ConfigError(f"--stages: must be within 1..{self.n_layers} for {self.name}, got {n_stages}")
        base, extra = divmod(self.n_layers, n_stages)
        return tuple(base + (1 if i < extra else 0) for i in range(n_stages))

    def stage_forward_flops(self, layers: int) -> float:
        matmul = 2.0 * self.layer_params * self.tokens
        attention = 4.0 * self.seq_len * self.d_model * self.tokens
        return layers * (matmul + attention)

    def tail_forward_flops(self) -> float:
        return 2.0 * self.vocab_size * self.d_model * self.tokens

    @property
    def activation_bytes(self) -> int:
        """One microbatch's hidden states (or their gradient) on the wire, in the wire codec."""
        return encoded_bytes(self.codec, self.tokens * self.d_model, self.bytes_per_element)

    def grad_bytes(self, params: int) -> int:
        """A gradient of ``params`` values in the all-reduce, in the wire codec."""
        return encoded_bytes(self.codec, params, self.grad_bytes_per_param)

    def activation_memory_bytes(self, layers: int) -> float:
        per_layer = self.tokens * self.d_model * (34 + 5 * self.n_heads * self.seq_len / self.d_model)
        return layers * per_layer


@dataclass(frozen=True)
class GpuClass:
    """A GPU as the simulator sees it: sustained training TFLOP/s (bf16, realistic MFU) and memory."""

    name: str
    tflops: float
    memory_gib: float


@dataclass(frozen=True)
class NodeCompute:
    """Seconds per microbatch and how many microbatches' activations fit in memory."""

    forward_s: float
    backward_s: float
    slots: int

    @property
    def per_microbatch_s(self) -> float:
        return self.forward_s + self.backward_s


MODELS: dict[str, ModelSpec] = {
    # LLaMa-like, ~530M parameters (d_model 1024, sequence 1024, microbatch 4)
    "llama500m": ModelSpec("llama500m", "llama", d_model=1024, n_layers=36, n_heads=16, ffn_hidden=2816,
                           vocab_size=32000, seq_len=1024, microbatch=4),
    # GPT-like, the GPT-3 XL shape (~1.3B parameters), sequence 1024, microbatch 4
    "gpt1.3b": ModelSpec("gpt1.3b", "gpt", d_model=2048, n_layers=24, n_heads=16, ffn_hidden=8192,
                         vocab_size=50257, seq_len=1024, microbatch=4),
    # The daemon's own: gwtf's `small` GPT-2 preset with the byte tokenizer, microbatches of 8 x 256 tokens
    # (benchmarks/bench_bandwidth.py). The daemon computes and sends float32 (4 bytes a value under none) and
    # its contributions are exact int64 fixed-point sums (8 bytes a value under none).
    "gpt2-small": ModelSpec("gpt2-small", "gpt", d_model=128, n_layers=6, n_heads=4, ffn_hidden=512,
                            vocab_size=257, seq_len=256, microbatch=8, bytes_per_element=4, grad_bytes_per_param=8),
}

# Sustained throughput ≈ 40-50 % of the dense bf16/fp16 tensor peak (T4 lower: it throttles at 70 W).
GPUS: dict[str, GpuClass] = {
    "t4": GpuClass("t4", tflops=16.0, memory_gib=16.0),
    "rtx3090": GpuClass("rtx3090", tflops=30.0, memory_gib=24.0),
    "v100": GpuClass("v100", tflops=45.0, memory_gib=32.0),
    "rtx4090": GpuClass("rtx4090", tflops=60.0, memory_gib=24.0),
    "a100": GpuClass("a100", tflops=120.0, memory_gib=80.0),
}
HOMOGENEOUS_GPU = "rtx3090"
HETEROGENEOUS_GPUS = ("t4", "rtx3090", "v100", "rtx4090", "a100")


def get_model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(f"--model: unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    return MODELS[name]


def get_gpu(name: str) -> GpuClass:
    if name not in GPUS:
        raise ConfigError(f"--gpu: unknown GPU class {name!r}; choose one of {', '.join(sorted(GPUS))}")
    return GPUS[name]


def relay_compute(model: ModelSpec, layers: int, gpu: GpuClass, slowdown: float = 1.0) -> NodeCompute:
    """A relay serving ``layers`` layers; ``slowdown`` scales its time (location factor)."""
    forward_s = model.stage_forward_flops(layers) / (gpu.tflops * 1e12) * slowdown
    static = STATIC_BYTES_PER_PARAM * layers * model.layer_params
    free = gpu.memory_gib * GIB * USABLE_MEMORY_FRACTION - static
    slots = int(free // model.activation_memory_bytes(layers))
    return NodeCompute(forward_s, 2.0 * forward_s, max(0, slots))


def holder_compute(model: ModelSpec, gpu: GpuClass, slowdown: float = 1.0) -> NodeCompute:
    """A data holder: the head is a lookup (free); the tail (LM head + loss) runs forward and backward."""
    forward_s = model.tail_forward_flops() / (gpu.tflops * 1e12) * slowdown
    return NodeCompute(forward_s, 2.0 * forward_s, slots=1 << 30)


def stage_param_count(model: ModelSpec, stage: int, n_stages: int) -> int:
    """Parameters of relay stage ``stage`` (1..S); stage 0 is the head and tail at the data holders."""
    if stage == 0:
        return model.head_params + model.tail_params
    return model.stage_layers(n_stages)[stage - 1] * model.layer_params
