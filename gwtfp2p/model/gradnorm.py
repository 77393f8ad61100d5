"""Squared gradient norms that every machine computes to the same bits, and the clip factor.

Owns three rules. A tensor's squared L2 norm: its values squared in float64 (exact for float32
values), summed by a fixed pairwise tree of elementwise additions over blocks of ``BLOCK`` elements
(zero-padded), then over the block sums: no reduction kernel's order or thread count enters. Sums
of such squared norms (over a part's tensors, and over parts for the global norm) are exact sums
rounded once (``math.fsum``), so they depend neither on order nor on how the model is split. And
the clip factor from the total: ``float32(max_norm / (sqrt(total) + 1e-6))`` when that is below 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

BLOCK = 1 << 16  # elements per block of the pairwise tree
GROUP = 64  # blocks reduced at once (bounds the float64 temporary to 32 MiB)
EPS = 1e-6  # added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does


def _halve_rows(x: torch.Tensor) -> torch.Tensor:
    """Sum each row of ``x`` [rows, 2**k] by a pairwise tree of elementwise additions."""
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        x = x[:, :half] + x[:, half:]
    return x[:, 0]


def _tree_sum(values: torch.Tensor) -> float:
    """Pairwise tree sum of a 1-D float64 tensor, zero-padded to a power of two."""
    n = values.numel()
    if n <= 1:
        return float(values[0]) if n else 0.0
    padded = torch.zeros(1 << (n - 1).bit_length(), dtype=torch.float64, device=values.device)
    padded[:n] = values
    return float(_halve_rows(padded.unsqueeze(0))[0])


def _square_rows(pieces: list[torch.Tensor], width: int) -> torch.Tensor:
    """``pieces`` (each <= ``width`` values) as zero-padded rows of float64 squares [len, width]."""
    rows = torch.zeros(len(pieces), width, dtype=torch.float64, device=pieces[0].device)
    for row, piece in zip(rows, pieces, strict=True):
        row[:piece.numel()] = piece
    return rows.mul_(rows)


def tensor_sq_norms(tensors: Iterable[torch.Tensor]) -> list[float]:
    """Each tensor's squared L2 norm, the same bits on every device and thread count.

    Per tensor: blocks of ``BLOCK`` values (the last one zero-padded), each summed by the pairwise
    tree, then the block sums by the tree. A last block holding ``n < BLOCK`` values is summed over
    the next power of two >= n instead (the skipped additions are ``x + 0.0 == x``: the same bits),
    batched with the other tensors' last blocks of that width.
    """
    flats = [t.detach().reshape(-1) for t in tensors]
    block_sums: list[list[torch.Tensor]] = [[] for _ in flats]
    tails: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for i, flat in enumerate(flats):
        full = flat.numel() // BLOCK * BLOCK
        for start in range(0, full, GROUP * BLOCK):
            piece = flat[start:min(start + GROUP * BLOCK, full)]
            block_sums[i].append(_halve_rows(_square_rows([piece], piece.numel()).view(-1, BLOCK)))
        if full < flat.numel():
            rest = flat[full:]
            tails.setdefault(1 << (rest.numel() - 1).bit_length(), []).append((i, rest))
    for width, entries in tails.items():
        sums = _halve_rows(_square_rows([piece for _, piece in entries], width))
        for (i, _), value in zip(entries, sums, strict=True):
            block_sums[i].append(value.reshape(1))
    return [_tree_sum(torch.cat(sums)) if sums else 0.0 for sums in block_sums]


def tensor_sq_norm(tensor: torch.Tensor) -> float:
    """Squared L2 norm of one tensor (see ``tensor_sq_norms``)."""
    return tensor_sq_norms([tensor])[0]


def sq_norm(tensors: Iterable[torch.Tensor]) -> float:
    """Squared L2 norm of several tensors together: their squared norms summed exactly."""
    return math.fsum(tensor_sq_norms(tensors))


def global_sq_norm(part_sq_norms: Iterable[float]) -> float:
    """The whole model's squared norm from every part's: an exact sum (any order, same bits).

    ``inf`` if some part's is infinite, ``nan`` if one is ``nan``.
    """
    return math.fsum(part_sq_norms)


def clip_scale(total_sq_norm: float, max_norm: float) -> float:
    """The factor the mean gradient is multiplied by: a float32 value < 1 when clipping, else 1.0.

    ``total_sq_norm`` must be finite (a non-finite gradient takes no step at all).
    """
    if not math.isfinite(total_sq_norm) or total_sq_norm < 0:
        raise ValueError(f"clip_scale needs a finite squared norm >= 0, got {total_sq_norm!r}")
    coefficient = max_norm / (math.sqrt(total_sq_norm) + EPS)
    if coefficient >= 1.0:
        return 1.0
    return float(torch.tensor(coefficient, dtype=torch.float32))
