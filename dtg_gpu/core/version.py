"""The package version (one place: the root, the CLI and the feature cache read it)."""

__version__ = "0.1.0"
