"""The wheel carries the matrix it was released with, as ``buildkit/compat_matrix.yaml``.

Everything else is declared in pyproject.toml. ``compat_matrix.yaml`` stays at the top of the
repository (where users edit it); this hook copies it into the built package, so an installed
``ascendkit`` with no matrix of its own at hand (``k8s render``, ``smoke``, ``matrix show`` from any
directory) reads the one it shipped with (buildkit/resources.py: ``released_matrix``).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MATRIX = "compat_matrix.yaml"


class BuildPyWithMatrix(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout's own file (resources.released_matrix)
            return
        source = Path(__file__).resolve().parent / MATRIX
        target = Path(self.build_lib) / "buildkit"
        self.mkpath(str(target))
        self.copy_file(str(source), str(target / MATRIX))


setup(cmdclass={"build_py": BuildPyWithMatrix})
