"""``habana_frameworks.torch.dynamo.trace_rules``: how dynamo treats ``habana_frameworks.torch.hpu`` in a traced frame.

As the bridge does: the package is skipped (dynamo does not trace into the runtime's Python), and the runtime queries a
model or FSDP calls inside a compiled region are kept in the graph instead of breaking it: ``current_stream`` and
``stream`` as stream values dynamo models, the device count and index and ``is_available`` folded into constants.
"""

import torch._dynamo.trace_rules as _rules
from torch._dynamo.variables.torch import TorchInGraphFunctionVariable, constant_fold_functions

from habana_frameworks.torch import hpu

_IN_GRAPH = ("current_stream", "stream", "is_available", "current_device", "device_count")
_CONSTANT_FOLDED = (hpu.is_available, hpu.current_device, hpu.device_count)


def register() -> None:
    """Add the rules to dynamo's; called once, when ``habana_frameworks.torch.dynamo`` is imported."""
    _rules.add(hpu.__name__)
    _rules.torch_name_rule_map.append({f"{hpu.__name__}.{name}": TorchInGraphFunctionVariable for name in _IN_GRAPH})
    # the map is built once, at dynamo's first use of it
    _rules.get_torch_obj_rule_map.cache_clear()
    for function in (hpu.stream, hpu.current_stream):
        _rules._allowed_callable_ids.add(id(function))
    constant_fold_functions.update(dict.fromkeys(_CONSTANT_FOLDED))
