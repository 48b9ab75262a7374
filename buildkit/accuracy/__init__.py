"""The seeds' accuracy method: metrics parsed from training logs, the comparison gate, plots."""
