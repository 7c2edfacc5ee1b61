"""Per-step time of 2-process data-parallel training: ``hpu_parallel`` (HCCL) against CPU DDP over gloo, in one run.

The same model, data, optimizer and seed are trained with ``pl.Trainer(devices=2)`` on HPUs
(``strategy="hpu_parallel"``) and on the CPU (``strategy="ddp"``, gloo). Both run in the same two processes: this
script is rank 0, Lightning starts rank 1, and the two alternate fits of each kind (the order swaps every repeat), each
fit with its own process group, so machine noise hits both alike and process start-up is paid once. Per kind it
prints median [min, max] milliseconds per training step on rank 0 after warm-up, and whether both kinds end with the
same loss; last line ``ddp_ratio=<float>``, the hpu/cpu ratio of the median step times. On the virtual Gaudi it also
prints rank 0's host syncs and graphs per steady-state HPU step (targets: 0 and 2, as on one device). The script runs
in lazy mode, where graph cuts exist, unless ``PT_HPU_LAZY_MODE`` says otherwise.

    python benchmarks/distributed.py [--fast] [--repeats N] [--steps N]
"""

import os
import statistics
import time
import warnings
from argparse import ArgumentParser

from _common import interleaved, is_virtual, print_table, spread, use_gaudi_or_virtual

use_gaudi_or_virtual()
# the per-step graphs the strategy cuts exist in lazy mode only, the legacy mode, which has to be asked for
os.environ.setdefault("PT_HPU_LAZY_MODE", "1")

import torch  # noqa: E402
import torch.distributed  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402

WIDTH, BATCH, CLASSES, RANKS = 512, 128, 10, 2
WARMUP = 3
KINDS = {"hpu": "hpu_parallel", "cpu": "ddp"}


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.network = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)
        )
        self.step_starts: list = []
        self.step_counters: list = []  # the virtual Gaudi's counters at the start of each HPU step
        self.backend = ""
        self.last_loss = None

    def on_train_start(self) -> None:
        self.backend = torch.distributed.get_backend()

    def on_train_batch_start(self, batch: tuple, batch_idx: int) -> None:
        self.step_starts.append(time.perf_counter())
        if self.device.type == "hpu" and is_virtual():
            from virtual_hpu import accounting

            self.step_counters.append(accounting.counters())

    def training_step(self, batch: tuple, batch_idx: int) -> Tensor:
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.network(inputs), targets)
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(accelerator: str, steps: int) -> dict:
    """One fit on two processes; this rank's milliseconds per steady-state step, backend and final loss."""
    generator = torch.Generator().manual_seed(1)
    samples = steps * BATCH * RANKS
    data = TensorDataset(
        torch.randn(samples, WIDTH, generator=generator), torch.randint(0, CLASSES, (samples,), generator=generator)
    )
    model = Classifier()
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=RANKS,
        strategy=KINDS[accelerator],
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=BATCH))
    # the next fit, possibly of the other kind, starts its own process group
    torch.distributed.destroy_process_group()
    starts = model.step_starts[WARMUP:]
    counters = model.step_counters[WARMUP:]
    per_step = {}
    if counters:
        first, last, count = counters[0], counters[-1], len(counters) - 1
        per_step = {key: (last[key] - first[key]) / count for key in ("host_syncs", "graphs")}
    return {
        "ms": [(later - earlier) * 1000 for earlier, later in zip(starts, starts[1:])],
        "per_step": per_step,
        "backend": model.backend,
        "loss": model.last_loss.cpu(),
    }


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short fit of each kind (smoke test)")
    parser.add_argument("--repeats", type=int, default=8, help="fits of each kind")
    parser.add_argument("--steps", type=int, default=25, help="training steps per fit")
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 4) if args.fast else (args.repeats, args.steps)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    results = interleaved(KINDS, repeats, lambda kind, _: fit(kind, steps))
    if int(os.environ.get("LOCAL_RANK", 0)) != 0:
        return  # rank 1 shares rank 0's stdout: only rank 0 reports

    rows = []
    same = all(torch.equal(hpu["loss"], cpu["loss"]) for hpu, cpu in zip(results["hpu"], results["cpu"]))
    for kind, fits in results.items():
        ms = [value for result in fits for value in result["ms"]]
        counts = fits[-1]["per_step"]
        syncs, graphs = (f"{counts['host_syncs']:.2f}", f"{counts['graphs']:.2f}") if counts else ("-", "-")
        rows.append(
            [kind, KINDS[kind], fits[0]["backend"], spread(ms), syncs, graphs, f"{fits[-1]['loss'].item():.6f}"]
        )
    # fits of the two kinds taken one after the other saw the same machine load
    ratios = [
        statistics.median(hpu["ms"]) / statistics.median(cpu["ms"]) for hpu, cpu in zip(results["hpu"], results["cpu"])
    ]
    print(
        f"{RANKS} processes, {repeats} fit(s) x {steps} steps per kind, first {WARMUP} steps of each fit left out;"
        f" MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch {BATCH} per process, AdamW"
    )
    header = ["device", "strategy", "backend", "ms/step (rank 0)", "host syncs/step", "graphs/step", "final loss"]
    print_table(header, rows)
    print(f"hpu/cpu ratio of the median step times of fits taken one after the other: {spread(ratios, 3)}")
    print(f"final losses of hpu and cpu runs bitwise equal: {'yes' if same else 'no'}")
    print(f"ddp_ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
