"""Activation: explicit only, refused over a real installation, knobs validated, announced once."""

import pytest

from virtual_hpu._config import resolve


def test_import_alone_changes_nothing(python):
    result = python(
        """
        import importlib.util, sys, torch, virtual_hpu
        print(virtual_hpu.is_active(), hasattr(torch, "hpu"), importlib.util.find_spec("habana_frameworks"))
        print(any("virtual_hpu_core" in name for name in torch.ops.loaded_libraries))
        try:
            torch.empty(1, device="hpu")
        except Exception:  # plain torch has no hpu device
            print("no hpu")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "None", "False", "no", "hpu"]
    assert result.stderr == ""


@pytest.mark.parametrize(("lazy_flag", "mode"), [(None, "eager"), ("0", "eager"), ("1", "lazy")])
def test_env_activation_in_a_child_announces_once(python, lazy_flag, mode):
    result = python(
        """
        import torch, virtual_hpu
        assert virtual_hpu.activate_from_env()
        virtual_hpu.activate()  # again: no second announcement
        import habana_frameworks.torch.hpu as hthpu
        print(torch.hpu.device_count(), hthpu.get_device_name(), torch.ones(2, device="hpu:2").device)
        """,
        VIRTUAL_HPU="1",
        VIRTUAL_HPU_DEVICES="3",
        VIRTUAL_HPU_GENERATION="gaudi3",
        **({"PT_HPU_LAZY_MODE": lazy_flag} if lazy_flag is not None else {}),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "GAUDI3", "hpu:2"]
    # and nothing else but what the bridge logs when it loads in eager mode: no warning of torch's about what the
    # device registers
    bridge = [
        f"Calling {name} function does not have any effect. It's lazy mode only functionality. (warning logged once)"
        for name in ("add_step_closure", "mark_step", "iter_mark_step")
    ]
    assert result.stderr.splitlines() == (bridge if mode == "eager" else []) + [
        f"Virtual Gaudi active: 3 x GAUDI3 (host memory), 131072 MiB per device, {mode} mode; not a real accelerator"
    ]


@pytest.mark.parametrize("first_import", ["pytorch_lightning", "virtual_hpu; virtual_hpu.activate_from_env()"])
def test_activation_started_before_torch_is_imported_announces_once(python, first_import):
    """``activate`` imports torch, whose autoload activates first: the outer call must not set the device up again."""
    result = python(f"import {first_import}; import torch; print(torch.hpu.device_count())", VIRTUAL_HPU="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["8"]
    assert len([line for line in result.stderr.splitlines() if "Virtual Gaudi active" in line]) == 1, result.stderr


def test_env_off_does_not_activate(python):
    result = python("import virtual_hpu; print(virtual_hpu.activate_from_env())", VIRTUAL_HPU="0")
    assert result.stdout.strip() == "False"


def test_refuses_over_a_real_installation(tmp_path, python):
    fake = tmp_path / "site" / "habana_frameworks"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    result = python(
        f"""
        import sys, torch, virtual_hpu
        sys.path.insert(0, {str(fake.parent)!r})
        try:
            virtual_hpu.activate()
        except RuntimeError as err:
            print(err)
        print(virtual_hpu.is_active(), hasattr(torch, "hpu"))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "A real Intel Gaudi software stack is installed" in result.stdout
    assert str(fake) in result.stdout
    assert result.stdout.split()[-2:] == ["False", "False"]


def test_cannot_change_an_active_device():
    import virtual_hpu

    assert virtual_hpu.activate() == virtual_hpu.config()
    with pytest.raises(RuntimeError, match="already active"):
        virtual_hpu.activate(devices=2)


@pytest.mark.parametrize(
    ("env", "kwargs", "match"),
    [
        ({"VIRTUAL_HPU_DEVICES": "0"}, {}, r"VIRTUAL_HPU_DEVICES must be an integer in \[1, 16\], got '0'"),
        ({"VIRTUAL_HPU_DEVICES": "many"}, {}, "VIRTUAL_HPU_DEVICES must be an integer"),
        ({}, {"devices": 17}, r"VIRTUAL_HPU_DEVICES must be an integer in \[1, 16\], got 17"),
        ({"VIRTUAL_HPU_GENERATION": "GAUDI4"}, {}, "VIRTUAL_HPU_GENERATION must be one of GAUDI, GAUDI2, GAUDI3"),
        ({"VIRTUAL_HPU_MEMORY_MB": "-5"}, {}, r"VIRTUAL_HPU_MEMORY_MB must be an integer in \[1, 1048576\]"),
        ({}, {"memory_mb": 0}, "VIRTUAL_HPU_MEMORY_MB must be an integer"),
        ({"PT_HPU_LAZY_MODE": "2"}, {}, "PT_HPU_LAZY_MODE must be 0"),
        ({"HABANA_VISIBLE_MODULES": "0,8"}, {"devices": 8}, "distinct module ids from 0 to 7"),
        ({"HABANA_VISIBLE_MODULES": "1,1"}, {}, "HABANA_VISIBLE_MODULES must list distinct"),
        ({"HABANA_VISIBLE_MODULES": "a"}, {"devices": 2}, "from 0 to 1 separated by commas"),
    ],
)
def test_invalid_knobs_are_rejected(monkeypatch, env, kwargs, match):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=match):
        resolve(**kwargs)


