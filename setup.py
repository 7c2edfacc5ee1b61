"""Packaging for ``pytorch-lightning`` with Intel Gaudi (HPU) support, layered on the upstream ``lightning`` core."""

import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

_HERE = os.path.dirname(os.path.abspath(__file__))
# installed at the top of site-packages, where the interpreter runs it at start-up: with VIRTUAL_HPU=1 (only), a script
# may import `habana_frameworks` first, as on a Gaudi where the bridge is installed
_STARTUP_HOOK = ("src/virtual_hpu/_startup.pth", "virtual_hpu_startup.pth")


def _about() -> dict:
    about: dict = {}
    with open(os.path.join(_HERE, "src", "pytorch_lightning", "__about__.py")) as file:
        exec(file.read(), about)
    return about


class _BuildPyWithStartupHook(build_py):
    """Also puts the virtual Gaudi's start-up hook at the top of the installed tree, for wheels and editable installs
    alike (an editable install installs into ``install_lib`` directly)."""

    def run(self) -> None:
        super().run()
        top = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        source, name = _STARTUP_HOOK
        self.mkpath(top)
        self.copy_file(os.path.join(_HERE, source), os.path.join(top, name))


def _requirements(name: str) -> list:
    with open(os.path.join(_HERE, "requirements", f"{name}.txt")) as file:
        lines = (line.split("#", 1)[0].strip() for line in file)
        return [line for line in lines if line]


setup(
    # the same distribution name as upstream, so installing this one replaces upstream's files instead of
    # silently overwriting them
    name="pytorch-lightning",
    version=_about()["__version__"],
    description="PyTorch Lightning with Intel Gaudi (HPU) support built into the Trainer",
    long_description=open(os.path.join(_HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    package_dir={"": "src"},
    packages=find_packages("src"),
    # the habana_frameworks facade is a sys.path root of its own, put on the path only when activated
    package_data={
        "virtual_hpu": ["csrc/*", "_facade/**/*.py"],
        "lightning_fabric": ["plugins/precision/fp8_configs/*.json"],
    },
    cmdclass={"build_py": _BuildPyWithStartupHook},
    python_requires=">=3.9",
    install_requires=_requirements("base"),
    extras_require={name: _requirements(name) for name in ("test", "docs", "deepspeed", "fp8", "profiler")},
    # `import torch` activates the virtual Gaudi (only with VIRTUAL_HPU=1), as it loads the real bridge, and on a Gaudi
    # lets Fabric resolve HPU flags (see src/_lightning_hpu)
    entry_points={
        "torch.backends": [
            "virtual_hpu = virtual_hpu._autoload:autoload",
            "lightning_hpu = _lightning_hpu:autoload",
        ]
    },
)
