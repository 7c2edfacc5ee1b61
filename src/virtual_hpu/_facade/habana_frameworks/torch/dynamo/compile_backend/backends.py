"""``torch.compile(model, backend="hpu_backend")``: dynamo captures the graph, AOT autograd splits forward from
backward, and each graph is "compiled" for the device: counted in the ``graph_compilation`` metric, then run op by
op on the virtual Gaudi. Inductor does not generate code for HPUs; this is the backend Gaudi users pass.
"""

import functools
import time
from typing import Callable, Optional

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from virtual_hpu import compilation


def _compile_graph(graph: torch.fx.GraphModule, example_inputs: list, reason: Optional[str]) -> Callable:
    started = time.perf_counter_ns()
    runner = make_boxed_func(graph.forward)
    compilation.record(graph, example_inputs, started, reason)
    return runner


@register_backend(name="hpu_backend")
def hpu_backend(graph: torch.fx.GraphModule, example_inputs: list, **kwargs) -> Callable:
    from habana_frameworks.torch.core import is_lazy

    if is_lazy():
        raise RuntimeError(
            "torch.compile(backend='hpu_backend') runs in eager mode only, and lazy mode is on (PT_HPU_LAZY_MODE=1)."
            " Unset PT_HPU_LAZY_MODE (eager is the default), or do not compile in lazy mode."
        )
    # the forward and the backward graph of this capture share the reason it was captured again
    compile_graph = functools.partial(_compile_graph, reason=compilation.new_reason())
    # the bridge keeps in-place updates of inputs inside its graphs (PT_HPU_KEEP_INPUT_MUTATIONS, on by default); a
    # buffer updated both in forward and in backward (Transformer Engine's amax history) needs that to partition
    return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph, keep_inference_input_mutations=True)(
        graph, example_inputs, **kwargs
    )
