"""A training script as Gaudi clusters start it, under ``mpirun -np N``: Lightning starts no process of its own.

``python mpirun_run.py --out DIR --face trainer|fabric --devices D --num-nodes K [--mpi4py]`` trains a small model on
HPUs with DDP, then does it again with a second Trainer (or Fabric) in the same process, and writes
``DIR/rank<R>.json``: the ranks, node and device each run saw, the trained weights, and what Gaudi's bridge makes of
the process (``initialize_distributed_hpu``: ranks and card). With ``--mpi4py`` the script imports MPI first, as
scripts that use it do; without, mpi4py cannot be imported, as on a Gaudi image that lacks it.
"""

import json
import os
import sys
from argparse import ArgumentParser

parser = ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--face", choices=("trainer", "fabric"), default="trainer")
parser.add_argument("--devices", type=int, default=2)
parser.add_argument("--num-nodes", type=int, default=1)
parser.add_argument("--mpi4py", action="store_true")
args = parser.parse_args()
if args.mpi4py:
    from mpi4py import MPI

    assert MPI.COMM_WORLD.Get_size() == int(os.environ["OMPI_COMM_WORLD_SIZE"])
else:
    sys.modules["mpi4py"] = None  # type: ignore[assignment]  # `import mpi4py` fails, as where it is not installed

import torch  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

import lightning_fabric as lf  # noqa: E402
import pytorch_lightning as pl  # noqa: E402


def _with_trainer() -> dict:
    model = BoringModel()
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        max_steps=3,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    strategy = trainer.strategy
    return {
        "environment": type(strategy.cluster_environment).__name__,
        "ranks": [trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size],
        "device": str(strategy.root_device),
        "weight": model.layer.weight.detach().cpu().flatten().tolist(),
    }


def _with_fabric() -> dict:
    fabric = lf.Fabric(accelerator="hpu", devices=args.devices, num_nodes=args.num_nodes, strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    for _ in range(3):
        batch = torch.randn(4, 32, device=fabric.device) + fabric.global_rank  # each rank its own data
        fabric.backward(model(batch).square().sum())
        optimizer.step()
        optimizer.zero_grad()
    environment = fabric.strategy.cluster_environment
    return {
        "environment": type(environment).__name__,
        "ranks": [fabric.global_rank, fabric.local_rank, fabric.node_rank, fabric.world_size],
        "device": str(fabric.device),
        "weight": model.weight.detach().cpu().flatten().tolist(),
    }


from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu  # noqa: E402

run = _with_trainer if args.face == "trainer" else _with_fabric
first = run()
# what Gaudi's bridge does when its hccl module loads (during the first run): RANK, LOCAL_RANK, WORLD_SIZE and
# HLS_MODULE_ID from Open MPI's variables; a later run in the same process reads the ranks anew all the same
world_size, rank, local_rank = initialize_distributed_hpu()
bridge = {"ranks": [rank, local_rank, world_size], "card": os.environ.get("HLS_MODULE_ID")}
second = run()
found = {"first": first, "second": second, "bridge": bridge}
with open(os.path.join(args.out, f"rank{first['ranks'][0]}.json"), "w") as file:
    json.dump(found, file)
