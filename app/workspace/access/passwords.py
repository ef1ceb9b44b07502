"""Password hashing (scrypt, in a threadpool: it must not block the gevent loop)
and the strength rules."""

import base64
import hashlib
import hmac
import os

import gevent.threadpool

N, R, P, LENGTH = 2**14, 8, 1, 32
MIN_LENGTH, MAX_LENGTH = 8, 256
COMMON = frozenset(
    """password passw0rd password1 password123 12345678 123456789 1234567890 qwerty123
qwertyuiop iloveyou sunshine princess football baseball welcome1 letmein1 admin123 administrator
changeme trustno1 abc12345 11111111 00000000 monkey123 dragon123""".split()
)


def _scrypt(password, salt):
    return hashlib.scrypt(password.encode(), salt=salt, n=N, r=R, p=P, dklen=LENGTH, maxmem=64 * 1024 * 1024)


def _b64(data):
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text):
    return base64.b64decode(text + "=" * (-len(text) % 4))


_pool = None


def hashing(fn, *args):
    """Run a hash in a threadpool of its own, one thread per CPU. scrypt releases
    the GIL, so the hashes do not block the loop; but more of them at once than
    there are CPUs would leave the loop thread waiting for a CPU. Created in the
    worker, after the fork."""
    global _pool
    if _pool is None:
        _pool = gevent.threadpool.ThreadPool(os.cpu_count() or 1)
    return _pool.apply(fn, args)


def hash_password(password):
    salt = os.urandom(16)
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(hashing(_scrypt, password, salt))}"


# Checked against when the account does not exist, so that an unknown user costs
# the same time as a wrong password.
_DUMMY = f"scrypt${N}${R}${P}${_b64(b'0' * 16)}${_b64(b'0' * LENGTH)}"


def verify_password(password, stored):
    """True when `password` matches `stored`; the same cost when `stored` is None."""
    try:
        _, n, r, p, salt, expected = (stored or _DUMMY).split("$")
    except ValueError:
        return False
    if (int(n), int(r), int(p)) != (N, R, P):
        derived = hashing(
            lambda: hashlib.scrypt(
                password.encode(),
                salt=_unb64(salt),
                n=int(n),
                r=int(r),
                p=int(p),
                dklen=LENGTH,
                maxmem=64 * 1024 * 1024,
            )
        )
    else:
        derived = hashing(_scrypt, password, _unb64(salt))
    return stored is not None and hmac.compare_digest(derived, _unb64(expected))


def weakness(password, username="", email=""):
    """Why `password` is too weak, or None. The rules: 8 to 256 characters, not only
    digits, at least 5 different characters, not a common password, and not
    containing the username or the email's local part."""
    if not isinstance(password, str) or len(password) < MIN_LENGTH:
        return f"must be at least {MIN_LENGTH} characters"
    if len(password) > MAX_LENGTH:
        return f"must be at most {MAX_LENGTH} characters"
    lowered = password.lower()
    if password.isdigit():
        return "must not be only digits"
    if len(set(password)) < 5:
        return "must use at least 5 different characters"
    if lowered in COMMON:
        return "is too common"
    for part in (username, email.split("@")[0]):
        if part and len(part) >= 3 and part.lower() in lowered:
            return "must not contain the username or email"
    return None
