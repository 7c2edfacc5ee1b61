"""Device-type queries used by integrations to pick supported data types."""

import enum


class synDeviceType(enum.Enum):
    """The Gaudi generation of a device."""

    synDeviceGaudi = "GAUDI"
    synDeviceGaudi2 = "GAUDI2"
    synDeviceGaudi3 = "GAUDI3"


def _get_device_type() -> synDeviceType:
    import virtual_hpu

    return synDeviceType(virtual_hpu.config().generation)


def _is_fp16_supported() -> bool:
    """First-generation Gaudi has no fp16."""
    import virtual_hpu

    return virtual_hpu.config().fp16_supported


def _is_fp8_supported() -> bool:
    """fp8 needs Gaudi2 or newer."""
    import virtual_hpu

    return virtual_hpu.config().fp8_supported
