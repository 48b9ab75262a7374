"""Load and validate the compatibility matrix: models, YAML with source locations, rules, tables."""
