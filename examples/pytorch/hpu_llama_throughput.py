"""Measure the training throughput of a small Llama on Intel Gaudi (HPU): tokens per second, model FLOPs utilization
(MFU) and peak HPU memory, over steady steps, with a check that those steps compile nothing and never wait for the
host.

The model is a Hugging Face ``transformers`` Llama built from a config and the tokens are random, so nothing is
downloaded. It trains in ``bf16-mixed`` with each decoder layer compiled by ``torch.compile(backend="hpu_backend")``
in ``configure_model``. On a Gaudi node, or without one on the virtual Gaudi::

    python examples/pytorch/hpu_llama_throughput.py --size small --devices 8
    VIRTUAL_HPU=1 python examples/pytorch/hpu_llama_throughput.py --devices 2

The first ``--warmup-steps`` compile and are left out. Over the next ``--timed-steps`` it measures tokens per second
and MFU (Lightning's ``Throughput`` and ``measure_flops``, against the peak of the Gaudi generation present); over
the ``--counted-steps`` after them it counts host syncs (``DeviceOpCounter``, which works at PyTorch's dispatcher
and so on a real Gaudi too). Graph compilations come from the bridge's ``graph_compilation`` metric. ``--out DIR``
saves each rank's figures as ``rank<N>.json``. The options ``--compile``, ``--optimizer`` and ``--read-loss`` select
the variants compared in ``hpu_performance_levers.py``.
"""

import json
import time
from argparse import ArgumentParser
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.utilities.throughput import Throughput, get_available_flops, measure_flops
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM

import pytorch_lightning as pl
from pytorch_lightning.accelerators import HPUAccelerator


@dataclass(frozen=True)
class Size:
    """The shape of the model and of one device's batch."""

    width: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    sequence: int
    batch: int


SIZES = {
    # seconds on the virtual Gaudi: for rehearsals and the examples' tests
    "tiny": Size(width=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256, sequence=64, batch=8),
    # about 125 M parameters (GPT-2 small's width and depth, Llama's layers, grouped-query attention): for a Gaudi
    "small": Size(width=768, layers=12, heads=12, kv_heads=4, ffn=2048, vocab=32000, sequence=1024, batch=8),
}


def llama_config(size: Size, attention: str) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.width,
        intermediate_size=size.ffn,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.sequence,
        use_cache=False,
        attn_implementation=attention,
    )


class RandomTokens(Dataset):
    """``rows`` sequences of random token ids, the same in every process."""

    def __init__(self, rows: int, size: Size) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, size.vocab, (rows, size.sequence), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]


class LlamaModule(pl.LightningModule):
    """A Llama with random initial weights, trained to predict the next token.

    Args:
        compile: ``"layers"`` compiles each decoder layer in ``configure_model`` (they share one compiled graph),
            ``"model"`` the whole Llama, ``"none"`` nothing.
        optimizer: ``"torch"`` for ``torch.optim.AdamW`` as torch runs it on a Gaudi, a loop over the parameters,
            ``"torch-fused"`` for ``torch.optim.AdamW(fused=True)`` (torch 2.7 and newer on HPUs) and ``"hpex"`` for
            Gaudi's ``FusedAdamW``.
        read_loss: read the loss on the host every step (``self.log(..., loss.item())``), as code written for CUDA
            often does, instead of logging the tensor once per epoch.
        attention: transformers' attention, ``"eager"`` (written out in ops) or ``"sdpa"``.
    """

    def __init__(
        self,
        size: Size,
        compile: str = "layers",
        optimizer: str = "torch",
        read_loss: bool = False,
        attention: str = "eager",
    ) -> None:
        super().__init__()
        self.size, self.compile_mode, self.optimizer_name, self.read_loss = size, compile, optimizer, read_loss
        self.model = LlamaForCausalLM(llama_config(size, attention))
        self.flops_per_batch = self._flops_per_batch(attention)
        self._compiled = False

    def _flops_per_batch(self, attention: str) -> int:
        """Forward and backward FLOPs of one device's batch, counted on a copy on the meta device."""
        with torch.device("meta"):
            model = LlamaForCausalLM(llama_config(self.size, attention))
            tokens = torch.zeros(self.size.batch, self.size.sequence, dtype=torch.long)
        return measure_flops(model, lambda: self._loss(model, tokens), loss_fn=lambda loss: loss)

    @staticmethod
    def _loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        # an explicit mask: without one, transformers looks for packed sequences in each batch, and that check reads a
        # device value on the host (masking_utils.find_packed_sequence_indices) wherever the model runs uncompiled
        return model(input_ids=tokens, attention_mask=torch.ones_like(tokens), labels=tokens).loss

    def configure_model(self) -> None:
        if self._compiled:
            return
        self._compiled = True
        if self.compile_mode == "layers":
            # in place, so parameter names and checkpoints stay those of the plain model
            for layer in self.model.model.layers:
                layer.compile(backend="hpu_backend")
        elif self.compile_mode == "model":
            self.model.compile(backend="hpu_backend")

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self._loss(self.model, batch)
        if self.read_loss:
            self.log("train_loss", loss.item(), on_step=True, prog_bar=True)
        else:
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # the same hyperparameters for all: FusedAdamW's defaults differ from torch's (eps=1e-6, weight_decay=0)
        settings = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
        if self.optimizer_name == "hpex":
            from habana_frameworks.torch.hpex.optimizers import FusedAdamW

            return FusedAdamW(self.parameters(), **settings)
        if self.optimizer_name == "torch-fused":
            return torch.optim.AdamW(self.parameters(), fused=True, **settings)
        # torch's default on a Gaudi, whose device is not among those torch has multi-tensor kernels for; the virtual
        # Gaudi, where it runs as torch's PrivateUse1 backend, would get those
        return torch.optim.AdamW(self.parameters(), foreach=False, **settings)


