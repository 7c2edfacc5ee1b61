"""2-process data-parallel training: our ``hpu_parallel`` Trainer step against lightning-habana 1.6.0's, on the same
virtual Gaudi, in lazy and in eager mode.

Each fit trains the same MLP with AdamW from the same seed on the same rows (each rank its own half of every global
batch, as in ``distributed.py``) in 2 processes over HCCL, either with

- ours: ``pytorch_lightning.Trainer(accelerator="hpu", devices=2, strategy="hpu_parallel")``, in this interpreter;
- the peer: ``lightning.pytorch.Trainer(accelerator=lightning_habana.HPUAccelerator(), devices=2,
  strategy=lightning_habana.HPUParallelStrategy(parallel_devices=[hpu:0, hpu:1]))``, in an environment of its own.

The peer's environment is a virtual environment under ``$XDG_CACHE_HOME/pytorch-lightning-hpu/bench/`` (default
``~/.cache``), built on the first full run and reused afterwards: lightning-habana 1.6.0 with lightning 2.5.5 (the
newest Lightning it imports: 2.5.6 dropped ``LRScheduler`` from ``lightning.fabric.utilities.types``, which its
DeepSpeed strategy imports) and exactly this environment's torch, pinned by a constraints file and checked with
``pip install --dry-run`` before anything is installed. It does not contain our ``pytorch_lightning``: only
``virtual_hpu`` (self-contained, its C++ library cached per torch version and sources, so both sides load the same
one) is put on its path, and each peer rank checks that nothing else of this repository was imported. lightning-habana
imports Gaudi's media loader (``habana_dataloader``, ``habana_frameworks.mediapipe``) whenever ``habana_frameworks``
is importable, and asks ``hl-smi -v`` for the Gaudi software release; the virtual Gaudi has neither, and the peer's
ranks get stand-ins: modules that fail if anything uses them (nothing here does), and an ``hl-smi`` reporting 1.16.0,
the release lightning-habana 1.6.0 was made for. ``--fast`` (the smoke test) never builds the environment: it uses it
where an earlier run built it. Where there is none (``--fast`` on a fresh machine, no network, a real Gaudi), the
benchmark says why and its ratios and headline are ``nan``.

Ours and the peer's fits alternate, the order flipping every repetition, each fit a fresh pair of processes on a fresh
port. Per mode and side it prints median [min, max] milliseconds per step on rank 0 after warm-up (the time between the
starts of consecutive training steps) and the final loss and weights, which must be equal bit for bit (both do the same
math on the same kernels). Ratio per repetition: our median step ÷ the peer's, of the two fits taken one after the
other (target <= 1.0, i.e. lightning-habana ÷ ours >= 1.0). Last line ``lightning_habana_ratio_max=<float>``, the
larger median of the two modes.

    python benchmarks/lightning_habana.py [--fast] [--repeats N] [--steps N]
"""

import fcntl
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from argparse import SUPPRESS, ArgumentParser
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from _common import (
    HERE,
    MODES,
    QUIET_TRAINER,
    SRC,
    classifier,
    interleaved,
    launch_pair,
    print_table,
    rank_rows,
    run_process,
    seeded_mlp,
    spread,
    step_clock,
    summarize,
    use_gaudi_or_virtual,
    weights_digest,
)

WIDTH, BATCH, CLASSES, RANKS = 512, 128, 10, 2
WARMUP = 3
TARGET = 1.0
RUN_MODES = ("lazy", "eager")
SIDES = ("ours", "lightning-habana")
PEER = "lightning-habana==1.6.0"
PEER_LIGHTNING = "lightning==2.5.5"
# the Gaudi software release the peer's stand-in ``hl-smi`` reports: the one lightning-habana 1.6.0 was released for
SYNAPSE = "1.16.0"
# pip over the network fails within about a minute instead of retrying for a quarter of an hour
PIP_NETWORK = ("--timeout", "20", "--retries", "1")


