"""Shipping verified images: the distribution client, pushing by digest, multi-arch indexes and
the attachments (SBOMs) that travel with an image. Above the image stage: it reads what a build
verified and recorded, never builds."""
