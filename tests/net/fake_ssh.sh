#!/bin/sh
# A stand-in for ssh in the launcher tests: `fake_ssh.sh [--unreachable] HOST
# COMMAND` logs "HOST COMMAND" to $FAKE_SSH_LOG and runs COMMAND here with sh,
# as ssh would on HOST. --unreachable exits 255 the way ssh does when it cannot
# connect.
if [ "$1" = "--unreachable" ]; then
  echo "ssh: connect to host $2 port 22: Connection refused" >&2
  exit 255
fi
host=$1
shift
[ -n "$FAKE_SSH_LOG" ] && echo "$host $*" >>"$FAKE_SSH_LOG"
exec sh -c "$*"
