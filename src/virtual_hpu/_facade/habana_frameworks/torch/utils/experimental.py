"""Device-type queries used by integrations to pick supported data types, and Gaudi's tools for finding dynamic
shapes: ``data_dynamicity`` (input shapes of a data loader) and ``detect_recompilation_auto_model`` (which modules
recompile, and why)."""

import csv
import enum
import inspect
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


def detect_recompilation_auto_model(model: Any, mdlname: str = "Net", waittime: float = 1, csv_out: str = "out") -> Any:
    """Have ``model`` note, at each call, which of its modules compile and why; ``model.analyse_dynamicity()`` then
    prints the report and writes it to ``{csv_out}_1.csv`` (per step) and ``{csv_out}_2.csv`` (per module), and
    ``model.raw_logs()`` returns what was noted, a line per module call.

    Modules are named as on Gaudi: ``mdlname`` for the model, ``mdlname/child/grandchild`` below it. Each module's
    forward runs as a graph of its own (cut before and after it in lazy mode), so a compilation is charged to the module
    that caused it (and to the modules around it): at an input shape the module has not seen before, or at one it has,
    which points to a dynamic op (an op whose output shape depends on the data, such as boolean indexing). Step 0, the
    first call, compiles everything. ``waittime`` is how long Gaudi's tool waits for compilations to finish; the
    virtual device compiles synchronously.
    """
    detector = _RecompilationDetector(model, mdlname, csv_out)
    model.analyse_dynamicity = detector.analyse_dynamicity
    model.raw_logs = detector.raw_logs
    return model


class _RecompilationDetector:
    def __init__(self, model: Any, mdlname: str, csv_out: str) -> None:
        self.csv_out = csv_out
        self.step = -1
        self.records: list = []
        self._logs: list = []
        self._seen: dict = {}
        self._open: dict = {}
        for name, module in model.named_modules():
            full = "/".join([mdlname, *name.split(".")]) if name else mdlname
            self._logs.append(f"registered {full}: {type(module).__qualname__} from {_location(module)}")
            module.register_forward_pre_hook(partial(self._before, full, module is model))
            module.register_forward_hook(partial(self._after, full))

    def _before(self, name: str, is_root: bool, module: Any, args: tuple) -> None:
        if is_root:
            self.step += 1
        _cut()
        self._open[name] = (_shapes(args), compilation.compiled_ever())

    def _after(self, name: str, module: Any, args: tuple, output: Any) -> None:
        _cut()
        shapes, compiled_before = self._open.pop(name)
        inputs, outputs = self._seen.setdefault(name, (set(), set()))
        new_input, new_output = shapes not in inputs, _shapes(output) not in outputs
        inputs.add(shapes)
        outputs.add(_shapes(output))
        graphs = compilation.compiled_ever() - compiled_before
        self._logs.append(
            f"step {self.step} {name}: {graphs} graph(s) compiled, input shapes {'new' if new_input else 'seen'},"
            f" output shapes {'new' if new_output else 'seen'}"
        )
        self.records.append(
            {
                "step": self.step,
                "module": name,
                "class": type(module).__name__,
                "location": _location(module),
                "new_input_shapes": new_input,
                "new_output_shapes": new_output,
                "recompiled": graphs > 0,
            }
        )

    def raw_logs(self) -> list:
        return list(self._logs)

    def analyse_dynamicity(self) -> list:
        """The module calls that compiled, and why: printed as two tables (per step, per module) and written to
        ``{csv_out}_1.csv`` and ``{csv_out}_2.csv``; returned as a list of records."""
        report = [record for record in self.records if record["recompiled"]]
        rows = [
            [
                str(record["step"]),
                record["module"],
                str(record["new_input_shapes"]),
                str(record["new_output_shapes"]),
                record["class"],
                record["location"],
                _why(record),
            ]
            for record in report
        ]
        header = ["Step", "Recompiling modules", "New in", "New out", "Class", "Location", "Comment"]
        _print_table(header, rows)
        _write_csv(f"{self.csv_out}_1.csv", header, rows)
        counts: dict = {}
        for record in report:
            counts[record["module"]] = counts.get(record["module"], 0) + 1
        per_module = [[name, str(count)] for name, count in sorted(counts.items(), key=lambda item: -item[1])]
        _print_table(["Module name", "Recompile count"], per_module)
        _write_csv(f"{self.csv_out}_2.csv", ["Module name", "Recompile count"], per_module)
        return report


def _why(record: dict) -> str:
    if record["new_input_shapes"]:
        return "compiled for input shapes it had not seen"
    dynamic = "a dynamic op (output shape from the data) in it or in a child"
    if record["new_output_shapes"]:
        return f"compiled again for input shapes it had seen, with new output shapes: {dynamic}"
    return f"compiled again for input shapes it had seen: {dynamic}, or a cache miss"


def _location(module: Any) -> str:
    try:
        return inspect.getsourcefile(type(module)) or type(module).__module__
    except TypeError:  # a class defined in the interpreter
        return type(module).__module__


def _write_csv(path: str, header: list, rows: list) -> None:
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows([header, *rows])


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
