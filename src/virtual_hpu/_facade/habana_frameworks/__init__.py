"""The ``habana_frameworks`` facade of the virtual Gaudi (see ``virtual_hpu``); importable only once it is active."""
