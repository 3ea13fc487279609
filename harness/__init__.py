"""collect-node-data: measure Triton kernel configurations on a GPU and keep them in the node table."""

__version__ = "0.1.0"
