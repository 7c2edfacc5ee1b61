"""lightning-habana's ``examples/pytorch/mnist_trainer.py``, reduced: the classifiers of ``mnist_sample.py`` run one
batch (``fast_dev_run=True``) with the example's Trainer and plugins for each run type:

* ``basic``: ``HPUAccelerator()``, ``SingleHPUStrategy()`` (``HPUDDPStrategy()`` with ``--devices`` > 1);
* ``autocast``: the steps under ``torch.autocast("hpu")`` (with ``LOWER_LIST``/``FP32_LIST`` set, the model also
  checks the op lists);
* ``HPUPrecisionPlugin``: ``HPUPrecisionPlugin(device="hpu", precision="bf16-mixed")``;
* ``MixedPrecisionPlugin``: upstream's ``MixedPrecision(device="hpu", precision="bf16-mixed")``;
* ``recipe_caching``: the fit with ``PT_HPU_RECIPE_CACHE_CONFIG=tmp/recipes,True,1024`` in the environment;
* ``fp8_training``: ``HPUPrecisionPlugin(device="hpu", precision="fp8")`` and
  ``plugin.convert_modules(model, replace_layers=True, inference=False)`` before ``fit``;
* ``fp8_inference``: ``convert_modules(model, inference=True, quant=False)`` and a ``test`` run that measures; then
  ``convert_modules(model, inference=True, quant=True)`` and a ``test`` run in fp8. The example did both in one
  process, which Intel Neural Compressor cannot (the migration page): here the measuring run is this process's
  (``--fp8_inference_phase measure``, the default) and the quantizing one a second process's
  (``--fp8_inference_phase quantize``), from the statistics the first wrote;
* ``multi_tenancy``: ``--num_tenants`` processes, each training on ``--devices_per_tenant`` cards of its own
  (``HABANA_VISIBLE_MODULES``) with ``HPUDDPStrategy(start_method="spawn")``.

Only the imports of ``lightning_habana`` changed (see ``docs/source-pytorch/hpu_migration.rst``), and the data:
generated images in place of ``MNISTDataModule``'s download. Unlike the example, a failing run is not silenced:
the example's environment context manager swallowed every exception of the run inside it.
"""

import argparse
import os
import warnings
from contextlib import contextmanager

import torch.multiprocessing as mp
from _support import DigitsDataModule
from lightning_utilities import module_available
from mnist_sample import LitAutocastClassifier, LitClassifier

if module_available("lightning"):
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.plugins.precision import MixedPrecision
else:
    from pytorch_lightning import Trainer, seed_everything
    from pytorch_lightning.plugins.precision import MixedPrecision

from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.plugins import HPUPrecisionPlugin
from pytorch_lightning.strategies import HPUDDPStrategy, SingleHPUStrategy

RUN_TYPES = [
    "basic",
    "autocast",
    "HPUPrecisionPlugin",
    "MixedPrecisionPlugin",
    "recipe_caching",
    "fp8_training",
    "fp8_inference",
]
OPTIONAL_RUN_TYPES = ["multi_tenancy"]
# the example gives tenant ``i`` the port 1234 + i; a base port from the environment keeps parallel test runs apart
TENANT_BASE_PORT = int(os.environ.get("TENANT_BASE_PORT", "1234"))


def parse_args():
    parser = argparse.ArgumentParser(description="lightning-habana's MNIST trainer, reduced")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument(
        "-r", "--run_types", nargs="+", choices=RUN_TYPES + OPTIONAL_RUN_TYPES, default=RUN_TYPES, help="run types"
    )
    parser.add_argument("-n", "--num_tenants", type=int, default=2, help="tenants sharing the node")
    parser.add_argument("-c", "--devices_per_tenant", type=int, default=2, help="cards per tenant")
    parser.add_argument("-d", "--devices", type=int, default=1, help="cards of the other run types")
    parser.add_argument(
        "--fp8_inference_phase", choices=("measure", "quantize"), default="measure", help="fp8_inference's step"
    )
    return parser.parse_args()


