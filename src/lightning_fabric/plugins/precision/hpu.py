"""Precision on Intel Gaudi: the base of every HPU precision plugin of Fabric and of the Trainer, fp32 itself, and the
entry point that builds the plugin for a precision (``HPUPrecision(precision="bf16-mixed")``, the Trainer's
``HPUPrecisionPlugin(...)``), as Lightning 1.x and lightning-habana did."""

import importlib.util
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from lightning.fabric.connector import _convert_precision_to_unified_args
from lightning.fabric.plugins.precision.precision import Precision
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import WarningCache
from torch.nn import Module
from typing_extensions import override

if TYPE_CHECKING:
    from lightning_fabric.plugins.precision._fp8_inference import FP8InferenceConfig, Measurement

SUPPORTED = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "fp8")
# Lightning 1.x's spellings of Habana mixed precision, which ran in bf16 on every Gaudi
_LEGACY_16 = ("16", 16)
_LEGACY_16_NOTE = (
    "`precision=16` on HPU means bf16 mixed precision (`'bf16-mixed'`), as in Lightning 1.x. For float16 autocast"
    " (Gaudi2 and newer), pass `precision='16-mixed'`."
)
_info_cache = WarningCache()
# first-generation Gaudi has no fp16 and no fp8
_NEEDS_GAUDI2 = {"16-mixed": "bf16-mixed", "16-true": "bf16-true", "fp8": "bf16-mixed"}
# lightning-habana's precision plugins took ``(precision, device="hpu", recipe=None, replace_layers=False)``: after the
# precision, these in this order (Lightning 1.x's took ``(precision, opt_level, bf16_file_path, ...)``)
_LIGHTNING_HABANA_ORDER = ("device", "recipe", "replace_layers")


