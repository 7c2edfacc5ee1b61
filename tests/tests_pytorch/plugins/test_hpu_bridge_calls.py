"""The precision plugins' calls into Gaudi's bridge hold for Intel's bridge 1.19 and newer."""

import pytest
import torch

from lightning_fabric.plugins.precision import _fp8_training as hpu_fp8


@pytest.mark.usefixtures("amx_host")
def test_transformer_engine_modules_are_recognized_when_the_bridge_only_re_exports_them(monkeypatch):
    """From bridge 1.19, ``habana_frameworks.torch.hpex.experimental.transformer_engine`` re-exports the classes of
    ``intel_transformer_engine``: a module's class is then defined outside ``habana_frameworks``."""
    te = hpu_fp8.transformer_engine()

    class Linear(te.Linear):  # defined here, as ``intel_transformer_engine``'s is defined there
        pass

    monkeypatch.setattr(te, "Linear", Linear)
    model = torch.nn.Sequential(Linear(4, 4), torch.nn.ReLU())
    assert hpu_fp8.uses_transformer_engine(model)
    assert not hpu_fp8.uses_transformer_engine(torch.nn.Sequential(torch.nn.Linear(4, 4)))