@contextmanager
def environment(variables):
    """Set ``variables`` (a dict, or None for none) for the block, then restore what was there."""
    variables = variables or {}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_trainer(model, data_module, plugin, devices=1, strategy=None, stage="fit"):
    if strategy is None:
        strategy = HPUDDPStrategy() if devices > 1 else SingleHPUStrategy()
    trainer = Trainer(
        accelerator=HPUAccelerator(), devices=devices, strategy=strategy, plugins=plugin, fast_dev_run=True
    )
    run = getattr(trainer, stage, None)
    (run if callable(run) else trainer.fit)(model, data_module)


def spawn_tenants(model, data_module, devices, num_tenants):
    """One process per tenant, each seeing only its cards and meeting its ranks at a port of its own."""
    tenants = [
        mp.Process(target=run_trainer, args=(model, data_module, None, devices, HPUDDPStrategy(start_method="spawn")))
        for _ in range(num_tenants)
    ]
    for index, tenant in enumerate(tenants):
        cards = ",".join(str(card) for card in range(index * devices, (index + 1) * devices))
        port = TENANT_BASE_PORT + index
        with environment({"HABANA_VISIBLE_MODULES": cards, "MASTER_PORT": str(port)}):
            print(f"tenant {index}: cards {cards}, port {port}", flush=True)
            tenant.start()
    for tenant in tenants:
        tenant.join()
    failed = [index for index, tenant in enumerate(tenants) if tenant.exitcode != 0]
    if failed:
        raise RuntimeError(f"tenants {failed} failed")


def get_model(run_type):
    # the example's loaders: batches of 32, one worker
    data_module = DigitsDataModule(batch_size=32, num_workers=1)
    if run_type != "autocast":
        return LitClassifier(), data_module
    warnings.warn(
        "To choose the ops autocast runs in bf16 and fp32, give the op list files in LOWER_LIST and FP32_LIST"
        " (Gaudi software 1.19+ reads PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST and PT_HPU_AUTOCAST_FP32_OPS_LIST).",
        stacklevel=1,
    )
    return LitAutocastClassifier(op_override="LOWER_LIST" in os.environ or "FP32_LIST" in os.environ), data_module


def get_plugin(run_type):
    if run_type == "HPUPrecisionPlugin":
        return HPUPrecisionPlugin(device="hpu", precision="bf16-mixed")
    if run_type == "MixedPrecisionPlugin":
        return MixedPrecision(device="hpu", precision="bf16-mixed")
    if run_type.startswith("fp8"):
        return HPUPrecisionPlugin(device="hpu", precision="fp8")
    return None


def run_training(run_type, options, model, data_module, plugin):
    if run_type == "multi_tenancy":
        per_tenant, tenants, cards = options.devices_per_tenant, options.num_tenants, 8
        if per_tenant * tenants > cards:
            per_tenant = min(per_tenant, cards)
            tenants = cards // per_tenant
            warnings.warn(
                f"More cards asked for than a node has: {tenants} tenants of {per_tenant} cards each", stacklevel=1
            )
        if options.verbose:
            print(f"{tenants} tenants of {per_tenant} cards each", flush=True)
        spawn_tenants(model, data_module, per_tenant, tenants)
        return
    stage = "test" if "inference" in run_type else "fit"
    # the example meant to set the cache for `recipe_caching` (it compared the stage, never equal, to that name)
    variables = {"PT_HPU_RECIPE_CACHE_CONFIG": "tmp/recipes,True,1024"} if run_type == "recipe_caching" else None
    with environment(variables):
        run_trainer(model, data_module, plugin, options.devices, stage=stage)


if __name__ == "__main__":
    options = parse_args()
    if options.verbose:
        print(f"options: {options}", flush=True)
    for run_type in options.run_types:
        if "fp8" in run_type and HPUAccelerator.get_device_name() == "GAUDI":
            print(f"{run_type}: no fp8 on first-generation Gaudi, skipped", flush=True)
            continue
        seed_everything(42)
        model, data_module = get_model(run_type)
        model.observed["run_type"] = run_type
        plugin = get_plugin(run_type)
        if run_type == "fp8_training":
            plugin.convert_modules(model, replace_layers=True, inference=False)
        if run_type == "fp8_inference":
            # measure on the test data, or quantize from the measurements of an earlier process
            plugin.convert_modules(model, inference=True, quant=options.fp8_inference_phase == "quantize")
        if options.verbose:
            print(f"run type {run_type}: {type(model).__name__} with plugin {plugin}", flush=True)
        run_training(run_type, options, model, data_module, plugin)
