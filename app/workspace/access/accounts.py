"""Accounts: the first Owner, later accounts, and their public shape."""

from peewee import IntegrityError

from app.common.clientaddr import client_address
from app.common.db import BuiltOnce
from app.common.failures import Conflict, Forbidden, Invalid, Unauthenticated
from app.workspace.access import limits
from app.workspace.access.passwords import hash_password, verify_password, weakness
from app.workspace.core.models import (
    DEFAULT_ORGANIZATION,
    Membership,
    Organization,
    Singleton,
    User,
    audit,
    database,
    now,
)

ADMIN_ROLES = {"owner", "user-admin"}
FIRST_USER = "first-user"


def first_user_exists():
    return Singleton.select().where(Singleton.key == FIRST_USER).exists()


def default_organization():
    return Organization.get(Organization.name == DEFAULT_ORGANIZATION)


def is_admin(user):
    return bool(ADMIN_ROLES & set(user.roles or ()))


def _check_password(password, username, email):
    problem = weakness(password, username, email)
    if problem:
        raise Invalid("Validation failed.", fields={"password": [problem]})


def _conflict_of(username, email):
    if User.select().where(User.username_key == username.lower()).exists():
        return Conflict(f"A user with the username {username!r} already exists.", fields={"username": ["is taken"]})
    if User.select().where(User.email_key == email.lower()).exists():
        return Conflict("A user with this email already exists.", fields={"email": ["is taken"]})
    return None


def create(username, email, name="", password=None, login_type="password", roles=(), actor="", password_hash=None):
    """A new active account in the default organization. The password is hashed
    before the transaction (hashing yields to other greenlets; a transaction must not)."""
    if login_type == "password":
        if password is None and password_hash is None:
            raise Invalid("Validation failed.", fields={"password": ["is required for a password account"]})
        if password_hash is None:
            _check_password(password, username, email)
            password_hash = hash_password(password)
    elif password is not None:
        raise Invalid("Validation failed.", fields={"password": [f"is not used by {login_type} accounts"]})
    conflict = _conflict_of(username, email)
    if conflict:
        raise conflict
    try:
        with database.atomic():
            user = User.create(
                username=username,
                username_key=username.lower(),
                email=email,
                email_key=email.lower(),
                name=name,
                password_hash=password_hash,
                login_type=login_type,
                roles=list(roles),
            )
            Membership.create(user=user, organization=default_organization(), roles=["organization-member"])
            audit("user.create", user, actor=actor, username=username, login_type=login_type)
    except IntegrityError:
        raise _conflict_of(username, email) or Conflict("The user already exists.") from None
    return user


def create_first(username, email, name, password):
    """The initial Owner, exactly once however many ask at the same time."""
    if first_user_exists():
        raise Conflict("The initial user has already been created.")
    _check_password(password, username, email)
    password_hash = hash_password(password)
    try:
        with database.atomic():
            Singleton.create(key=FIRST_USER)
            return create(
                username,
                email,
                name,
                login_type="password",
                roles=["owner"],
                actor="first-user",
                password_hash=password_hash,
            )
    except IntegrityError:
        raise Conflict("The initial user has already been created.") from None


def password_sign_in(settings, email: str, password: str) -> User:
    """The account that `email` and `password` sign in to, within the sign-in limits
    (limits.py: 429). Every refusal of a password says the same, 401, whether the
    account is unknown, the password wrong, or the account signs in through single
    sign-on only: the answer must not tell which emails have accounts of which kind.
    An unknown account costs the same time as a wrong password."""
    address = client_address()
    limits.check_login(settings, address, email)
    user = User.get_or_none(User.email_key == email)
    matches = verify_password(password, user.password_hash if user else None)
    if not matches or user is None or user.login_type != "password":  # (no user never matches)
        audit("user.login_failed", user, actor=address)
        raise Unauthenticated("Incorrect email or password.")
    limits.login_succeeded(settings, address, email)
    if user.status != "active":
        raise Forbidden("This account is not active.")
    audit("user.login", user, actor=address)
    return user


def set_password(user, password, actor):
    _check_password(password, user.username, user.email)
    password_hash = hash_password(password)
    User.update(password_hash=password_hash, login_type="password", updated_at=now()).where(
        User.id == user.id
    ).execute()
    audit("user.password_reset", user, actor=actor)


# It runs on every /users/me.
_organizations = BuiltOnce(lambda: Membership.select(Membership.organization).where(Membership.user == "?user?"))


def organization_ids(user):
    """The ids of the user's organizations."""
    rows = _organizations.run(database, [User.id.db_value(user.id)]).fetchall()
    return [str(Organization.id.python_value(organization)) for (organization,) in rows]


def public(user):
    # A user from the token lookup already carries them.
    organizations = getattr(user, "organization_ids", None)
    if organizations is None:
        organizations = organization_ids(user)
    return {
        "id": str(user.id),
        "username": user.username,
        "name": user.name,
        "email": user.email,
        "status": user.status,
        "login_type": user.login_type,
        "created_at": user.created_at.isoformat(timespec="seconds") + "Z",
        "organization_ids": organizations,
        "roles": list(user.roles or []),
    }
