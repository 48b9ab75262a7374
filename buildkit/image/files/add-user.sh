#!/bin/bash
# ascendkit: make the image's non-root user, NAME with UID:GID and a home, whatever the base brings.
#   add-user.sh NAME UID GID HOME WRITABLE_DIR...
# The CANN base may already have the user (some Ascend images create HwHiAiUser), or give the uid
# or gid another name (a distribution's default user): the entry is then renamed, so the numbers
# the host's driver files and devices are owned by always resolve to NAME. A NAME taken with other
# numbers is renumbered. Each WRITABLE_DIR is created (if missing) and owned by the user, as is
# the home with the caches the jobs fill (Hugging Face, Triton, torch compile, vLLM).
set -euo pipefail
if [ "$#" -lt 4 ]; then
  echo "usage: add-user.sh NAME UID GID HOME [WRITABLE_DIR...]" >&2
  exit 2
fi
name=$1 uid=$2 gid=$3 home=$4
shift 4

entry() { getent "$1" "$2" | cut -d: -f1 || true; }

group_of_gid=$(entry group "$gid")
if [ -z "$group_of_gid" ]; then
  if [ -n "$(entry group "$name")" ]; then
    echo "add-user: group $name exists with another gid: renumbering it to $gid" >&2
    groupmod --gid "$gid" "$name"
  else
    groupadd --gid "$gid" "$name"
  fi
elif [ "$group_of_gid" != "$name" ]; then
  if [ -n "$(entry group "$name")" ]; then
    echo "add-user: gid $gid is group $group_of_gid and group $name exists with another gid; fix the base image" >&2
    exit 1
  fi
  echo "add-user: gid $gid is group $group_of_gid in the base: renaming it to $name" >&2
  groupmod --new-name "$name" "$group_of_gid"
fi

user_of_uid=$(entry passwd "$uid")
if [ -z "$user_of_uid" ]; then
  if [ -n "$(entry passwd "$name")" ]; then
    echo "add-user: user $name exists with another uid: renumbering it to $uid" >&2
    usermod --uid "$uid" --gid "$gid" --home "$home" --shell /bin/bash "$name"
  else
    useradd --uid "$uid" --gid "$gid" --home-dir "$home" --no-create-home --shell /bin/bash "$name"
  fi
elif [ "$user_of_uid" != "$name" ]; then
  if [ -n "$(entry passwd "$name")" ]; then
    echo "add-user: uid $uid is user $user_of_uid and user $name exists with another uid; fix the base image" >&2
    exit 1
  fi
  echo "add-user: uid $uid is user $user_of_uid in the base: renaming it to $name" >&2
  usermod --login "$name" --gid "$gid" --home "$home" --shell /bin/bash "$user_of_uid"
else
  usermod --gid "$gid" --home "$home" --shell /bin/bash "$name"
fi

mkdir -p "$home/.cache/huggingface" "$home/.triton" "$home/.cache/vllm" "$home/ascend/log" "$@"
chown -R "$uid:$gid" "$home" "$@"
chmod 0750 "$home"
id "$name"
