"""Every name owned by torch or upstream Lightning that the product (``_lightning_hpu``, ``pytorch_lightning``,
``lightning_fabric``) changes: what, to what, when, why, and how to do without.

The product extends upstream by subclassing and registering (accelerators, strategies, plugins in upstream's
registries); that changes no name. Where upstream has no extension point, it rebinds a name, and each such change is a
row of :data:`FOREIGN_NAMES`, the connector rebindings first (from :data:`_lightning_hpu._REBINDINGS`, which applies
them). ``tests/tests_pytorch/test_upstream_contracts.py`` fails when a row's target is gone, when code in ``src/``
changes a name of torch or upstream that no row lists, and when a row no longer matches any code. The virtual Gaudi's
own table is :data:`virtual_hpu.foreign_names.FOREIGN_NAMES`.
"""

from _lightning_hpu import _REBINDINGS
from virtual_hpu.foreign_names import ForeignName

_APPLY_CONNECTOR = "_lightning_hpu/__init__.py::_use_hpu_connector"
# a connector class is replaced by a subclass, a function by one that wraps it
_KIND = {True: "subclass", False: "counterpart, which calls it for other devices"}

FOREIGN_NAMES = (
    *(
        ForeignName(
            f"{module}.{rebinding.name}",
            f"`{rebinding.hpu.replace(':', '.')}`, its HPU {_KIND[rebinding.name[0].isupper()]}",
            _APPLY_CONNECTOR,
            "when a Gaudi is present (Intel's `habana_frameworks` installed, or VIRTUAL_HPU=1): at `import torch`"
            " (PyTorch's device-backend autoload) or at `import pytorch_lightning` / `import lightning_fabric`, as"
            f" soon as `{rebinding.module}` has run; for the process",
            f"{rebinding.why}; ours reaches `lightning.Trainer` and `lightning.Fabric`, which scripts and"
            " libraries already use",
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0 and importing neither `pytorch_lightning` nor `lightning_fabric`; or no"
            " Gaudi (VIRTUAL_HPU unset, no `habana_frameworks`)",
        )
        for rebinding in _REBINDINGS
        # upstream's module, and the module that uses the name where that has already bound it
        for module in (rebinding.module, rebinding.user)
    ),
    ForeignName(
        "torch.nn.functional.linear",
        "the function it was before the strategy's set-up",
        "pytorch_lightning/strategies/hpu_deepspeed.py::HPUDeepSpeedStrategy.teardown",
        "at the end of a run of `HPUDeepSpeedStrategy`; it undoes DeepSpeed's change",
        "DeepSpeed's ZeRO-3 replaces `torch.nn.functional.linear` for the whole process with its memory-efficient"
        " linear and leaves it there; its backward autocasts on the HPU, which breaks CPU autocast code run after"
        " `fit`",
        "none needed: it restores torch's own",
    ),
    *(
        ForeignName(
            f"deepspeed.utils.groups.{name}",
            "None",
            "lightning_fabric/strategies/hpu_deepspeed.py::release_groups_of_an_ended_world",
            "with Intel's DeepSpeed fork (no `_release_process_group_references`), when an HPU DeepSpeed strategy sets"
            " up a process group and none exists: the group DeepSpeed kept belongs to a destroyed world",
            "DeepSpeed keeps the groups it derives from the world in module globals and the fork never releases them:"
            " the next engine fails with 'Group ... is not registered'",
            "destroy the world with `deepspeed.comm.destroy_process_group()` of upstream DeepSpeed, or run one"
            " DeepSpeed world per process",
        )
        for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP")
    ),
    ForeignName(
        "torch.distributed.init_process_group",
        "torch's function, dropping the `device_id` argument",
        "lightning_fabric/strategies/_hpu.py::_unbound_where_torch_binds_cuda_only",
        "before torch 2.7, during upstream's set-up of the process group in each HPU strategy that starts one"
        " process per HPU; restored right after, also on failure",
        "before torch 2.7 a group binds to a CUDA device only and refuses an HPU's `device_id`, which upstream passes;"
        " the group is left unbound anyway",
        "torch 2.7 or later (it is not made there); or create the process group before the Trainer or Fabric does",
    ),
    ForeignName(
        "torch.distributed.GroupMember.WORLD.bound_device_id",
        "None: the default group, bound to the rank's HPU by upstream, is left unbound",
        "lightning_fabric/strategies/_hpu.py::hccl_process_group",
        "after upstream's set-up of a process group it created, in each HPU strategy that starts one process per HPU;"
        " for the life of that group",
        "a bound group has torch ask every later group for a backend of that device: gloo serves no HPU, so"
        " `new_group(backend='gloo')` (Lightning's own, libraries' CPU groups) fails, and `DeviceMesh` splits its"
        " groups from the bound one, which HCCL cannot; Intel's examples and lightning-habana leave it unbound too",
        "create the process group before the Trainer or Fabric does: a group the user created is left as it is",
    ),
)
