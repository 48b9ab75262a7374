"""From plan to image: render the Dockerfile, build on the engine, verify, publish to a registry."""
