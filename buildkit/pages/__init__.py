"""Generated pages: each image repository's overview (``docs/repositories/``) and the page of verl's
own Ascend images beside ascendkit's stacks (``docs/verl-parity.md``)."""
