"""``habana_frameworks.torch.distributed``: collectives on Gaudi (see ``hccl``)."""