class _BuiltByPrecision(type):
    """Calling an entry point (Fabric's ``HPUPrecision(...)``, the Trainer's ``HPUPrecisionPlugin(...)``: a class that
    holds its own ``_by_precision``) builds the class of the precision it is given; every class's signature is that of
    its constructor (what LightningCLI and the docs read)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = _in_lightning_habana_order(cls, args, kwargs)
        if "_by_precision" in vars(cls):
            chosen, arguments = _plugin_for(cls, args, kwargs)
            if chosen is not cls:
                return chosen(**arguments)
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        signature = inspect.signature(cls.__init__)  # type: ignore[misc]
        return signature.replace(parameters=list(signature.parameters.values())[1:])


class HPUPrecision(Precision, metaclass=_BuiltByPrecision):
    """Precision for Fabric on HPUs; the base of every HPU precision plugin, of Fabric and of the Trainer, and plain
    fp32 (``"32-true"``) itself.

    ``HPUPrecision(precision=...)``, lightning-habana's Fabric plugin, builds the plugin for that precision:
    ``"bf16-mixed"``/``"16-mixed"`` (and the legacy ``16``, ``"16"``) give :class:`HPUMixedPrecision`,
    ``"bf16-true"``/``"16-true"`` :class:`HPUHalfPrecision`, ``"fp8"`` :class:`HPUFP8Precision`.
    ``Fabric(accelerator="hpu", precision=...)`` builds the same plugins. A class says which precisions its entry point
    builds it for with ``builds=(...)`` in its class statement.

    Every HPU plugin writes the statistics of a model prepared for fp8 measurement
    (:meth:`convert_modules` with ``inference=True, quant=False``) when a run that ran it has succeeded.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``, ``"bf16-true"``, ``"16-true"`` or ``"fp8"`` (the
            last three need Gaudi2 or newer); ``16`` and ``"16"`` mean ``"bf16-mixed"``, as in Lightning 1.x.
        opt_level, bf16_file_path, fp32_file_path, verbose, hmp_params: Gaudi's op lists, for the mixed precisions and
            fp8 (see :class:`HPUMixedPrecision`).
        device: ``"hpu"``, the only device these plugins run on; taken for lightning-habana's signature
            ``HPUPrecision(precision, device="hpu")``, also positionally after ``precision``.
        recipe, replace_layers: for ``"fp8"`` (see :class:`HPUFP8Precision`).
    """

    device = "hpu"
    # how users build this family of plugins, for messages
    _entry_point = "HPUPrecision"
    # the entry point whose flags and hooks this family of plugins serves: the Trainer's derive from Fabric's
    _owner = "Fabric"
    # this entry point's classes by the precision they run, filled in as they are defined (``__init_subclass__``)
    _by_precision: dict[str, type["HPUPrecision"]] = {}
    # what the current run measures for fp8 inference, and whether it failed
    _measurements: tuple["Measurement", ...] = ()
    _failed = False

    def __init__(
        self,
        precision: Union[str, int] = "32-true",
        opt_level: str = "O1",
        bf16_file_path: Optional[str] = None,
        fp32_file_path: Optional[str] = None,
        verbose: bool = False,
        hmp_params: Optional[dict[str, Any]] = None,
        *,
        device: Union[str, torch.device] = "hpu",
        recipe: Optional[Union[Mapping[str, Any], Any]] = None,
        replace_layers: bool = False,
    ) -> None:
        # reached for "32-true" only: every other precision is built by its own class (``_BuiltByPrecision``)
        check_device(device, type(self).__name__)
        self.precision = validate_precision(precision, ("32-true",), type(self).__name__)

    def __init_subclass__(cls, builds: tuple[str, ...] = (), **kwargs: Any) -> None:
        """A class defined with ``builds=(precision, ...)`` is what its entry point (the nearest class above it that
        holds its own ``_by_precision``) builds for those precisions."""
        super().__init_subclass__(**kwargs)
        if builds:
            entry = next(base for base in cls.__mro__[1:] if "_by_precision" in vars(base))
            entry._by_precision.update(dict.fromkeys(builds, cls))

    @property
    def fp8_training_available(self) -> bool:
        """Whether this plugin trains in fp8, as lightning-habana meant it: its precision is ``"fp8"`` (which only a
        Gaudi2 or newer accepts) and Gaudi's Transformer Engine is installed; ``False`` for every other precision."""
        spec = importlib.util.find_spec("habana_frameworks.torch.hpex.experimental.transformer_engine")
        return self.precision == "fp8" and spec is not None

    @property
    def fp8_inference_available(self) -> bool:
        """Whether this plugin runs fp8 inference, as lightning-habana meant it: its precision is ``"fp8"`` and Intel
        Neural Compressor is installed; ``False`` for every other precision."""
        return self.precision == "fp8" and importlib.util.find_spec("neural_compressor") is not None

    def fp8_inference(self, module: Module) -> Optional["FP8InferenceConfig"]:
        """How ``module`` is prepared for fp8 inference (measure or quantize), or ``None`` if it is not."""
        from lightning_fabric.plugins.precision import _fp8_inference

        return _fp8_inference.prepared_config(module)

    def convert_modules(
        self,
        module: Module,
        inference: bool = False,
        replace_layers: bool = False,
        recipe: Optional[Any] = None,
        quant: Union[bool, str, dict] = True,
        fp8_data_path: Optional[str] = None,
    ) -> Module:
        """lightning-habana's way to prepare a model for fp8 (``precision="fp8"`` only); returns the model.

        The constructor form does the same when the Trainer sets the model up:
        ``HPUFP8Precision(recipe=..., replace_layers=True)`` for training, ``HPUFP8InferencePrecision(quant=...,
        fp8_data_path=...)`` for inference.

        Args:
            module: the model, before ``fit``, ``predict`` or ``test``.
            inference: prepare for fp8 inference with Intel Neural Compressor instead of training: with ``quant=False``
                measure the model's tensors during ``predict``/``test`` (the statistics are written when it ends),
                with ``quant=True``, in a later process, quantize it from those statistics.
            replace_layers: put Transformer Engine ``Linear`` layers, holding the same weights, in place of the
                model's ``torch.nn.Linear`` layers. A model that already has Transformer Engine modules is left as it
                is.
            recipe: the fp8 recipe for training, kept by this plugin (e.g. ``recipe.DelayedScaling(fp8_format=
                recipe.Format.HYBRID)``, or its arguments as a dict); Transformer Engine's default when not given.
            quant: for fp8 inference: ``True`` (quantize) or ``False`` (measure) with the JSON configuration that
                ``QUANT_CONFIG`` names, or else the packaged maxabs ones; or the path of an Intel Neural Compressor JSON
                configuration, or such a configuration as a dict (its ``mode`` decides). Files are never modified.
            fp8_data_path: the folder of the measurements, written when measuring and read when quantizing; the
                configuration's ``dump_stats_path``, or else ``./hqt_output``, when not given.
        """
        if self.precision != "fp8":
            raise MisconfigurationException(
                f"`convert_modules` prepares a model for fp8, but this plugin has `precision={self.precision!r}`."
                f" Create it with `{self._entry_point}(precision='fp8')`."
            )
        if inference:
            from lightning_fabric.plugins.precision import _fp8_inference

            config = _fp8_inference.resolve_config(quant, fp8_data_path)
            return _fp8_inference.convert_for_inference(module, config)
        from lightning_fabric.plugins.precision import _fp8_training

        if recipe is not None:
            self.recipe = _fp8_training.fp8_recipe(recipe)
        return _fp8_training.replace_linear_layers(module) if replace_layers else module

    @override
    def convert_module(self, module: Module) -> Module:
        self._start_run(module)
        return super().convert_module(module)

    def _start_run(self, module: Module) -> None:
        """A run of ``module`` starts: the fp8 measurements it gathers are written if it ends well."""
        from lightning_fabric.plugins.precision import _fp8_inference

        self._measurements = tuple(_fp8_inference.measurements_in(module))
        self._failed = False

    def on_exception(self, exception: BaseException) -> None:
        """The Trainer's HPU strategies call it when the run fails, before ``teardown``: measurements are then not
        written, so a later quantization still finds the statistics of the last complete run."""
        self._failed = True

    @override
    def teardown(self) -> None:
        super().teardown()
        measurements, self._measurements = self._measurements, ()
        if not self._failed:
            for measurement in measurements:
                measurement.write()


