#!/bin/sh
# The backup of bundle-pg-backup@<type>.service: `pgbackrest --type=<type> backup`.
# On the HA tier pgBackRest copies the files from a standby (backup-standby). With no
# standby to copy from (its error 56: both down, or their pgBackRest servers out of
# reach), the leader backs up from itself rather than not at all, and says so.
set -u
pgbackrest --type="$1" backup
status=$?
if [ "$status" -eq 56 ]; then
    echo "bundle-pg-backup: no standby to copy from; backing up from the primary instead" >&2
    exec pgbackrest --type="$1" --no-backup-standby backup
fi
exit "$status"
