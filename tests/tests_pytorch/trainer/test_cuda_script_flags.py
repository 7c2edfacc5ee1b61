"""The Trainer configured as CUDA scripts and lightning-habana's users configure it, with ``accelerator="hpu"``:
upstream strategy instances, ``devices`` lists, a precision plugin given to the strategy, ``barebones=True``."""

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import pytorch_lightning as pl
from lightning_fabric.strategies.hpu_ddp_options import HCCL_DDP_OPTIONS
from pytorch_lightning.accelerators import HPUAccelerator
from pytorch_lightning.plugins import HPUPrecisionPlugin
from pytorch_lightning.plugins.precision.hpu_fsdp import HPUFSDPPrecision
from pytorch_lightning.strategies import (
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
    HPUParallelStrategy,
    SingleHPUStrategy,
)
from tests_pytorch.trainer.test_lightning_trainer_on_hpu import _scripts


@pytest.mark.parametrize("trainer_class", [pl.Trainer, L.Trainer])
@pytest.mark.parametrize(
    ("upstream", "hpu_class", "devices", "settings"),
    [
        (SingleDeviceStrategy(device="cuda:0"), SingleHPUStrategy, 1, {"root_device": torch.device("hpu", 0)}),
        (
            DDPStrategy(find_unused_parameters=True, static_graph=True, process_group_backend="nccl"),
            HPUParallelStrategy,
            2,
            {
                "_ddp_kwargs": {**HCCL_DDP_OPTIONS, "find_unused_parameters": True, "static_graph": True},
                "_get_process_group_backend": "hccl",
            },
        ),
        (DDPStrategy(start_method="spawn"), HPUParallelStrategy, 2, {"_start_method": "spawn"}),
        (
            DeepSpeedStrategy(stage=3, offload_optimizer=True),
            HPUDeepSpeedStrategy,
            2,
            {"zero_stage_3": True, "inference_kwargs": {}},
        ),
        (FSDPStrategy(sharding_strategy="SHARD_GRAD_OP", limit_all_gathers=False), HPUFSDPStrategy, 2, {}),
        (ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), HPUModelParallelStrategy, 2, {}),
    ],
    ids=["single", "ddp", "ddp_spawn", "deepspeed", "fsdp", "model_parallel"],
)
def test_upstream_strategy_instances_become_their_hpu_counterparts(
    trainer_class, upstream, hpu_class, devices, settings
):
    trainer = trainer_class(accelerator="hpu", devices=devices, strategy=upstream, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is hpu_class and strategy is not upstream
    assert isinstance(trainer.accelerator, HPUAccelerator) and trainer.num_devices == devices
    for name, expected in settings.items():
        value = getattr(strategy, name)
        assert (value() if callable(value) else value) == expected, name
    if isinstance(upstream, DeepSpeedStrategy):
        assert strategy.config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    if isinstance(upstream, FSDPStrategy):
        assert strategy.sharding_strategy.name == "SHARD_GRAD_OP" and strategy.kwargs["limit_all_gathers"] is False
    if isinstance(upstream, ModelParallelStrategy):
        assert strategy._data_parallel_size == 2


@pytest.mark.parametrize("trainer_class", [pl.Trainer, L.Trainer])
@pytest.mark.parametrize(
    ("name", "settings"),
    [
        (
            "ddp_find_unused_parameters_true",
            {"_ddp_kwargs": {**HCCL_DDP_OPTIONS, "find_unused_parameters": True}, "_start_method": "popen"},
        ),
        ("ddp_find_unused_parameters_false", {"_ddp_kwargs": {**HCCL_DDP_OPTIONS, "find_unused_parameters": False}}),
        (
            "ddp_spawn_find_unused_parameters_true",
            {"_ddp_kwargs": {**HCCL_DDP_OPTIONS, "find_unused_parameters": True}, "_start_method": "spawn"},
        ),
    ],
)
def test_upstream_ddp_names_with_options_become_the_hpu_strategy(trainer_class, name, settings):
    """GAN scripts name the option (``toggle_optimizer`` leaves the other optimizers' parameters without gradients);
    2-HPU training with it runs in ``multi_device/test_trainer_patterns.py``."""
    trainer = trainer_class(accelerator="hpu", devices=2, strategy=name, logger=False)
    assert type(trainer.strategy) is HPUParallelStrategy
    assert trainer.strategy._get_process_group_backend() == "hccl"
    for attribute, value in settings.items():
        assert getattr(trainer.strategy, attribute) == value


@pytest.mark.parametrize("name", ["ddp_fork", "ddp_notebook", "ddp_notebook_find_unused_parameters_true"])
def test_upstream_names_that_fork_are_refused_with_the_hpu_choices(name):
    with pytest.raises(
        MisconfigurationException, match=rf"strategy='{name}'.*forking.*'hpu_parallel'.*'hpu_parallel_spawn'"
    ):
        pl.Trainer(accelerator="hpu", devices=2, strategy=name)


# DeepSpeed last: it is the one that changes the process for the Trainers after it (its ZeRO-3 linear, undone at
# teardown), as a script's later Trainers would see
_TWO_HPU_CASES = ["ddp_instance", "devices_list", "strategy_precision", "barebones", "deepspeed_instance"]


@pytest.fixture(scope="module")
def two_hpu_runs(tmp_path_factory) -> dict:
    """The script's 2-HPU cases, trained one after another in one launch of 2 ranks, as a script with several Trainers
    does: starting the processes is most of a short run's time."""
    return _scripts(tmp_path_factory.mktemp("cuda_script"), _TWO_HPU_CASES)


def test_ddp_instance_trains_on_two_hpus_with_its_settings(two_hpu_runs):
    ranks = two_hpu_runs["ddp_instance"]
    for rank in ranks:
        assert rank["classes"]["strategy"] == "HPUParallelStrategy" and rank["world_size"] == 2
        # the script's own options, and Intel's bucket size for HCCL, which it left to the strategy
        assert rank["ddp_kwargs"] == {**HCCL_DDP_OPTIONS, "find_unused_parameters": True}
    assert [rank["seen"]["device"] for rank in ranks] == ["hpu:0", "hpu:1"]


def test_deepspeed_instance_trains_on_two_hpus_with_its_settings(two_hpu_runs):
    ranks = two_hpu_runs["deepspeed_instance"]
    for rank in ranks:
        assert rank["classes"]["strategy"] == "HPUDeepSpeedStrategy"
        assert rank["zero"]["stage"] == 3 and rank["zero"]["reduce_bucket_size"] == 12345
        assert rank["classes"]["precision"] == "HPUDeepSpeedPrecisionPlugin" and rank["precision"] == "bf16-mixed"


def test_first_devices_list_is_a_count(two_hpu_runs, caplog):
    with caplog.at_level(logging.INFO):
        trainer = L.Trainer(accelerator="hpu", devices=[0, 1], logger=False)
    assert trainer.num_devices == 2 and isinstance(trainer.strategy, HPUParallelStrategy)
    assert [record.getMessage() for record in caplog.records].count(
        "`Trainer(devices=[0, 1])` on HPUs: using the first 2 HPUs."
    ) == 1
    assert pl.Trainer(accelerator="hpu", devices="0,1,2", logger=False).num_devices == 3
    assert pl.Trainer(accelerator="hpu", devices=[0], logger=False).num_devices == 1
    ranks = two_hpu_runs["devices_list"]
    assert [rank["seen"]["device"] for rank in ranks] == ["hpu:0", "hpu:1"]


@pytest.mark.parametrize("devices", [[1, 3], [1], [0, 0], "1,3"])
def test_device_lists_a_gaudi_cannot_honour_are_refused(devices):
    with pytest.raises(MisconfigurationException, match="only the first n HPUs can be chosen"):
        L.Trainer(accelerator="hpu", devices=devices)


class _RecordsAutocast(BoringModel):
    def training_step(self, batch, batch_idx):
        self.autocast = (torch.is_autocast_enabled("hpu"), self.layer(batch).dtype)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("trainer_class", [pl.Trainer, L.Trainer])
def test_precision_plugin_given_to_the_strategy_trains(trainer_class, tmp_path):
    plugin = HPUPrecisionPlugin("bf16-mixed")
    model = _RecordsAutocast()
    strategy = SingleHPUStrategy(precision_plugin=plugin)
    trainer = trainer_class(accelerator="hpu", strategy=strategy, max_steps=2, logger=False, default_root_dir=tmp_path)
    assert trainer.precision_plugin is plugin
    trainer.fit(model)
    assert model.autocast == (True, torch.bfloat16) and trainer.global_step == 2


def test_precision_plugin_given_to_a_parallel_or_fsdp_strategy():
    plugin = HPUPrecisionPlugin("bf16-mixed")
    trainer = pl.Trainer(accelerator="hpu", devices=2, strategy=HPUParallelStrategy(precision_plugin=plugin))
    assert trainer.precision_plugin is plugin
    fsdp = HPUFSDPPrecision("bf16-mixed")
    trainer = L.Trainer(accelerator="hpu", devices=2, strategy=HPUFSDPStrategy(precision_plugin=fsdp))
    assert trainer.precision_plugin is fsdp
    # the same precision as a flag too is fine; another one is refused, and the plugin given twice as upstream does
    strategy = SingleHPUStrategy(precision_plugin=HPUPrecisionPlugin("bf16-mixed"))
    assert pl.Trainer(accelerator="hpu", strategy=strategy, precision="bf16").precision_plugin.precision == "bf16-mixed"
    with pytest.raises(MisconfigurationException, match="conflicts with the strategy's `HPUMixedPrecision`"):
        pl.Trainer(accelerator="hpu", strategy=SingleHPUStrategy(precision_plugin=plugin), precision="16-mixed")
    with pytest.raises(MisconfigurationException, match="precision set through both strategy class and plugins"):
        pl.Trainer(accelerator="hpu", strategy=SingleHPUStrategy(precision_plugin=plugin), plugins=[plugin])


def test_precision_plugin_given_to_the_strategy_trains_on_two_hpus(two_hpu_runs):
    ranks = two_hpu_runs["strategy_precision"]
    for rank in ranks:
        assert rank["classes"]["precision"] == "HPUMixedPrecision" and rank["seen"]["autocast"]
        assert rank["seen"]["output_dtype"] == torch.bfloat16


def test_strategy_carrying_the_accelerator_or_its_devices():
    """What a strategy instance already carries is not given to upstream a second time."""
    accelerator = HPUAccelerator()
    trainer = pl.Trainer(accelerator="hpu", strategy=SingleHPUStrategy(accelerator=accelerator), logger=False)
    assert trainer.accelerator is accelerator
    strategy = HPUParallelStrategy(parallel_devices=[torch.device("hpu")] * 2)
    trainer = L.Trainer(accelerator="hpu", strategy=strategy, logger=False)
    assert trainer.num_devices == 2 and trainer.strategy is strategy
    # a strategy used by one Trainer carries its accelerator into the next
    assert L.Trainer(accelerator="hpu", strategy=strategy, logger=False).accelerator is trainer.accelerator
    with pytest.raises(MisconfigurationException, match="asks for another number of HPUs than the 2"):
        L.Trainer(accelerator="hpu", devices=4, strategy=HPUParallelStrategy(parallel_devices=["hpu"] * 2))


@pytest.mark.parametrize("trainer_class", [pl.Trainer, L.Trainer])
def test_barebones_trains_on_one_hpu(trainer_class):
    trainer = trainer_class(accelerator="hpu", devices=1, barebones=True, max_steps=2)
    trainer.fit(BoringModel())
    assert trainer.global_step == 2 and trainer.progress_bar_callback is None


def test_barebones_trains_on_two_hpus(two_hpu_runs):
    ranks = two_hpu_runs["barebones"]
    assert all("ProgressBar" not in "".join(rank["classes"]["callbacks"]) for rank in ranks)
