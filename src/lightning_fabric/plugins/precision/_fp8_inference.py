"""fp8 inference of a model on Gaudi2 and newer with Intel Neural Compressor: one process measures the model's
tensors, a later one quantizes the model from those measurements. Functions of the model and its configuration, used by
the HPU precision plugins."""

import copy
import inspect
import json
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional, Union

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_info
from torch import nn

MEASURE, QUANTIZE = "MEASURE", "QUANTIZE"
# read, never written: the effective configuration is built in memory
_PACKAGED_CONFIGS = {
    MEASURE: Path(__file__).parent / "fp8_configs" / "maxabs_measure.json",
    QUANTIZE: Path(__file__).parent / "fp8_configs" / "maxabs_quant.json",
}
_DEFAULT_DATA_PATH = "hqt_output"
# INC writes its statistics to files named after a prefix: ``<fp8_data_path>/measure_hooks_maxabs.npz``, ...
_STATISTICS_PREFIX = "measure"
# keys of the Habana Quantization Toolkit's JSON files that Intel Neural Compressor still reads
_LEGACY_KEYS = {"method", "whitelist", "blacklist", "seperate_measure_files", "calibration_sample_interval"}
# Measurement and quantization cannot share a process: the mode the first conversion of this process used
_mode_of_this_process: Optional[str] = None


@dataclass(frozen=True)
class FP8InferenceConfig:
    """What :meth:`convert_modules` resolved for fp8 inference: the mode, Intel Neural Compressor's configuration, the
    folder of the measurements and where the configuration came from (for messages)."""

    mode: str
    settings: dict
    source: str

    @property
    def measuring(self) -> bool:
        return self.mode == MEASURE

    @property
    def statistics(self) -> Path:
        """INC's ``dump_stats_path``: a file prefix, e.g. ``.../hqt_output/measure`` for
        ``.../hqt_output/measure_hooks_maxabs.npz``."""
        return Path(self.settings["dump_stats_path"])

    @property
    def data_path(self) -> Path:
        return self.statistics.parent


def resolve_config(quant: Union[bool, str, os.PathLike, dict], fp8_data_path: Optional[str]) -> FP8InferenceConfig:
    """The configuration for ``convert_modules(inference=True, quant=..., fp8_data_path=...)``.

    ``quant`` as a dict or a JSON path is the configuration; ``True``/``False`` take the JSON that ``QUANT_CONFIG``
    names, or else the packaged maxabs quantization/measurement configuration. A configuration's ``mode`` wins over a
    boolean ``quant``. ``fp8_data_path`` wins over the configuration's ``dump_stats_path``.
    """
    if isinstance(quant, dict):
        settings, source = dict(quant), "the `quant` dict"
    elif isinstance(quant, (str, os.PathLike)):
        settings, source = _read_json(Path(quant), f"`quant={str(quant)!r}`"), f"`quant={str(quant)!r}`"
    elif isinstance(quant, bool):
        if os.environ.get("QUANT_CONFIG"):
            path = os.environ["QUANT_CONFIG"]
            settings, source = _read_json(Path(path), f"`QUANT_CONFIG={path}`"), f"`QUANT_CONFIG={path}`"
        else:
            packaged = _PACKAGED_CONFIGS[QUANTIZE if quant else MEASURE]
            settings, source = _read_json(packaged, "the packaged configuration"), f"the packaged {packaged.name}"
    else:
        raise MisconfigurationException(
            f"`convert_modules(inference=True, quant={quant!r})`: `quant` is True (quantize), False (measure), the path"
            " of an Intel Neural Compressor JSON configuration, or such a configuration as a dict."
        )
    _check_keys(settings, source)
    mode = str(settings.get("mode", QUANTIZE if quant is not False else MEASURE)).upper()
    if mode not in (MEASURE, QUANTIZE):
        raise MisconfigurationException(
            f"{source} has `mode={settings['mode']!r}`. fp8 inference runs in two steps: 'MEASURE' in a first process,"
            " then 'QUANTIZE' in a later one."
        )
    settings.update(mode=mode, dump_stats_path=str(_statistics(settings, fp8_data_path)))
    return FP8InferenceConfig(mode=mode, settings=settings, source=source)


