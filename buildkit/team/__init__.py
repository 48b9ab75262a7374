"""A team\x27s image on top of a reference image (docs/team-images.md)."""
