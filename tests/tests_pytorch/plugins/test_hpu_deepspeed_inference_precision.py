"""Under DeepSpeed's inference engine with a dtype of its own, the engine's dtype wins over the precision flag: inputs
are cast to it and the mixed precisions autocast (as lightning-habana did). The Trainer-level runs on 1 and 2 HPUs are
in ``tests_pytorch/strategies/test_hpu_deepspeed.py``."""

import pytest
import torch

from pytorch_lightning.plugins import HPUDeepSpeedPrecisionPlugin


@pytest.mark.parametrize(
    ("precision", "output"),
    [
        ("32-true", torch.float32),
        ("bf16-mixed", torch.bfloat16),
        ("bf16-true", torch.float32),
        ("16-mixed", torch.float16),
    ],
)
def test_an_fp32_engine_takes_inputs_in_fp32_under_every_precision(precision, output):
    plugin = HPUDeepSpeedPrecisionPlugin(precision)
    plugin.inference_dtype = torch.float32  # what the strategy sets for `HPUDeepSpeedStrategy(dtype=torch.float)`
    layer = torch.nn.Linear(4, 2).to("hpu")  # the engine's weights
    batch = plugin.convert_input(torch.randn(3, 4, device="hpu"))
    with plugin.forward_context():
        created = torch.zeros(1, device="hpu")
        result = layer(batch)  # bf16 inputs met fp32 weights here: "mat1 and mat2 must have the same dtype"
    assert batch.dtype == created.dtype == torch.float32 and result.dtype == output
    # the run ends: the next one (a `fit`) casts as the precision says again
    plugin.teardown()
    assert plugin.inference_dtype is None
    expected = {"32-true": torch.float32, "16-mixed": torch.float16}.get(precision, torch.bfloat16)
    assert plugin.convert_input(torch.randn(1, device="hpu")).dtype == expected
