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


# Intel Neural Compressor tells the bridge how its fp8 graphs are scaled; the virtual device only keeps the settings.
_quantization_settings: dict = {"dynamic": False, "scale_attributes": None}


def _set_is_dynamic_quantization(is_dynamic: bool) -> None:
    """Whether the quantized model computes its scales at run time."""
    _quantization_settings["dynamic"] = bool(is_dynamic)


def _set_scale_attributes(*attributes: object) -> None:
    """How the scales of the quantized model are represented (hardware-aligned, and the scale range)."""
    _quantization_settings["scale_attributes"] = attributes
