#!/bin/bash
# ascendkit: load the full CANN environment, then run the command. ATB gets its C++ ABI explicitly
# (ASCENDKIT_ATB_CXX_ABI, set in the image's ENV from the matrix): without it the script imports
# torch to guess, and every shell start takes seconds.
if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then
  # shellcheck source=/dev/null
  source /usr/local/Ascend/ascend-toolkit/set_env.sh
fi
if [ -f /usr/local/Ascend/nnal/atb/set_env.sh ]; then
  # shellcheck source=/dev/null
  source /usr/local/Ascend/nnal/atb/set_env.sh --cxx_abi="${ASCENDKIT_ATB_CXX_ABI:?the image ENV sets ASCENDKIT_ATB_CXX_ABI}"
fi
exec "$@"