# ops that hand a value computed on the device to the host (``.item()``, ``float(t)`` and ``if t:`` reach the first)
_READ_VALUES = {"aten._local_scalar_dense", "aten.equal", "aten.allclose"}
# ops whose output size depends on the values of their input: the host must learn it before it can go on
_SIZED_BY_VALUES = {
    "aten.nonzero",
    "aten.masked_select",
    "aten._unique",
    "aten._unique2",
    "aten.unique_dim",
    "aten.unique_consecutive",
    "aten.unique_dim_consecutive",
}


class DeviceOpCounter(TorchDispatchMode):
    """While active, counts the ops that run on ``device_type`` and, among them, the host syncs: ops that hand a
    device value to the host (``.item()``, ``float(t)``, ``if t:``, ``torch.equal``), copies from the device to host
    memory (``.cpu()``, ``.tolist()``, ``.numpy()``), and ops whose output size depends on the data (``nonzero``,
    ``masked_select``, indexing with a boolean mask, ``unique``). Printing a tensor is not seen: PyTorch turns such
    modes off while it formats one.

    It watches PyTorch's dispatcher, which every op passes on a Gaudi as on the virtual one, so it counts on hardware,
    where the bridge has no counter of host syncs. It says it ignores ``torch.compile``'s internals, so dynamo keeps
    compiling while it is active (torch 2.9 and newer); older torch runs a function it has not compiled yet eagerly
    under any such mode, so count steps that compile nothing. Each op costs a Python call: count, then measure time
    without it.
    """

    def __init__(self, device_type: str = "hpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.ops = 0
        self.host_syncs: Counter = Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        devices = {leaf.device.type for leaf in tree_leaves((args, kwargs, out)) if isinstance(leaf, torch.Tensor)}
        if self.device_type in devices:
            self.ops += 1
            name = str(func.overloadpacket)
            if self._waits_for_the_device(name, func._overloadname, args, kwargs, out):
                self.host_syncs[name] += 1
        return out

    def _waits_for_the_device(self, name: str, overload: str, args: tuple, kwargs: dict, out: Any) -> bool:
        if name in _READ_VALUES or name in _SIZED_BY_VALUES:
            return True
        if name == "aten._to_copy":
            return out.device.type == "cpu"
        if name == "aten.copy_":
            return args[0].device.type == "cpu"
        if name == "aten.index":  # x[mask]: as many rows as the mask has True values
            return any(isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in args[1])
        if name == "aten.repeat_interleave":  # repeats in a tensor, and no output_size to say their total
            return overload != "self_int" and kwargs.get("output_size") is None
        return False


@dataclass
class Figures:
    """What one rank measured."""

    rank: int
    world_size: int
    device: str
    parameters: int
    tokens_per_batch: int
    timed_steps: str
    counted_steps: str
    tokens_per_sec: float = 0.0  # all ranks together
    tokens_per_sec_per_device: float = 0.0
    mfu: Optional[float] = None
    peak_flops: Optional[int] = None
    warmup_seconds: float = 0.0  # the first steps, with their compilations
    peak_memory: int = 0
    memory_limit: int = 0
    compilations_in_steady_steps: int = 0
    graphs_traced: int = 0  # graphs dynamo captured during the fit
    ops_traced: int = 0  # ops dynamo captured into them
    host_syncs: Optional[dict] = None  # per op, over the counted steps
    host_syncs_per_step: float = 0.0
    optimizer_ops_per_step: float = 0.0  # ops on the device in each optimizer step, over the counted steps


class SteadySteps(pl.Callback):
    """Times the training steps after ``warmup`` ones, then counts host syncs and device ops over ``counted`` more.

    A window starts and ends at the start of a step, so that it holds whole steps, whatever the Trainer and the other
    callbacks do between them; the fit must run one step past the last window.
    """

    def __init__(self, warmup: int, timed: int, counted: int) -> None:
        self.warmup, self.timed, self.counted = warmup, timed, counted
        self.figures: Optional[Figures] = None
        self._counter: Optional[DeviceOpCounter] = None
        self._optimizer_counter: Optional[DeviceOpCounter] = None
        self._optimizer_ops = 0
        self._started = self._timed_start = self._warmup_seconds = 0.0
        self._compilations = 0
        self._dynamo = (0, 0)

    @property
    def steps(self) -> int:
        """The steps the fit must run."""
        return self.warmup + self.timed + self.counted + 1

    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._dynamo = _dynamo_counts()
        self._started = time.perf_counter()

    def on_train_batch_start(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self.warmup:
            torch.hpu.synchronize()
            self._timed_start = time.perf_counter()
            self._compilations = _compilations()
            self._warmup_seconds = self._timed_start - self._started
        elif step == self.warmup + self.timed:
            torch.hpu.synchronize()
            self._measure(trainer, pl_module, time.perf_counter() - self._timed_start)
            self._counter = DeviceOpCounter()
            self._counter.__enter__()
        elif step == self.steps - 1:
            self._stop_counting()

    def on_before_optimizer_step(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", optimizer: Any) -> None:
        if self._counter is not None:
            self._optimizer_counter = DeviceOpCounter()
            self._optimizer_counter.__enter__()

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", *args: Any) -> None:
        if self._optimizer_counter is not None:
            self._optimizer_counter.__exit__(None, None, None)
            self._optimizer_ops += self._optimizer_counter.ops
            self._optimizer_counter = None

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._stop_counting()

    def _measure(self, trainer: "pl.Trainer", pl_module: "LlamaModule", seconds: float) -> None:
        size = pl_module.size
        tokens = size.batch * size.sequence
        peak = get_available_flops(trainer.strategy.root_device, torch.bfloat16)
        throughput = Throughput(available_flops=peak, world_size=trainer.world_size, window_size=2)
        throughput.update(time=0.0, batches=0, samples=0, lengths=0, flops=0)
        throughput.update(
            time=seconds,
            batches=self.timed,
            samples=self.timed * size.batch,
            lengths=self.timed * tokens,
            flops=self.timed * pl_module.flops_per_batch,
        )
        metrics = throughput.compute()
        per_device = metrics["device/items_per_sec"]
        self.figures = Figures(
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            device=HPUAccelerator.get_device_name(),
            parameters=sum(parameter.numel() for parameter in pl_module.parameters()),
            tokens_per_batch=tokens,
            timed_steps=f"{self.warmup}-{self.warmup + self.timed - 1}",
            counted_steps=f"{self.warmup + self.timed}-{self.steps - 2}",
            tokens_per_sec=per_device * trainer.world_size,
            tokens_per_sec_per_device=per_device,
            mfu=metrics.get("device/mfu"),
            peak_flops=peak,
            warmup_seconds=self._warmup_seconds,
        )

    def _stop_counting(self) -> None:
        if self._counter is None or self.figures is None:
            return
        self._counter.__exit__(None, None, None)
        figures, counter = self.figures, self._counter
        self._counter = None
        figures.host_syncs = dict(counter.host_syncs)
        figures.host_syncs_per_step = sum(counter.host_syncs.values()) / self.counted
        figures.optimizer_ops_per_step = self._optimizer_ops / self.counted
        figures.compilations_in_steady_steps = _compilations() - self._compilations
        graphs, ops = _dynamo_counts()
        figures.graphs_traced, figures.ops_traced = graphs - self._dynamo[0], ops - self._dynamo[1]
        figures.peak_memory = torch.hpu.max_memory_allocated()
        figures.memory_limit = torch.hpu.memory_stats()["Limit"]


def _compilations() -> int:
    """Graphs the bridge compiled in this process, as Gaudi users count recompilations."""
    from habana_frameworks.torch.hpu.metrics import metric_global

    return int(dict(metric_global("graph_compilation").stats())["TotalNumber"])


def _dynamo_counts() -> tuple[int, int]:
    """Graphs dynamo captured and the ops in them, in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"]


def train(
    size: Size,
    devices: int = 1,
    warmup: int = 3,
    timed: int = 10,
    counted: int = 2,
    callbacks: Optional[list] = None,
    **variant: Any,
) -> Optional[Figures]:
    """Fit the Llama for the steps the measurement needs; this rank's figures (None where the fit stopped early)."""
    pl.seed_everything(0)
    meter = SteadySteps(warmup, timed, counted)
    trainer = pl.Trainer(
        accelerator="hpu",
        devices=devices,
        precision="bf16-mixed",
        max_steps=meter.steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        callbacks=[meter, *(callbacks or [])],
    )
    model = LlamaModule(size, **variant)
    trainer.fit(model, DataLoader(RandomTokens(meter.steps * size.batch * devices, size), batch_size=size.batch))
    return meter.figures


def describe(figures: Figures, size_name: str) -> str:
    """The figures, as rank 0 prints them."""
    mfu = "no MFU (no published peak)" if figures.mfu is None else f"MFU {figures.mfu * 100:.3g} %"
    syncs = ", ".join(f"{count} {op}" for op, count in sorted(figures.host_syncs.items())) or "none"
    first_steady, last_steady = figures.timed_steps.split("-")[0], figures.counted_steps.split("-")[1]
    memory = f"{_bytes(figures.peak_memory)} of {_bytes(figures.memory_limit)}"
    lines = [
        f"llama-{size_name} ({figures.parameters / 1e6:.1f} M parameters) on {figures.world_size} x {figures.device},"
        f" bf16-mixed, {figures.tokens_per_batch} tokens per device and step",
        f"  steps {figures.timed_steps}: {figures.tokens_per_sec:,.0f} tokens/s"
        f" ({figures.tokens_per_sec_per_device:,.0f} per device), {mfu}",
        f"  peak HPU memory (rank {figures.rank}): {memory}",
        f"  warm-up: {figures.warmup_seconds:.1f} s; dynamo traced {figures.graphs_traced} graph(s) of"
        f" {figures.ops_traced} ops",
        f"  steps {first_steady}-{last_steady}: {figures.compilations_in_steady_steps} graph compilations;"
        f" steps {figures.counted_steps}: host syncs {syncs}",
    ]
    return "\n".join(lines)


def _bytes(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--timed-steps", type=int, default=10)
    parser.add_argument("--counted-steps", type=int, default=2)
    parser.add_argument("--compile", choices=("layers", "model", "none"), default="layers")
    parser.add_argument("--optimizer", choices=("torch", "torch-fused", "hpex"), default="torch")
    parser.add_argument("--read-loss", action="store_true", help="read the loss on the host every step")
    # eager by default: the virtual Gaudi cannot yet run transformers' "sdpa" attention compiled under bf16 autocast
    parser.add_argument("--attention", choices=("eager", "sdpa"), default="eager", help="transformers' attention")
    parser.add_argument("--out", help="save each rank's figures as DIR/rank<N>.json")
    args = parser.parse_args()
    figures = train(
        SIZES[args.size],
        devices=args.devices,
        warmup=args.warmup_steps,
        timed=args.timed_steps,
        counted=args.counted_steps,
        compile=args.compile,
        optimizer=args.optimizer,
        read_loss=args.read_loss,
        attention=args.attention,
    )
    if args.out:
        path = Path(args.out) / f"rank{figures.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(figures)))
    if figures.rank == 0:
        print(describe(figures, args.size), flush=True)


if __name__ == "__main__":
    main()
