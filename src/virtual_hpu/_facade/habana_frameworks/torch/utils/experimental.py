"""Device-type queries used by integrations to pick supported data types, and Gaudi's tools for finding dynamic
shapes: ``data_dynamicity`` (input shapes of a data loader) and ``detect_recompilation_auto_model`` (which modules
recompile, and why)."""

import enum
from functools import partial
from typing import Any

import torch

from virtual_hpu import compilation


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


def data_dynamicity(dataloader: Any) -> dict:
    """How many batches of each input shape ``dataloader`` yields: printed as a table, returned as ``{shapes: count}``.

    Each new shape is a new graph for Gaudi to compile; a few (a smaller last batch) are harmless.
    """
    counts: dict = {}
    for batch in dataloader:
        shapes = _shapes(batch)
        counts[shapes] = counts.get(shapes, 0) + 1
    _print_table(["Shape", "Count"], [[str(shapes), str(count)] for shapes, count in counts.items()])
    print("Number of unique shapes: ", len(counts))
    if len(counts) > 2:
        print("There is a lot of dynamicity in input data shapes")
    elif len(counts) == 2:
        print("There is a little dynamicity in input data shapes")
    else:
        print("There is no dynamicity in input data shapes")
    return counts


def detect_recompilation_auto_model(model: Any, waittime: float = 0.3) -> Any:
    """Have ``model`` note, at each call, which of its modules recompile and why; ``model.analyse_dynamicity()`` then
    prints and returns the report.

    Each module's forward runs as a graph of its own (cut before and after it in lazy mode), so a compilation is
    charged to the module that caused it: at an input shape the module has not seen before, or at one it has, which
    points to a dynamic op (an op whose output shape depends on the data, such as boolean indexing). ``waittime``
    is how long Gaudi's tool waits for compilations to finish; the virtual device compiles synchronously.
    """
    detector = _RecompilationDetector(model)
    model.analyse_dynamicity = detector.analyse_dynamicity
    return model


class _RecompilationDetector:
    def __init__(self, model: Any) -> None:
        self.step = -1
        self.records: list = []
        self._seen: dict = {}
        self._open: dict = {}
        for name, module in model.named_modules():
            module.register_forward_pre_hook(partial(self._before, name or type(model).__name__, module is model))
            module.register_forward_hook(partial(self._after, name or type(model).__name__))

    def _before(self, name: str, is_root: bool, module: Any, args: tuple) -> None:
        if is_root:
            self.step += 1
        _cut()
        self._open[name] = (_shapes(args), compilation.compiled_ever())

    def _after(self, name: str, module: Any, args: tuple, output: Any) -> None:
        _cut()
        shapes, compiled_before = self._open.pop(name)
        new_shapes = shapes not in self._seen.setdefault(name, set())
        self._seen[name].add(shapes)
        recompiled = compilation.compiled_ever() > compiled_before
        self.records.append(
            {
                "step": self.step,
                "module": name,
                "class": type(module).__name__,
                "new_input_shapes": new_shapes,
                "recompiled": recompiled,
            }
        )

    def analyse_dynamicity(self) -> list:
        """The modules that recompiled after the first step, and why; printed as a table."""
        report = [record for record in self.records if record["step"] > 0 and record["recompiled"]]
        rows = [
            [
                str(record["step"]),
                record["module"],
                record["class"],
                "new input shapes"
                if record["new_input_shapes"]
                else "already seen input shapes: a dynamic op, or a cache miss",
            ]
            for record in report
        ]
        _print_table(["Step", "Recompiling module", "Class", "Why"], rows)
        if not report:
            print("No module recompiled after the first step")
        return report


def _cut() -> None:
    import habana_frameworks.torch.core as htcore

    if htcore.is_lazy():
        htcore.mark_step()


def _shapes(value: Any) -> Any:
    """The shapes of the tensors in ``value`` (nested tuples, lists and dicts), in order."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)):
        return tuple(_shapes(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _shapes(item)) for key, item in value.items())
    return None


def _print_table(header: list, rows: list) -> None:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    line = "+" + "+".join("-" * (width + 2) for width in widths) + "+"
    print(line)
    for row in [header, *rows]:
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths)) + " |")
        if row is header:
            print(line)
    print(line)