def convert_for_inference(module: nn.Module, config: FP8InferenceConfig) -> nn.Module:
    """Put Intel Neural Compressor's measuring (``MEASURE``) or quantized (``QUANTIZE``) modules into ``module`` and
    return it; a measured model's statistics are written by the HPU precision plugin of the run that succeeds with it
    (:func:`measurements_in`)."""
    global _mode_of_this_process
    if config.measuring:
        _check_writable(config.data_path)
    else:
        _check_measurements(config)
    if _mode_of_this_process not in (None, config.mode):
        done, asked = ("quantized", "measure") if config.measuring else ("measured", "quantize")
        raise MisconfigurationException(
            f"This process has already {done} a model for fp8 inference and cannot {asked} one as well: Intel Neural"
            " Compressor's measurement and quantization must run in separate processes. Measure with"
            " `convert_modules(model, inference=True, quant=False)` and `trainer.predict` (or `test`) in one run, then"
            " quantize with `quant=True` in the next."
        )
    if config.measuring:
        rank_zero_info(
            f"fp8 inference: measuring with {config.source}; the statistics go to {config.data_path} (set it with"
            " `fp8_data_path`) when `predict` or `test` ends."
        )
        measurement = Measurement(module, config)
        converted = measurement.module
        _measurements[converted] = measurement
    else:
        from neural_compressor.torch.quantization import FP8Config, convert

        rank_zero_info(f"fp8 inference: quantizing with {config.source} from the statistics in {config.data_path}.")
        converted = convert(module, FP8Config.from_dict(copy.deepcopy(config.settings)))
    _prepared[converted] = config
    _mode_of_this_process = config.mode
    return converted


def prepared_config(module: nn.Module) -> Optional[FP8InferenceConfig]:
    """How ``module`` or one of its submodules was prepared for fp8 inference, or ``None``."""
    return next((_prepared[child] for child in module.modules() if child in _prepared), None)


def measurements_in(module: nn.Module) -> list["Measurement"]:
    """The fp8 measurements that ``module`` and its submodules gather."""
    return [_measurements[child] for child in module.modules() if child in _measurements]


class Measurement:
    """A model with Intel Neural Compressor's measuring modules in place; its statistics are held in a staging folder
    of this process until :meth:`write` publishes them under ``fp8_data_path``.

    Intel Neural Compressor moves the earlier statistics in its folder aside as soon as a measurement starts; staging
    keeps the user's folder as it was when the run fails or never predicts, so a later quantization still finds them.
    """

    def __init__(self, module: nn.Module, config: FP8InferenceConfig) -> None:
        from neural_compressor.torch.quantization import FP8Config, prepare

        self.config = config
        self._staging = Path(tempfile.mkdtemp(prefix="fp8-measurement-"))
        weakref.finalize(self, shutil.rmtree, self._staging, ignore_errors=True)
        staged = {**copy.deepcopy(config.settings), "dump_stats_path": str(self._staging / config.statistics.name)}
        prepared = prepare(module, FP8Config.from_dict(staged))
        # weakly: the registry of measurements must not keep the model alive
        self._module = weakref.ref(prepared)

    @property
    def module(self) -> nn.Module:
        module = self._module()
        assert module is not None
        return module

    def write(self) -> None:
        """Write what the model has gathered (``finalize_calibration``) and move it under ``fp8_data_path``; statistics
        there of the same names are kept in a ``backup_<prefix>_<time>`` folder beside them, as INC does."""
        from neural_compressor.torch.quantization import finalize_calibration

        finalize_calibration(self.module)
        target = self.config.data_path
        target.mkdir(parents=True, exist_ok=True)
        written = list(self._staging.iterdir())
        earlier = [target / path.name for path in written if (target / path.name).exists()]
        if earlier:
            backup = target / f"backup_{self.config.statistics.name}_{datetime.now():%Y-%m-%d_%H-%M-%S}"
            backup.mkdir(exist_ok=True)
            for path in earlier:
                path.replace(backup / path.name)
        for path in written:
            shutil.move(str(path), str(target / path.name))


