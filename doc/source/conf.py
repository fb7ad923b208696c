"""Sphinx configuration for flowengine's documentation."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
# The package (works without `pip install -e .`) and the local extension.
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(HERE, "_ext"))

import flowengine  # noqa: E402

project = "flowengine"
author = "flowengine developers"
copyright = "2026, flowengine developers"  # noqa: A001 - Sphinx's name
version = release = flowengine.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "flowengine_docs",  # tables generated from the code (state machines, schemas)
]

templates_path: list[str] = []
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
}
autodoc_member_order = "bysource"
# Signatures stay readable; the types go into the description.
autodoc_typehints = "description"
# Heavy or optional third-party imports are not needed to read docstrings.
autodoc_mock_imports = ["redis"]
nitpicky = False
