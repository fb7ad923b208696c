"""Listeners: objects that watch an engine's notifications and act on them.

Import the module you need (``printing``, ``logging``, ``capturing``,
``timing``); nothing is imported here so the package stays cheap to load.
"""
