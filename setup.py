"""Shim for tools that still call setup.py; metadata lives in setup.cfg."""

import setuptools

setuptools.setup()
