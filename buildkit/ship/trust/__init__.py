"""Trust: signatures (cosign's format), the SBOM and provenance attached to an image, and checking them."""
