"""The version of ascendkit (one place: packaging, --version and the SBOMs it writes read it)."""

__version__ = "0.1.0"
