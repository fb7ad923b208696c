"""flowengine: a TaskFlow-compatible workflow engine.

Kept deliberately light: importing the package must not import engines,
kombu or networkx; programs import the submodules they need.
"""

__version__ = "0.1.0"
