"""``habana_frameworks.torch.dynamo``: Gaudi's ``torch.compile`` support."""
