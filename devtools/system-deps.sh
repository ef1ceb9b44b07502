#!/usr/bin/env bash
# Installs the Debian packages of one layer, when missing:
#   system-deps.sh run    what running the bundle needs (`make run`): python3-venv, nginx,
#                         espeak-ng (the audio service's speech engine)
#   system-deps.sh test   that and the test laboratory (`make test`): Chromium, debootstrap,
#                         systemd-nspawn, PostgreSQL, Redis, LemonLDAP::NG, pebble, sshd, wrk,
#                         promtool (Debian's prometheus: the alert rules' checks), restic and
#                         pgbackrest (the backups' checks), patroni with python3-pysyncobj and
#                         redis-sentinel (the data tier's failover checks) ...
# Needs root for apt-get; as another user it prints the `sudo apt-get install` line to run
# and stops (nothing is needed when every package is present).
set -euo pipefail
layer=${1:-test}
# command -> Debian package
declare -A PACKAGES=([nginx]=nginx-light [espeak-ng]=espeak-ng)
case "$layer" in
  run) ;;
  test)
    PACKAGES+=([openssl]=openssl [chromium]=chromium [debootstrap]=debootstrap [systemd-nspawn]=systemd-container
               [systemd-analyze]=systemd [node]=nodejs [redis-server]=redis-server [wrk]=wrk [nft]=nftables
               [ip]=iproute2 [pebble]=pebble [sshd]=openssh-server [ssh]=openssh-client [promtool]=prometheus
               [restic]=restic [pgbackrest]=pgbackrest [patroni]=patroni [redis-sentinel]=redis-sentinel) ;;
  *) echo "usage: $0 run|test" >&2; exit 2 ;;
esac
missing=()
for cmd in "${!PACKAGES[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("${PACKAGES[$cmd]}")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ "$layer" = test ]; then
  # PostgreSQL's server programs live outside PATH, under its version's folder.
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
  # Patroni's Raft store (no etcd), for Debian's patroni, which runs on the system python3.
  /usr/bin/python3 -c 'import pysyncobj' 2>/dev/null || missing+=(python3-pysyncobj)
  # The two-host staging's front balances TCP with nginx's stream module.
  [ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || missing+=(libnginx-mod-stream)
  # LemonLDAP::NG, the real OpenID provider of the single sign-on tests, with the Perl
  # modules its portal loads at start that Debian only recommends (the captcha's images).
  [ -x /usr/sbin/llng-fastcgi-server ] || missing+=(liblemonldap-ng-portal-perl lemonldap-ng-fastcgi-server)
  perl -MGD::SecurityImage -MImage::Magick -MString::Random -MIO::String -e1 2>/dev/null ||
    missing+=(libgd-securityimage-perl libimage-magick-perl libstring-random-perl libio-string-perl)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages (make $layer needs them): ${missing[*]}" >&2
  echo "run: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# prometheus is here for its promtool only, patroni and redis-sentinel for the programs
# the failover tests start themselves: none of their daemons (prometheus' port 9090 and
# the node exporter it recommends, a Patroni, a sentinel on 26379) must start on a test
# machine, now or at the next boot.
declare -A DAEMONS=([prometheus]=prometheus.service [patroni]=patroni.service [redis-sentinel]=redis-sentinel.service)
with_daemon=()
for package in "${!DAEMONS[@]}"; do
  [[ " ${missing[*]} " == *" $package "* ]] && with_daemon+=("${DAEMONS[$package]}")
done
policy=/usr/sbin/policy-rc.d
if [ ${#with_daemon[@]} -gt 0 ] && [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for unit in "${with_daemon[@]}"; do
  if [ -d /run/systemd/system ]; then
    systemctl disable --now "$unit" >/dev/null 2>&1 || true
  else
    systemctl disable "$unit" >/dev/null 2>&1 || true
  fi
done
# The apps bench runs an sshd of its own on a private loopback port; the system-wide one
# that installing openssh-server just started is not wanted on a test machine.
if [[ " ${missing[*]} " == *" openssh-server "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
fi
