"""Sign-in limits that slow a guesser down and never lock the right password out
from another address. Failed attempts are counted per (account, address) pair and
per address, across every worker through Redis when REDIS_URL is set:

- a pair may fail WORKSPACE_LOGIN_RATE_PER_ACCOUNT times, an address (over all
  accounts) WORKSPACE_LOGIN_RATE_PER_ADDRESS times; past that, each further attempt
  makes the next one wait WORKSPACE_LOGIN_DELAY_SECONDS, doubled each time, at most
  WORKSPACE_LOGIN_MAX_DELAY_SECONDS. An attempt during the wait is 429 with
  Retry-After, and its password is not checked.
- a success forgets its pair's failures (and gives its one attempt back to the
  address). Counts are forgotten an hour after the last attempt's wait.

So no one elsewhere can stop alice signing in: her account counts only against the
addresses that guessed at it."""

import ipaddress

from app.common import ratelimit
from app.common.failures import TooManyRequests

FORGET_SECONDS = 3600
_backoffs: dict[tuple, ratelimit.Backoff] = {}


def _backoff(settings, name, free):
    key = (name, free, settings.login_delay_seconds, settings.login_max_delay_seconds)
    if key not in _backoffs:
        _backoffs[key] = ratelimit.backoff(
            f"workspace:login:{name}",
            free,
            settings.login_delay_seconds,
            settings.login_max_delay_seconds,
            FORGET_SECONDS,
        )
    return _backoffs[key]


def _guesser(address):
    """What counts as one guesser: an IPv4 address, or an IPv6 address's /64 (one
    host usually holds a whole /64, and would otherwise get a fresh allowance from
    each of its 2^64 addresses)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


def _checks(settings, address, account):
    guesser = _guesser(address)
    return (
        (_backoff(settings, "pair", settings.login_per_account), (account, guesser)),
        (_backoff(settings, "address", settings.login_per_address), guesser),
    )


def check_login(settings, address: str, account: str) -> None:
    """Count this sign-in attempt as a failure in advance (login_succeeded gives it
    back); 429 with Retry-After while the pair or the address must wait."""
    counted: list[tuple] = []
    for limiter, key in _checks(settings, address, account):
        wait = limiter.attempt(key)
        if wait is not None:
            for done, done_key in counted:  # a refused attempt costs no one anything
                done.forgive(done_key)
            raise TooManyRequests(
                "Too many failed sign-in attempts from your address; try again later.",
                detail=f"retry in {wait} s",
                retry_after=wait,
            )
        counted.append((limiter, key))


def login_succeeded(settings, address: str, account: str) -> None:
    """The password was right: forget the pair's failures; the address gets its attempt back."""
    (pair, pair_key), (by_address, address_key) = _checks(settings, address, account)
    pair.reset(pair_key)
    by_address.forgive(address_key)
