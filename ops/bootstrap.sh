#!/usr/bin/env bash
# Provisions this Debian 12 host with the bundle: installs ansible-core and git, then
# runs the real ansible-pull on ops/site.yml (the playbook runs on this host itself).
#
#   first time:    sudo bash bootstrap.sh --repo https://git.example.org/bundle.git [--branch main]
#   re-provision:  sudo bash /var/lib/bundle-pull/ops/bootstrap.sh
#
# The repository and branch are kept in /etc/bundle/pull.conf for later runs. Site
# settings (host names, certificate paths, ...) go in /etc/bundle/vars.yml, passed
# to the playbook when present. Arguments after `--` go to ansible-pull as they are.
set -euo pipefail

PACKAGES=(ansible-core git)
CONF=/etc/bundle/pull.conf
CHECKOUT=/var/lib/bundle-pull
VARS=/etc/bundle/vars.yml
PLAYBOOK=ops/site.yml
REPO=""
BRANCH=main

die() { echo "bootstrap: $*" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "run it as root (sudo bash $0 ...)"
# shellcheck source=/dev/null
[ -r "$CONF" ] && . "$CONF"

while [ $# -gt 0 ]; do
  case "$1" in
    --repo) REPO=${2:?--repo needs a URL}; shift 2 ;;
    --branch) BRANCH=${2:?--branch needs a name}; shift 2 ;;
    --playbook) PLAYBOOK=${2:?--playbook needs a path}; shift 2 ;;
    --vars) VARS=${2:?--vars needs a file}; shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (see the head of this script)" ;;
  esac
done
[ -n "$REPO" ] || die "no repository: give --repo URL the first time"

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ -d /etc/bundle ] || install -d -m 0755 /etc/bundle  # the base role owns its mode afterwards
printf 'REPO=%q\nBRANCH=%q\n' "$REPO" "$BRANCH" > "$CONF.new"
mv "$CONF.new" "$CONF"

args=(--url "$REPO" --checkout "$BRANCH" --directory "$CHECKOUT" --full --clean -i localhost,)
[ -f "$VARS" ] && args+=(--extra-vars "@$VARS")
exec ansible-pull "${args[@]}" "$@" "$PLAYBOOK"
