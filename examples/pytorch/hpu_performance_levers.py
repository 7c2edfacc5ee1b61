"""Three levers of training speed on Intel Gaudi (HPU), each shown by a count, before and after.

Each lever trains the small Llama of ``hpu_llama_throughput.py`` twice or more, changing one thing, and prints what
changed. The counts come from PyTorch itself (dynamo's counters, and the dispatcher for device ops and host syncs), so
they are the same on a Gaudi and on the virtual Gaudi; without a Gaudi::

    VIRTUAL_HPU=1 python examples/pytorch/hpu_performance_levers.py --lever all

- ``compile``: ``torch.compile`` on each decoder layer in ``configure_model`` instead of on the whole model. Dynamo
  traces one layer, whose graph every layer then runs, so the work of compiling no longer grows with the depth.
- ``optimizer``: the ops one optimizer step launches on the device. ``torch.optim.AdamW`` loops over the parameters on
  HPUs; ``AdamW(fused=True)`` and Gaudi's ``FusedAdamW`` update them together.
- ``host-syncs``: reading the loss on the host every step (``loss.item()``, or a value Lightning shows on the progress
  bar) makes the host wait for the device each step; logging the tensor once per epoch does not.
"""

import dataclasses
from argparse import ArgumentParser
from typing import Any

import torch
from hpu_llama_throughput import SIZES, Figures, Size, train

# enough steps for the counts: they take no time to measure, unlike throughput
STEPS = {"warmup": 3, "timed": 2, "counted": 2}


def _fit(size: Size, **variant: Any) -> Figures:
    # a fresh start for each variant, as a separate run would have: dynamo would otherwise reuse what it compiled
    torch._dynamo.reset()
    return train(size, **STEPS, **variant)


def compile_lever(size: Size) -> str:
    # a deeper model than the others, so that the whole model's trace shows its growth with the layers
    size = dataclasses.replace(size, layers=2 * size.layers)
    whole, layers = _fit(size, compile="model"), _fit(size, compile="layers")
    return (
        f"compile: ops traced by dynamo {whole.ops_traced} -> {layers.ops_traced}"
        f" ({size.layers} layers; graphs traced {whole.graphs_traced} -> {layers.graphs_traced});"
        f" warm-up {whole.warmup_seconds:.1f} s -> {layers.warmup_seconds:.1f} s"
    )


def _torch_fuses_on_hpus() -> bool:
    """Whether torch's ``fused=True`` optimizers take HPU parameters (torch 2.7 and newer)."""
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1, device="hpu"))], fused=True)
    except RuntimeError:
        return False
    return True


def optimizer_lever(size: Size) -> str:
    names = ("torch", "torch-fused", "hpex") if _torch_fuses_on_hpus() else ("torch", "hpex")
    counts = {name: f"{_fit(size, optimizer=name).optimizer_ops_per_step:.0f}" for name in names}
    return (
        f"optimizer: ops per optimizer step: torch.optim.AdamW {counts['torch']},"
        f" AdamW(fused=True) {counts.get('torch-fused', 'n/a (torch 2.7 or newer)')}, hpex FusedAdamW {counts['hpex']}"
    )


def host_sync_lever(size: Size) -> str:
    every_step, per_epoch = _fit(size, read_loss=True), _fit(size, read_loss=False)
    return (
        f"host-syncs: host syncs per step {every_step.host_syncs_per_step:.2f} -> {per_epoch.host_syncs_per_step:.2f}"
        f" (reading the loss every step: {', '.join(sorted(every_step.host_syncs)) or 'none'})"
    )


LEVERS = {"compile": compile_lever, "optimizer": optimizer_lever, "host-syncs": host_sync_lever}


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lever", choices=(*LEVERS, "all"), default="all")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args()
    names = list(LEVERS) if args.lever == "all" else [args.lever]
    lines = [LEVERS[name](SIZES[args.size]) for name in names]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