class PeerEnvironment:
    """lightning-habana's virtual environment in the cache, built once with exactly this environment's torch."""

    def __init__(self) -> None:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        self.root = Path(cache) / "pytorch-lightning-hpu" / "bench" / PEER.replace("==", "-")
        self.python = self.root / "bin" / "python"
        torch = importlib.metadata.version("torch")
        self.torch = f"torch=={torch}"
        # what the environment was built from: a different interpreter or torch builds it anew
        self.recipe = {"python": sys.version, "torch": torch, "packages": [PEER, PEER_LIGHTNING, "ninja"]}

    def ready(self) -> bool:
        stamp = self.root / "recipe.json"
        return stamp.exists() and json.loads(stamp.read_text()) == self.recipe

    def build(self) -> str:
        """Build the environment unless it is ready; return what was done, or raise ``RuntimeError`` saying why it
        could not be built."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with open(self.root.with_name(self.root.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another run building it at the same time: wait for it
            if self.ready():
                return f"reused {self.root}"
            start = time.perf_counter()
            shutil.rmtree(self.root, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(self.root)])
            constraints = self.root / "constraints.txt"
            constraints.write_text(self.torch + "\n")
            pip = [str(self.python), "-m", "pip", "install", "--quiet", *PIP_NETWORK, "--constraint", str(constraints)]
            _run([*pip, self.torch])
            packages = self.recipe["packages"]
            report = self.root / "dry-run.json"
            _run([*pip, "--dry-run", "--report", str(report), *packages])
            planned = [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]
            unwanted = sorted(name for name in planned if name in ("torch", "triton") or name.startswith("nvidia-"))
            if unwanted:
                raise RuntimeError(f"installing {' '.join(packages)} would change torch: {unwanted}; nothing installed")
            _run([*pip, *packages])
            (self.root / "recipe.json").write_text(json.dumps(self.recipe))
            size = sum(path.stat().st_size for path in self.root.rglob("*") if path.is_file() and not path.is_symlink())
            return f"built {self.root} in {time.perf_counter() - start:.0f} s, {size / 2**20:.0f} MiB"


def _run(command: list) -> None:
    code, stdout, stderr = run_process(command, timeout=15 * 60.0)
    if code != 0:
        lines = [line for line in (stderr or stdout).splitlines() if line.strip()] or ["no output"]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:]
        raise RuntimeError(f"`{' '.join(Path(part).name for part in command[:4])} ... {command[-1]}`: {errors[0]}")


def peer_environment(fast: bool) -> tuple:
    """(the peer's environment or ``None``, what was done or why there is none)."""
    if os.environ.get("VIRTUAL_HPU") != "1":
        return None, "not run: the peer's environment has the virtual Gaudi only, and this is a real one"
    environment = PeerEnvironment()
    if fast:
        if environment.ready():
            return environment, f"reused {environment.root}"
        return None, f"not run: --fast does not build its environment ({environment.root}); a full run does"
    try:
        return environment, environment.build()
    except RuntimeError as err:
        return None, f"not run: its environment could not be built: {err}"


class _GaudiMediaStandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``habana_dataloader`` and ``habana_frameworks.mediapipe``: names to import, classes that cannot be made."""

    ROOTS = ("habana_dataloader", "habana_frameworks.mediapipe")

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if any(fullname == root or fullname.startswith(root + ".") for root in self.ROOTS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        def stand_in(name: str) -> type:
            if name.startswith("__"):
                raise AttributeError(name)

            def refuse(*args: Any, **kwargs: Any) -> None:
                raise RuntimeError(f"{module.__name__}.{name} is a stand-in: the virtual Gaudi has no media loader")

            return type(name, (), {"__init__": refuse})

        module.__path__ = []
        module.__getattr__ = stand_in  # type: ignore[method-assign]


def fit(side: str, steps: int) -> dict:
    """One fit on this rank; rank 0's step times, final loss, digest of the final weights and what ran."""
    rank = int(os.environ["LOCAL_RANK"])
    if side == "ours":
        use_gaudi_or_virtual()
    else:
        # never our sources: only the virtual Gaudi, which PYTHONPATH holds
        sys.path[:] = [path for path in sys.path if Path(path or ".").resolve() != HERE]
        sys.meta_path.append(_GaudiMediaStandIns())
        import virtual_hpu

        virtual_hpu.activate_from_env()

    import warnings

    import lightning.pytorch as L
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*HPUParallelStrategy will be deprecated.*")

    if side == "ours":
        import pytorch_lightning as pl

        trainer_class, flags = pl.Trainer, {"accelerator": "hpu", "strategy": "hpu_parallel"}
    else:
        from lightning_habana import HPUAccelerator, HPUParallelStrategy

        # its default, ``hpu`` without an index on every rank, is refused by torch >= 2.3's ``init_process_group``
        strategy = HPUParallelStrategy(parallel_devices=[torch.device("hpu", index) for index in range(RANKS)])
        trainer_class, flags = L.Trainer, {"accelerator": HPUAccelerator(), "strategy": strategy}
    clock, milliseconds = step_clock(WARMUP)
    model = classifier(L.LightningModule, lambda: seeded_mlp(WIDTH, CLASSES))
    trainer = trainer_class(
        **flags,
        devices=RANKS,
        max_steps=steps,
        use_distributed_sampler=False,  # each rank already has its own rows
        callbacks=[clock],
        **QUIET_TRAINER,
    )
    trainer.fit(model, DataLoader(rank_rows(steps, rank, BATCH, WIDTH, CLASSES, RANKS), batch_size=BATCH))
    backend = dist.get_backend()
    import virtual_hpu._native

    # the peer must run without our sources: only the virtual Gaudi's, through the import path it was given
    ours = {name.split(".")[0] for name, module in list(sys.modules.items()) if _under(module, SRC)}
    return {
        "ms": milliseconds(),
        "loss": model.last_loss.cpu().item(),
        "weights": weights_digest(model.network),
        "lightning": L.__version__,
        "strategy": f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__name__}",
        "backend": backend,
        "library": virtual_hpu._native._library_path().parent.name,
        "pytorch_lightning": "pytorch_lightning" in sys.modules,
        "our_sources": sorted(ours),
    }


