"""The version of ascendkit (one place: packaging, --version and the SBOMs it writes read it)."""

__version__ = "0.1.0"
# The name pip installs it by (the `ascendkit` project on PyPI is another one): what generated CI installs.
DISTRIBUTION = "ascendkit-verl"
