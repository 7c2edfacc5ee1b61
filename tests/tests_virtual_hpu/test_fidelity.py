"""What the virtual Gaudi does as a Gaudi does where a host would differ: dtypes the generation lacks, integer ops the
host kernels lack, the environment Gaudi's software sets."""

from pathlib import Path

import pytest
import torch

FP16_ON_GAUDI1 = """
import torch
for make in (lambda: torch.ones(2, device="hpu", dtype=torch.float16), lambda: torch.ones(2).half().to("hpu"),
             lambda: torch.ones(2, device="hpu").half()):
    try:
        make()
        print("made")
    except RuntimeError as error:
        print(str(error).splitlines()[0])
"""


@pytest.mark.parametrize(
    ("generation", "expected"), [("GAUDI", "float16/half is not supported on Gaudi."), ("GAUDI2", "made")]
)
def test_first_generation_gaudi_refuses_float16(python, generation, expected):
    result = python(FP16_ON_GAUDI1, VIRTUAL_HPU="1", VIRTUAL_HPU_GENERATION=generation)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-3:] == [expected] * 3


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.bfloat16])
def test_histc_of_integer_and_float_ids(dtype):
    ids = torch.tensor([0, 3, 1, 1, 2, 3, 3, 0], dtype=dtype)
    counted = torch.histc(ids.to("hpu"), bins=4, min=0, max=3)
    assert counted.device.type == "hpu" and counted.dtype == dtype
    assert counted.cpu().tolist() == [2, 2, 1, 3]


def test_habana_logs_is_set_as_gaudi_software_sets_it(python):
    code = "import os; os.environ.pop('HABANA_LOGS', None); import torch; print(os.environ.get('HABANA_LOGS'))"
    assert python(code, VIRTUAL_HPU="1").stdout.strip().splitlines()[-1] == str(Path.home() / ".habana_logs")
    kept = "import torch, os; print(os.environ.get('HABANA_LOGS'))"
    assert python(kept, VIRTUAL_HPU="1", HABANA_LOGS="/tmp/logs").stdout.strip().splitlines()[-1] == "/tmp/logs"
    assert python(code).stdout.strip().splitlines()[-1] == "None"
