#!/bin/sh
# The workspace agent's init script, from the platform at @ACCESS_URL@.
# It fetches the agent over the platform's own origin, checks its SHA-256, and runs
# it with Debian's python3 (standard library only), again whenever it stops: after
# a crash, a kill, or when the platform says this agent is out of date.
#
#   curl -fsSL @ACCESS_URL@/api/v2/init-script | WORKSPACE_AGENT_TOKEN=<token> sh -s -- [--app slug=http://127.0.0.1:8080 ...]
#
# Needs: sh, curl, python3 (3.9 or later), sha256sum. The agent's file is kept in
# $WORKSPACE_AGENT_DIR (default ~/.cache/workspace-agent). Stop it with SIGTERM.
set -u
ACCESS_URL='@ACCESS_URL@'
@TOKEN@
if [ -z "${WORKSPACE_AGENT_TOKEN:-}" ]; then
    echo "workspace-agent init: WORKSPACE_AGENT_TOKEN is not set (the agent token, from the platform)" >&2
    exit 2
fi
export WORKSPACE_AGENT_TOKEN
for tool in curl python3 sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || { echo "workspace-agent init: $tool is not installed" >&2; exit 2; }
done
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
    echo "workspace-agent init: the agent needs Python 3.9 or later; python3 is $(python3 -V 2>&1)" >&2
    exit 2
fi
DIR="${WORKSPACE_AGENT_DIR:-${HOME:-/tmp}/.cache/workspace-agent}"
mkdir -p "$DIR" && chmod 700 "$DIR" || exit 2
AGENT="$DIR/@FILE_NAME@"

# The platform's agent in $AGENT, unless the one there already has its digest.
fetch_agent() {
    digest=$(curl -fsS --max-time 30 "$ACCESS_URL/bin/@FILE_NAME@.sha256" | cut -d' ' -f1) || return 1
    case "$digest" in
        *[!0-9a-f]* | "") echo "workspace-agent init: the platform sent no digest" >&2; return 1 ;;
    esac
    if [ -f "$AGENT" ] && echo "$digest  $AGENT" | sha256sum -c --status 2>/dev/null; then
        return 0
    fi
    curl -fsS --max-time 300 -o "$AGENT.part" "$ACCESS_URL/bin/@FILE_NAME@" || return 1
    if ! echo "$digest  $AGENT.part" | sha256sum -c --status; then
        echo "workspace-agent init: the agent's file does not match its SHA-256; not run" >&2
        rm -f "$AGENT.part"
        return 1
    fi
    mv "$AGENT.part" "$AGENT" && echo "workspace-agent init: fetched the agent ($digest)" >&2
}

child=""
trap 'if [ -n "$child" ]; then kill "$child" 2>/dev/null; wait "$child"; fi; exit 0' TERM INT HUP
delay=1
while :; do
    if fetch_agent; then
        started=$(date +%s)
        python3 -I "$AGENT" agent --url "$ACCESS_URL" "$@" &
        child=$!
        wait "$child"
        status=$?
        child=""
        if [ "$status" -eq @OUTDATED@ ]; then
            # The platform's file is fetched next; should it say so again, the wait grows.
            echo "workspace-agent init: the agent is out of date; fetching the platform's" >&2
        else
            echo "workspace-agent init: the agent stopped (status $status); starting it again" >&2
            [ $(( $(date +%s) - started )) -ge 60 ] && delay=1
        fi
    fi
    sleep "$delay"
    delay=$(( delay * 2 > 30 ? 30 : delay * 2 ))
done
