"""``habana_frameworks.torch.dynamo``: Gaudi's ``torch.compile`` support. Importing it, as the bridge's import does,
tells dynamo about the ``hpu`` runtime (its device interface and trace rules)."""

from torch._dynamo.device_interface import register_interface_for_device

from habana_frameworks.torch.dynamo import trace_rules
from habana_frameworks.torch.dynamo.device_interface import HpuInterface

register_interface_for_device("hpu", HpuInterface)
trace_rules.register()
