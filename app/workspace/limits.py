"""Login attempts per client address and per account (sliding minute windows),
counted across every worker through Redis when REDIS_URL is set."""
from app.common import ratelimit
from app.common.failures import TooManyRequests

_limiters = {}


def _limiter(name, limit):
    key = (name, limit)
    if key not in _limiters:
        _limiters[key] = ratelimit.limiter(f"workspace:login:{name}", limit, 60.0)
    return _limiters[key]


def check_login(settings, address, account):
    for name, limit, key in (("address", settings.login_per_address, address),
                             ("account", settings.login_per_account, account)):
        wait = _limiter(name, limit).hit(key)
        if wait is not None:
            raise TooManyRequests("Too many sign-in attempts; try again later.",
                                  detail=f"retry in {wait} s", retry_after=wait)
