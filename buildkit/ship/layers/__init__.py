"""The path of a layer from the engine to the registry: exported out of ``docker save`` as it streams, normalized
(times clamped, written one way whichever differ wrote it), compressed, composed into manifests; the local image it
belongs to, and which blobs a publish needs."""
