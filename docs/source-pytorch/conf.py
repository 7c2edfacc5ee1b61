"""Sphinx configuration for the PyTorch Lightning with Gaudi documentation."""

import os
import sys

_SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, _SRC)

# autodoc only imports the package: keep the virtual Gaudi off (no C++ build, no device) whatever the shell exports
os.environ["VIRTUAL_HPU"] = "0"


def _version() -> str:
    about: dict = {}
    with open(os.path.join(_SRC, "pytorch_lightning", "__about__.py")) as file:
        exec(file.read(), about)
    return about["__version__"]


project = "PyTorch Lightning with Gaudi"
author = "PyTorch Lightning with Gaudi contributors"
release = version = _version()
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.intersphinx", "sphinx_copybutton"]
intersphinx_mapping = {}
exclude_patterns = ["build"]
html_theme = "furo"

# the API page lists what users call; members come in the order the source defines them
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