def test_knob_defaults_and_generation_memory(monkeypatch):
    for key in (
        "VIRTUAL_HPU_DEVICES",
        "VIRTUAL_HPU_GENERATION",
        "VIRTUAL_HPU_MEMORY_MB",
        "PT_HPU_LAZY_MODE",
        "HABANA_VISIBLE_MODULES",
    ):
        monkeypatch.delenv(key, raising=False)
    default = resolve()
    assert (default.devices, default.generation, default.memory_mb, default.lazy) == (8, "GAUDI2", 98304, False)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert resolve().lazy
    gaudi = resolve(generation="GAUDI")
    assert gaudi.memory_mb == 32768 and not gaudi.fp16_supported
    monkeypatch.setenv("VIRTUAL_HPU_MEMORY_MB", "1024")
    assert resolve(devices=2).memory_mb == 1024


def test_visible_modules_limit_the_devices(monkeypatch, python):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", " 2, 5 ,7")
    assert resolve(devices=8).devices == 3
    result = python(
        "import torch, virtual_hpu; virtual_hpu.activate(); print(torch.hpu.device_count())",
        HABANA_VISIBLE_MODULES="0,3",
    )
    assert result.stdout.split()[-1:] == ["2"], result.stderr


def test_bad_env_flag_is_reported(python):
    result = python("import virtual_hpu; virtual_hpu.activate_from_env()", VIRTUAL_HPU="yes")
    assert "VIRTUAL_HPU must be 1 (on) or 0 (off), got 'yes'" in result.stderr


def test_children_load_the_built_library_without_building(python):
    result = python(
        """
        import torch.utils.cpp_extension as ext
        def refuse(*args, **kwargs):
            raise AssertionError("rebuilt")
        ext.load = refuse
        import torch, virtual_hpu
        virtual_hpu.activate()
        print(torch.ones(1, device="hpu").device)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hpu:0"


def test_posing_as_an_image_with_stock_pytorch_refuses_lazy_mode_as_the_bridge_does(python):
    """Gaudi 1.24's images with stock PyTorch: importing the bridge in lazy mode raises its ``AssertionError``
    (``habana_frameworks/torch/__init__.py``); libraries that only look for it still import, and eager mode works."""
    result = python(
        """
        import torch, pytorch_lightning
        try:
            import habana_frameworks.torch.core
        except AssertionError as error:
            print("refused:", error)
        try:  # again: nothing was left half-loaded
            import habana_frameworks.torch.hpu
        except AssertionError as error:
            print("refused:", error)
        """,
        VIRTUAL_HPU="1",
        PT_HPU_LAZY_MODE="1",
        VIRTUAL_HPU_STOCK_PYTORCH="1",
    )
    assert result.returncode == 0, result.stderr
    import torch

    assert (
        result.stdout.splitlines()
        == [f"refused: Upstream PyTorch version {torch.__version__} is not supported in Lazy mode."] * 2
    ), result.stdout + result.stderr
    result = python(
        "import torch; print((torch.ones(2, device='hpu') * 3).tolist())",
        VIRTUAL_HPU="1",
        VIRTUAL_HPU_STOCK_PYTORCH="1",
    )
    assert result.stdout.split("\n")[-2:] == ["[3.0, 3.0]", ""], result.stderr
    result = python("import torch", VIRTUAL_HPU="1", VIRTUAL_HPU_STOCK_PYTORCH="yes")
    assert "VIRTUAL_HPU_STOCK_PYTORCH must be 1 (an image with stock PyTorch) or 0, got 'yes'" in result.stderr


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        # a plain script: the bridge's rendezvous defaults, and no ranks
        ({}, {"MASTER_ADDR": "localhost", "MASTER_PORT": "12345", "WORLD_SIZE": None, "ID": None}),
        # a rank mpirun started: Open MPI's ranks, the card of its local rank
        (
            {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
            {
                "MASTER_ADDR": "localhost",
                "WORLD_SIZE": "2",
                "RANK": "1",
                "LOCAL_RANK": "1",
                "ID": "1",
                "HLS_MODULE_ID": "1",
            },
        ),
        # a rank torchrun started: its rendezvous is kept
        (
            {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
            {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "ID": "0", "HLS_MODULE_ID": "0"},
        ),
    ],
    ids=["script", "mpirun", "torchrun"],
)
def test_loading_the_bridge_reads_the_ranks_and_registers_hccl(python, variables, expected):
    """As the bridge's ``distributed/hccl`` module does since 1.19, run when ``import torch`` loads it."""
    names = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "ID", "HLS_MODULE_ID"]
    result = python(
        f"""
        import json, os, torch, torch.distributed as dist
        print(json.dumps([{{name: os.environ.get(name) for name in {names}}}, "HCCL" in dist.Backend._plugins]))
        """,
        VIRTUAL_HPU="1",
        **variables,
    )
    assert result.returncode == 0, result.stderr
    import json

    environment, registered = json.loads(result.stdout.splitlines()[-1])
    assert registered
    assert {name: environment[name] for name in expected} == expected