# the models prepared in this process, weakly: how each was prepared, and the measurement of those that measure
_prepared: "weakref.WeakKeyDictionary[nn.Module, FP8InferenceConfig]" = weakref.WeakKeyDictionary()
_measurements: "weakref.WeakKeyDictionary[nn.Module, Measurement]" = weakref.WeakKeyDictionary()


def _read_json(path: Path, source: str) -> dict:
    if not path.is_file():
        raise MisconfigurationException(
            f"{source}: no such file. Name an existing Intel Neural Compressor JSON configuration, or unset"
            " `QUANT_CONFIG` to use the packaged maxabs configurations."
        )
    try:
        settings = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise MisconfigurationException(f"{source} is not valid JSON: {error}") from error
    if not isinstance(settings, dict):
        raise MisconfigurationException(f"{source} holds a {type(settings).__name__}; expected a JSON object.")
    return settings


def _known_keys() -> set:
    from neural_compressor.torch.algorithms.fp8_quant._quant_common import quant_config
    from neural_compressor.torch.quantization import FP8Config

    parameters = inspect.signature(FP8Config.__init__).parameters
    known = {name for name, p in parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD and name != "self"}
    return known | set(getattr(quant_config, "_config_to_enum", {})) | _LEGACY_KEYS


def _check_keys(settings: dict, source: str) -> None:
    unknown = sorted(set(settings) - _known_keys())
    if unknown:
        raise MisconfigurationException(
            f"{source} has keys Intel Neural Compressor does not know: {', '.join(unknown)}. Its fp8 keys are those"
            " of `neural_compressor.torch.quantization.FP8Config` (mode, observer, scale_method, allowlist,"
            " blocklist, dump_stats_path, ...)."
        )


def _statistics(settings: dict, fp8_data_path: Optional[str]) -> Path:
    if fp8_data_path is not None:
        return Path(fp8_data_path).absolute() / _STATISTICS_PREFIX
    if "dump_stats_path" in settings:
        return Path(settings["dump_stats_path"]).absolute()
    return Path(_DEFAULT_DATA_PATH).absolute() / _STATISTICS_PREFIX


def _check_writable(folder: Path) -> None:
    # the statistics are written only after `predict` or `test`: say it now, not after the whole run
    existing = next(path for path in (folder, *folder.parents) if path.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise MisconfigurationException(
            f"fp8 measurement writes its statistics to {folder}, which cannot be written: {existing} is not a writable"
            " folder. Pass a writable folder as `fp8_data_path`."
        )


def _check_measurements(config: FP8InferenceConfig) -> None:
    observer = config.settings.get("observer", "maxabs")
    expected = config.data_path / f"{config.statistics.name}_hooks_{observer}{_process_suffix()}.json"
    if expected.is_file():
        return
    found = sorted(path.name for path in config.data_path.glob(f"{config.statistics.name}_hooks_{observer}*.json"))
    if found:
        raise MisconfigurationException(
            f"fp8 quantization reads {expected.name} in {config.data_path}, which has {', '.join(found)}: the"
            " measurement ran with another number of processes (the name ends in _<rank>_<processes>). Quantize with"
            " as many processes as measured, or measure again as you will quantize."
        )
    raise MisconfigurationException(
        f"fp8 quantization reads the measurements in {config.data_path}, and there are none. Measure first, in"
        " another process: `convert_modules(model, inference=True, quant=False, fp8_data_path=...)`, then"
        " `trainer.predict` or `trainer.test` on a portion of the data."
    )


def _process_suffix() -> str:
    """What Intel Neural Compressor appends to the statistics' file names in this process: ``_<rank>_<processes>`` once
    the process belongs to a distributed run (it remembers the first answer), nothing otherwise."""
    from neural_compressor.torch.algorithms.fp8_quant.prepare_quant.prepare_model import get_local_rank, get_world_size

    rank = get_local_rank()
    return f"_{rank}_{get_world_size()}" if rank >= 0 else ""
