"""Lazy pulling: the SOCI index of an image (its zTOCs over each gzip layer's tar index)."""