def worker(side: str, steps: int) -> None:
    """One rank of a fit; the peer's ranks first become the peer environment's interpreter (same process)."""
    peer_python = os.environ.get("PEER_PYTHON", "")
    if side != "ours" and peer_python and Path(sys.prefix).resolve() != Path(peer_python).parents[1].resolve():
        os.execv(peer_python, [peer_python, *sys.argv])
    result = fit(side, steps)
    if os.environ["RANK"] == "0":
        print(json.dumps(result))


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one short fit per mode and side (smoke test)")
    parser.add_argument("--repeats", type=int, default=6, help="fits per mode and side")
    parser.add_argument("--steps", type=int, default=40, help="training steps per fit")
    parser.add_argument("--worker", choices=SIDES, help=SUPPRESS)
    args = parser.parse_args()
    repeats, steps = (1, WARMUP + 4) if args.fast else (args.repeats, args.steps)
    if args.worker:
        worker(args.worker, steps)
        return

    use_gaudi_or_virtual()
    environment, peer_status = peer_environment(args.fast)
    print(f"{PEER}: {peer_status}", flush=True)
    sides = SIDES if environment else SIDES[:1]
    cases = [(mode, side) for mode in RUN_MODES for side in sides]
    with tempfile.TemporaryDirectory() as shim:
        # the peer's import path: the virtual Gaudi alone, not the sources around it
        os.symlink(SRC / "virtual_hpu", Path(shim) / "virtual_hpu")
        # lightning-habana asks Gaudi's ``hl-smi -v`` for the software version (its precision plugin needs >= 1.11)
        hl_smi = Path(shim) / "bin" / "hl-smi"
        hl_smi.parent.mkdir()
        hl_smi.write_text(f"#!/bin/sh\necho 'Habanalabs hl-smi/hlml version hl-{SYNAPSE}-fw-0.0.0 (stand-in)'\n")
        hl_smi.chmod(0o755)
        path = f"{hl_smi.parent}{os.pathsep}{os.environ.get('PATH', '')}"

        def measure(case: tuple, repeat: int) -> dict:
            mode, side = case
            extra = {"PT_HPU_LAZY_MODE": MODES[mode][0]}
            if side != "ours":
                extra.update(PYTHONPATH=shim, PATH=path, PEER_PYTHON=str(environment.python))
            return launch_pair(__file__, [side, "--steps", str(steps)], **extra)

        results = interleaved(cases, repeats, measure)

    rows = []
    for (mode, side), fits in results.items():
        last = fits[-1]
        ms = spread([value for result in fits for value in result["ms"]])
        version = f"lightning {last['lightning']}" + (f", {PEER}" if side != "ours" else "")
        rows.append(
            [mode, side, version, last["strategy"], last["backend"], ms, f"{last['loss']:.6f}", last["weights"]]
        )
    print(
        f"{RANKS} processes, virtual Gaudi, {repeats} fit(s) x {steps} steps per mode and side, alternating, first"
        f" {WARMUP} steps of each fit left out; MLP {WIDTH}x{WIDTH}x{WIDTH}x{CLASSES}, batch {BATCH} per process, AdamW"
    )
    print_table(["mode", "side", "versions", "strategy", "backend", "ms/step (rank 0)", "final loss", "weights"], rows)
    medians = []
    for mode in RUN_MODES:
        ours, peer = results[(mode, "ours")], results.get((mode, SIDES[1]), [])
        ratios = [statistics.median(o["ms"]) / statistics.median(p["ms"]) for o, p in zip(ours, peer)] or [math.nan]
        medians.append(summarize(f"{mode}: hpu_parallel step, ours ÷ lightning-habana 1.6.0", ratios, TARGET).median)
        if peer:
            same = all((o["loss"], o["weights"]) == (p["loss"], p["weights"]) for o, p in zip(ours, peer))
            print(f"final losses and weights bitwise equal, ours and lightning-habana ({mode}): {_yes(same)}")
    if environment:
        libraries = {fit["library"] for fits in results.values() for fit in fits}
        print(f"same virtual Gaudi library on both sides: {_yes(len(libraries) == 1)} ({', '.join(libraries)})")
        peer = [fit for (_, side), fits in results.items() if side != "ours" for fit in fits]
        imported = any(fit["pytorch_lightning"] for fit in peer)
        sources = sorted({name for fit in peer for name in fit["our_sources"]})
        print(
            f"lightning-habana's ranks: pytorch_lightning imported: {_yes(imported)}; packages of this repository"
            f" imported from src: {', '.join(sources) or 'none'}"
        )
    print(f"lightning_habana_ratio_max={max(medians):.3f}")


def _under(module: ModuleType, folder: Path) -> bool:
    return str(getattr(module, "__file__", None) or "").startswith(str(folder))


def _yes(condition: bool) -> str:
    return "yes" if condition else "no"


if __name__ == "__main__":
    main()
