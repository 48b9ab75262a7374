#!/bin/sh
# ascendkit inside the image: `ascendkit doctor` only (the full CLI runs on the build host).
if [ "${1:-}" = doctor ]; then
  shift
  exec python3 /usr/local/lib/ascendkit/doctor "$@"
fi
echo "ascendkit: this image carries only \`ascendkit doctor\`" >&2
exit 2
