# Type stubs for the parts of kazoo flowengine uses (kazoo ships no types).
