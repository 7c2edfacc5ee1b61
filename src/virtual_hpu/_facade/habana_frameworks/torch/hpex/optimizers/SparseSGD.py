"""``habana_frameworks.torch.hpex.optimizers.SparseSGD``: Gaudi's SGD kernel for embedding rows with valid counts."""


def forward(*args, **kwargs):
    raise NotImplementedError(
        "The virtual Gaudi does not model `SparseSGD.forward` (a TPC kernel for sparse embedding updates with valid"
        " counts). Use dense gradients with `hpex.optimizers.FusedSGD` or `torch.optim.SGD`."
    )