def validate_precision(precision: Union[str, int], allowed: tuple[str, ...], owner: str) -> str:
    """``precision`` in upstream's unified form, checked against what ``owner`` runs and what this Gaudi supports."""
    unified = unified_precision(precision, allowed, owner)
    check_generation(unified)
    return unified


def unified_precision(precision: Union[str, int], allowed: tuple[str, ...], owner: str) -> str:
    """``precision`` in upstream's unified form, checked against what ``owner`` runs; asks nothing of the device, so
    Gaudi's bridge is not loaded for it."""
    if type(precision) in (str, int) and precision in _LEGACY_16:
        _info_cache.info(_LEGACY_16_NOTE)
        unified: Optional[str] = "bf16-mixed"
    else:
        try:
            unified = "fp8" if precision == "fp8" else _convert_precision_to_unified_args(precision)  # type: ignore[arg-type]
        except ValueError:
            unified = None
    if unified not in SUPPORTED:
        reason = " Gaudi has no float64." if unified == "64-true" else ""
        raise ValueError(
            f"`precision={precision!r}` is not supported on HPU.{reason} Choose one of"
            f" {', '.join(map(repr, SUPPORTED))} (or the legacy forms 32, 16, '16', 'bf16')."
        )
    if unified not in allowed:
        raise ValueError(
            f"`{owner}` runs {', '.join(map(repr, allowed))}, not `precision={precision!r}`. Use"
            f" `HPUPrecisionPlugin(precision={unified!r})`, which builds the plugin for it."
        )
    return unified


