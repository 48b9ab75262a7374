"""Keys, signatures and provenance: what an image is signed and attested with (no registry, no engine)."""
