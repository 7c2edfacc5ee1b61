"""Sphinx configuration for the PyTorch Lightning with Gaudi documentation."""

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join("..", "..", "src")))

project = "PyTorch Lightning with Gaudi"
author = "PyTorch Lightning with Gaudi contributors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.intersphinx"]
intersphinx_mapping = {}
exclude_patterns = ["build"]
html_theme = "alabaster"
