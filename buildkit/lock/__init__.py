"""Resolve the matrix against the package indexes: index client, sdist metadata, uv resolution, lock files, wheelhouses."""
