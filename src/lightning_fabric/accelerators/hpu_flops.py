"""The peak FLOPs of each Gaudi generation, for the model FLOPs utilization (MFU) of Lightning's throughput tools."""

from typing import Optional, Union

import torch

from lightning_fabric.accelerators.hpu import HPUAccelerator

_TERA = 1e12
# Matrix-engine (MME) peaks, dense, from Intel's published specifications: "Intel Gaudi 3 AI Accelerator: Architected
# for Gen AI Training and Inference" (Hot Chips 2024: Gaudi 60, Gaudi 2 432 and Gaudi 3 1835 BF16 TFLOPs, Gaudi 3 1835
# FP8) and the Intel Gaudi 3 AI Accelerator white paper (Gaudi 2: 865 FP8 TFLOPs). The 16-bit figure serves fp16 too,
# which runs on the same engines. Intel publishes no fp32 peak, so fp32 runs get no MFU; first-generation Gaudi has no
# fp8.
GAUDI_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "GAUDI": {"bf16": 60 * _TERA},
    "GAUDI2": {"bf16": 432 * _TERA, "fp8": 865 * _TERA},
    "GAUDI3": {"bf16": 1835 * _TERA, "fp8": 1835 * _TERA},
}
# the dtype upstream's throughput tools pass for each precision (torch.int8 for fp8 plugins), as a key of the table
_BY_DTYPE: dict[Union[torch.dtype, str], str] = {
    torch.bfloat16: "bf16",
    torch.float16: "bf16",
    torch.int8: "fp8",
    "bf16": "bf16",
    "fp8": "fp8",
}


def peak_flops(dtype: Union[torch.dtype, str], generation: Optional[str] = None) -> Optional[int]:
    """The peak FLOPs per second of one card of ``generation`` (default: the HPUs present, real or virtual) in
    ``dtype``; ``None`` where Intel publishes none."""
    generation = HPUAccelerator.get_device_name() if generation is None else generation
    peak = GAUDI_PEAK_FLOPS.get(generation, {}).get(_BY_DTYPE.get(dtype, ""))
    return None if peak is None else int(peak)
