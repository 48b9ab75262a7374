"""The OCI distribution client: a registry's API (blobs, manifests, tags, referrers), its sessions, credentials and
resumable uploads, and what a registry says of a published image. It needs nothing else of ``buildkit.ship``."""