def check_generation(unified: str) -> None:
    """Refuse a precision this Gaudi lacks: first-generation Gaudi has no fp16 and no fp8."""
    if unified in _NEEDS_GAUDI2 and not _gaudi2_or_newer():
        raise ValueError(
            f"`precision={unified!r}` needs Gaudi2 or newer: first-generation Gaudi has no fp16 and no fp8."
            f" Use `precision={_NEEDS_GAUDI2[unified]!r}` instead."
        )


def check_device(device: Union[str, torch.device], owner: str) -> None:
    """lightning-habana's ``device`` argument: HPU plugins autocast and place tensors on ``"hpu"`` only."""
    try:
        device_type = torch.device(device).type
    except (RuntimeError, TypeError):
        device_type = None
    if device_type != "hpu":
        raise ValueError(
            f"`{owner}(device={device!r})`: the HPU precision plugins run on 'hpu' only. Pass `device='hpu'` or leave"
            " it out; for another device, use upstream Lightning's precision plugins."
        )


def _gaudi2_or_newer() -> bool:
    import habana_frameworks.torch.hpu as hthpu

    return hthpu.get_device_name() != "GAUDI"


def _in_lightning_habana_order(cls: type, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The arguments of a call in lightning-habana's positional order, ``(precision, device, recipe,
    replace_layers)``, by name; told from Lightning 1.x's ``(precision, opt_level, ...)`` (and upstream FSDP's
    ``(precision, scaler)``) by a device in second place. Other calls are returned as they are."""
    if len(args) < 2 or not _names_a_device(args[1]):
        return args, kwargs
    if "device" not in inspect.signature(cls.__init__).parameters:  # type: ignore[misc]
        return args, kwargs
    extra = args[1:]
    if len(extra) > len(_LIGHTNING_HABANA_ORDER):
        raise TypeError(
            f"{cls.__name__}() takes at most {1 + len(_LIGHTNING_HABANA_ORDER)} positional arguments in"
            f" lightning-habana's order (precision, {', '.join(_LIGHTNING_HABANA_ORDER)}), but {len(args)} were given."
        )
    named = dict(zip(_LIGHTNING_HABANA_ORDER, extra))
    repeated = sorted(set(named) & set(kwargs))
    if repeated:
        raise TypeError(f"{cls.__name__}() got multiple values for argument {repeated[0]!r}")
    return args[:1], {**kwargs, **named}


def _names_a_device(value: Any) -> bool:
    if isinstance(value, torch.device):
        return True
    if not isinstance(value, str):
        return False
    try:
        torch.device(value)
    except RuntimeError:
        return False
    return True


def _plugin_for(
    entry: type[HPUPrecision], args: tuple, kwargs: dict[str, Any]
) -> tuple[type[HPUPrecision], dict[str, Any]]:
    """The class that runs the precision of these arguments to the entry point ``entry``, and the arguments to build it
    with; those given must be ones it takes."""
    name = entry._entry_point
    signature = inspect.signature(entry.__init__)
    try:
        bound = signature.bind(None, *args, **kwargs).arguments
    except TypeError as error:
        raise TypeError(f"{name}: {error}") from None
    precision = bound.get("precision", "32-true")
    # the class built checks the device's generation itself, after what must precede the bridge's loading (op lists)
    unified = unified_precision(precision, SUPPORTED, name)
    chosen = entry._by_precision.get(unified, entry)
    # LightningCLI passes every argument, those left at their defaults too
    given = {key: value for key, value in list(bound.items())[2:] if value != signature.parameters[key].default}
    accepted = {"precision", "device"} if chosen is entry else set(inspect.signature(chosen.__init__).parameters)
    if "device" in given and "device" not in accepted:
        check_device(given.pop("device"), name)
    unknown = sorted(set(given) - accepted)
    if unknown:
        raise ValueError(
            f"`{name}(precision={precision!r})` takes no {', '.join(f'`{key}`' for key in unknown)}:"
            " op lists apply to 'bf16-mixed', '16-mixed' and 'fp8'; `recipe` and `replace_layers` to 'fp8'."
        )
    return chosen, {"precision": precision, **given}
