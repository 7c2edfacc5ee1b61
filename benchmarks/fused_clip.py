"""Gradient clipping by norm on one HPU: Gaudi's fused clip-norm, as the Trainer's ``gradient_clip_val`` and Fabric's
``clip_gradients`` use it (``lightning_fabric.strategies.hpu_clip.HPUGradientClipper``), against torch's
``clip_grad_norm_`` on the same gradients.

The gradients are those of a 6-layer transformer encoder of width 256 (76 parameter tensors) after one backward pass.
Per clip it prints the ops that reach the device (counted by the virtual Gaudi, ``virtual_hpu.accounting``; a real
Gaudi has no such counter and prints ``-``) and the milliseconds, median [min, max] over interleaved repetitions of
a block of clips each; it prints the largest relative difference of the norms and clipped gradients of both, in fp32
(Gaudi's kernel divides the limit by the norm where torch multiplies it by the norm's reciprocal: last-bit
differences). Ratios: fused ÷ torch ops per clip (target <= 0.1; not on a real Gaudi) and time per clip (no target:
on the virtual Gaudi the fused kernel is host code, on a Gaudi a TPC kernel). Last line ``clip_ops_ratio=<float>``
(nan on a real Gaudi).

    python benchmarks/fused_clip.py [--fast]
"""

import time
from argparse import ArgumentParser
from typing import Callable

from _common import interleaved, is_virtual, print_table, spread, summarize, use_gaudi_or_virtual

use_gaudi_or_virtual()

import torch  # noqa: E402
from torch import nn  # noqa: E402

from lightning_fabric.strategies.hpu_clip import HPUGradientClipper  # noqa: E402

MAX_NORM = 1e-3


def gradients() -> list[nn.Parameter]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False).to("hpu")
    model(torch.randn(4, 32, 256, device="hpu")).square().mean().backward()
    return list(model.parameters())


def clippers() -> dict[str, Callable[[list], torch.Tensor]]:
    fused = HPUGradientClipper()
    return {
        "torch clip_grad_norm_": lambda params: torch.nn.utils.clip_grad_norm_(params, MAX_NORM),
        "fused (Lightning on HPU)": lambda params: fused.clip_grad_norm_(params, MAX_NORM),
    }


def ops_per_clip(clip: Callable[[list], torch.Tensor], params: list) -> float:
    if not is_virtual():
        return float("nan")
    from virtual_hpu import accounting

    clip(params)  # the fused clip makes its device-side limit once
    torch.hpu.synchronize()
    accounting.reset()
    clip(params)
    return float(accounting.counters()["ops"])


def main() -> None:
    parser = ArgumentParser()
    parser.add_argument("--fast", action="store_true")
    args = parser.parse_args()
    repeats, block = (3, 5) if args.fast else (15, 20)
    params = gradients()
    saved = [p.grad.clone() for p in params]
    cases = clippers()

    results = {}
    for name, clip in cases.items():
        for p, g in zip(params, saved):
            p.grad.copy_(g)
        norm = clip(params).cpu()
        results[name] = (norm, [p.grad.cpu() for p in params])
    (norm_t, grads_t), (norm_f, grads_f) = results.values()
    assert norm_t > MAX_NORM, "the gradients must be clipped for the comparison to mean anything"
    difference = max(((a - b).abs() / b.abs().clamp_min(1e-30)).max().item() for a, b in zip(grads_t, grads_f))
    difference = max(difference, ((norm_t - norm_f).abs() / norm_t).item())

    def measure(name: str, _: int) -> float:
        clip = cases[name]
        torch.hpu.synchronize()
        start = time.perf_counter()
        for _ in range(block):
            clip(params)
        torch.hpu.synchronize()
        return (time.perf_counter() - start) * 1e3 / block

    times = interleaved(list(cases), repeats, measure)
    ops = {name: ops_per_clip(clip, params) for name, clip in cases.items()}
    rows = [[name, "-" if ops[name] != ops[name] else int(ops[name]), spread(times[name])] for name in cases]
    print(f"{len(params)} gradients; largest relative difference of norm and clipped gradients: {difference:.1e}")
    print_table(["clip", "device ops per clip", "ms per clip"], rows)
    torch_name, fused_name = list(cases)
    ops_ratio = ops[fused_name] / ops[torch_name]
    if ops_ratio == ops_ratio:
        summarize("fused ÷ torch ops per clip", [ops_ratio], 0.1)
    summarize("fused ÷ torch time per clip", [f / t for f, t in zip(times[fused_name], times[torch_name])], None)
    print(f"clip_ops_ratio={ops_ratio:.4f}")


if __name__ == "__main__":
    main()
