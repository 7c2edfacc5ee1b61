"""lightning-habana's ``examples/fabric/train_fabric.py``: the first version (January 2024) of
``examples/fabric/image_classifier/train_fabric.py``, moved there the next day with the same calls, flags and imports
(``lightning_habana.fabric.accelerator.HPUAccelerator``, ``lightning_habana.fabric.strategies.single.
SingleHPUStrategy``); only its comments and the formatting of one print changed since. It runs the same code here,
``fabric_image_classifier_train.py``; with ``--devices`` > 1 on ``HPUParallelStrategy``, the parallel strategy
lightning-habana's Fabric package had then, where the newer script uses ``HPUDDPStrategy``.
"""

from fabric_image_classifier_train import parse_args, run

from lightning_fabric.strategies import HPUParallelStrategy

if __name__ == "__main__":
    run(parse_args(), parallel_strategy=HPUParallelStrategy)
