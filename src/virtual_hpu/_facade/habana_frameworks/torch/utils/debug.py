"""``habana_frameworks.torch.utils.debug``: the bridge's debugging hooks into its graph compiler and allocator.

The virtual Gaudi has no graph compiler passes, recipe caches or device allocator dumps. Switches of compiler passes
and caches are accepted and change nothing (a pass changes speed, not results); queries answer for a device that
falls back to the CPU for no op; the dumps and statistics of Gaudi's internals raise NotImplementedError when called.
"""

from typing import NoReturn

from habana_frameworks.torch.utils.internal import is_lazy  # noqa: F401  (the bridge's module has it)


def _not_modelled(what: str) -> NoReturn:
    raise NotImplementedError(
        f"habana_frameworks.torch.utils.debug.{what} reports Gaudi's graph compiler or device allocator, which the"
        " virtual Gaudi does not model; call it on a Gaudi."
    )


def _get_fallback_op_count() -> dict:
    """Ops that ran on the CPU, by name: none on the virtual Gaudi (see ``metric_global("cpu_fallback")``)."""
    return {}


def _get_shape_agnostic_unsupported_ops() -> set:
    _not_modelled("_get_shape_agnostic_unsupported_ops")


def _get_eager_compiler_unsupported_op_prefixes() -> set:
    _not_modelled("_get_eager_compiler_unsupported_op_prefixes")


def _get_jit_cache_size() -> int:
    _not_modelled("_get_jit_cache_size")


def _clear_jit_cache() -> None:
    """Nothing is cached between graphs on the virtual Gaudi."""


def _flush_disk_cache() -> None:
    """There is no recipe cache on disk."""


def _set_dynamic_mode() -> None:
    """Dynamic shapes need no mode on the virtual Gaudi: every shape runs."""


def _set_module_name(name: str = "") -> None:
    """Names the graphs that follow in Gaudi's dumps; nothing is dumped here."""


def _enable_eliminate_common_subexpression(flag: bool) -> None:
    """A graph compiler pass: no effect on results, so none here."""


_enable_eliminate_dead_code = _enable_eliminate_common_subexpression
_enable_constant_pooling = _enable_eliminate_common_subexpression
_enable_peephole_optimization = _enable_eliminate_common_subexpression
_enable_fuse_t_mm_optimization = _enable_eliminate_common_subexpression
_enable_fuse_bn_relu_optimization = _enable_eliminate_common_subexpression
_enable_bn_param_recalculation = _enable_eliminate_common_subexpression
_enable_fuse_conv_bn_optimization = _enable_eliminate_common_subexpression
_enable_permute_pass = _enable_eliminate_common_subexpression
_enable_replace_inplace_ops = _enable_eliminate_common_subexpression
_enable_replace_views = _enable_eliminate_common_subexpression


def _is_enabled_weight_permute_pass() -> bool:
    return False


def _is_enabled_synapse_layout_handling() -> bool:
    return True


def _is_enabled_lazy_collectives() -> bool:
    return False


def _disable_bucket_refinement() -> None:
    """Dynamic-shape buckets are the graph compiler's; nothing to refine here."""


def clear_dynamic_bucket_recipe_info() -> None:
    """Dynamic-shape buckets are the graph compiler's; nothing to clear here."""


def _memstat_livealloc(msg: str = "") -> None:
    _not_modelled("_memstat_livealloc")


def _memstat_devmem_start_collect(msg: str = "", show_cs: bool = True) -> None:
    _not_modelled("_memstat_devmem_start_collect")


def _memstat_devmem_stop_collect(msg: str = "") -> None:
    _not_modelled("_memstat_devmem_stop_collect")


def _dump_refined_recipe_stat() -> None:
    _not_modelled("_dump_refined_recipe_stat")


def _dump_bucket_memory_stat() -> None:
    _not_modelled("_dump_bucket_memory_stat")


def _dump_history_memory_stat() -> None:
    _not_modelled("_dump_history_memory_stat")


def _dump_recipe_memory_stat() -> None:
    _not_modelled("_dump_recipe_memory_stat")


def _dump_synapse_recipe_memory_stat() -> None:
    _not_modelled("_dump_synapse_recipe_memory_stat")


def _dump_dynamic_shape_memory_stat() -> None:
    _not_modelled("_dump_dynamic_shape_memory_stat")


def _dump_memory_reporter() -> None:
    _not_modelled("_dump_memory_reporter")


def load_ds_checkpoint(path: str) -> None:
    _not_modelled("load_ds_checkpoint")


def save_ds_checkpoint(path: str) -> None:
    _not_modelled("save_ds_checkpoint")
