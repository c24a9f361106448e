"""etcdctl's auth commands on raftkv (docs/security.md): `raftkv auth enable|disable|status`,
`raftkv user add|delete|get|list|passwd|grant-role|revoke-role` and `raftkv role
add|delete|get|list|grant-permission|revoke-permission`, with etcdctl's arguments and messages.
Once auth is enabled they need --user root (or another user with the root role)."""
from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from kv.client.auth_admin import PERMISSION_TYPES
from kv.client.client import Client
from kv.errors import FailedPreconditionError
from kv.tools.arguments import Formatter
from kv.tools.client_options import b64, client_of
from kv.tools.write_out import JSON, SIMPLE, TABLE, add_write_out, print_table
from statemachine.auth_state import ROOT, ROOT_ROLE_MISSING

_SETUP = ("examples (the first setup, as with etcdctl):\n"
          "  raftkv user add root                     asks for root's password\n"
          "  raftkv auth enable                       also makes the role root and grants it to root\n"
          "  raftkv role add app-reader --user root   asks for root's password (or RAFTKV_PASSWORD)\n"
          "  raftkv role grant-permission app-reader read app/ --prefix --user root\n"
          "  raftkv user add alice --new-user-password ... --user root\n"
          "  raftkv user grant-role alice app-reader --user root\n"
          "  raftkv get app/1 --user alice            asks for alice's password (or RAFTKV_PASSWORD)")


def add_auth_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    _add_auth(commands, client_options)
    _add_user(commands, client_options)
    _add_role(commands, client_options)


def _group(commands: Any, name: str, help: str, description: str) -> Any:
    parser = commands.add_parser(name, formatter_class=Formatter, help=help, description=description, epilog=_SETUP)
    return parser.add_subparsers(dest="action", metavar="ACTION", required=True)


def _action(actions: Any, client_options: argparse.ArgumentParser, name: str, description: str,
            run: Any, *arguments: tuple[str, str]) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, parents=[client_options], formatter_class=Formatter,
                                help=_first_sentence(description), description=description)
    for argument, text in arguments:
        parser.add_argument(argument, help=text)
    parser.set_defaults(run=run, command_parser=parser)
    return parser


def _first_sentence(text: str) -> str:
    return text.replace("\n", " ").split(". ")[0].rstrip(".")


# ---- auth ---------------------------------------------------------------------------------------

def _add_auth(commands: Any, client_options: argparse.ArgumentParser) -> None:
    actions = _group(commands, "auth", "enable, disable or show authentication",
                     "Turn users, roles and permissions on or off (etcdctl auth).")
    _action(actions, client_options, "enable",
            "Enable authentication. Needs a user root; as etcdctl does, the role root is made and\n"
            "granted to root when root does not have it. From then on every request needs a user.",
            _run_auth_enable)
    _action(actions, client_options, "disable", "Disable authentication (root only).", _run_auth_disable)
    status = _action(actions, client_options, "status", "Print whether authentication is enabled.", _run_auth_status)
    add_write_out(status, SIMPLE, simple="Authentication Status: true or false", table="one column, ENABLED",
                  json='{"enabled": true or false}')


def _run_auth_enable(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        try:
            client.auth_enable()
        except FailedPreconditionError as error:
            if str(error) != ROOT_ROLE_MISSING:
                raise
            _give_root_its_role(client)
            client.auth_enable()
    print("Authentication Enabled")
    return 0


def _give_root_its_role(client: Client) -> None:
    if ROOT not in client.role_list():
        client.role_add(ROOT)
    client.user_grant_role(ROOT, ROOT)


def _run_auth_disable(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.auth_disable()
    print("Authentication Disabled")
    return 0


def _run_auth_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        enabled = bool(client.auth_status()["enabled"])
    if args.write_out == JSON:
        print(json.dumps({"enabled": enabled}))
    elif args.write_out == TABLE:
        print_table(("ENABLED",), [(str(enabled).lower(),)])
    else:
        print(f"Authentication Status: {str(enabled).lower()}")
    return 0


# ---- users --------------------------------------------------------------------------------------

_NAME = ("name", "the user's name")


def _add_user(commands: Any, client_options: argparse.ArgumentParser) -> None:
    actions = _group(commands, "user", "add, delete, list users, change passwords, grant roles",
                     "Users of the cluster (etcdctl user). Once auth is enabled, root only.")
    for name, text in (("add", "Add a user"), ("passwd", "Change a user's password")):
        parser = _action(actions, client_options, name,
                         f"{text}. The password comes from --new-user-password, else from stdin when it is\n"
                         "not a terminal (its first line), else from a prompt (asked twice).",
                         _run_user_add if name == "add" else _run_user_passwd, _NAME)
        parser.add_argument("--new-user-password", default=None, metavar="PASSWORD",
                            help="the password (shows in the process list: prefer stdin or the prompt)")
    _action(actions, client_options, "delete", "Delete a user; its tokens stop working.", _run_user_delete, _NAME)
    get = _action(actions, client_options, "get", "Print a user's roles.", _run_user_get, _NAME)
    add_write_out(get, SIMPLE, simple="User: NAME and Roles: ROLE ... lines", table="USER and ROLES",
                  json='{"name": NAME, "roles": [ROLE, ...]}')
    _add_list_output(_action(actions, client_options, "list", "List the users.", _run_user_list), "user")
    _action(actions, client_options, "grant-role", "Grant a role to a user.", _run_user_grant_role, _NAME,
            ("role", "the role's name"))
    _action(actions, client_options, "revoke-role", "Revoke a role from a user.", _run_user_revoke_role, _NAME,
            ("role", "the role's name"))


def new_password(args: argparse.Namespace, name: str) -> str:
    """--new-user-password, else stdin's first line when it is not a terminal, else a prompt, twice."""
    if args.new_user_password is not None:
        return args.new_user_password
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    password = getpass.getpass(f"Password of {name}: ")
    if getpass.getpass("Type password of {name} again for confirmation: ".format(name=name)) != password:
        raise ValueError("the passwords do not match")
    return password


def _run_user_add(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    password = new_password(args, args.name)
    with client_of(args) as client:
        client.user_add(args.name, password)
    print(f"User {args.name} created")
    return 0


def _run_user_passwd(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    password = new_password(args, args.name)
    with client_of(args) as client:
        client.user_change_password(args.name, password)
    print("Password updated")
    return 0


def _run_user_delete(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.user_delete(args.name)
    print(f"User {args.name} deleted")
    return 0


def _run_user_get(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        user = client.user_get(args.name)
    if args.write_out == JSON:
        print(json.dumps({"name": user["name"], "roles": list(user["roles"])}))
    elif args.write_out == TABLE:
        print_table(("USER", "ROLES"), [(user["name"], " ".join(user["roles"]))])
    else:
        print(f"User: {user['name']}\nRoles: {' '.join(user['roles'])}")
    return 0


def _run_user_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        _print_names(args.write_out, "user", client.user_list())
    return 0


def _add_list_output(parser: argparse.ArgumentParser, kind: str) -> None:
    add_write_out(parser, SIMPLE, simple="one name a line", table=f"one column, {kind.upper()}",
                  json=f'{{"{kind}s": [NAME, ...]}}')


def _print_names(write_out: str, kind: str, names: list[str]) -> None:
    """`user list` / `role list` in the -w form asked for."""
    if write_out == JSON:
        print(json.dumps({f"{kind}s": names}))
    elif write_out == TABLE:
        print_table((kind.upper(),), [(name,) for name in names])
    else:
        for name in names:
            print(name)


def _run_user_grant_role(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.user_grant_role(args.name, args.role)
    print(f"Role {args.role} is granted to user {args.name}")
    return 0


def _run_user_revoke_role(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.user_revoke_role(args.name, args.role)
    print(f"Role {args.role} is revoked from user {args.name}")
    return 0


# ---- roles --------------------------------------------------------------------------------------

_ROLE = ("role", "the role's name")


def _add_role(commands: Any, client_options: argparse.ArgumentParser) -> None:
    actions = _group(commands, "role", "add, delete, list roles, grant and revoke permissions",
                     "Roles and their key permissions (etcdctl role). Once auth is enabled, root only.")
    _action(actions, client_options, "add", "Add a role (with no permissions).", _run_role_add, _ROLE)
    _action(actions, client_options, "delete", "Delete a role; its users lose it.", _run_role_delete, _ROLE)
    get = _action(actions, client_options, "get", "Print a role's permissions.", _run_role_get, _ROLE)
    add_write_out(get, SIMPLE, simple="etcdctl's KV Read: and KV Write: lists", table="PERMISSION and RANGE, a row each",
                  json='{"name": ROLE, "permissions": [{"perm": read|write|readwrite, "key": KEY, "range_end": END}, '
                       '...]}, keys in base64')
    _add_list_output(_action(actions, client_options, "list", "List the roles.", _run_role_list), "role")
    grant = _action(actions, client_options, "grant-permission",
                    "Let a role read, write or readwrite KEY, the range [KEY, RANGE_END), or with\n"
                    "--prefix every key starting with KEY. A grant on the same key and range end\n"
                    "replaces the earlier one's type.", _run_role_grant, _ROLE)
    grant.add_argument("perm", choices=tuple(PERMISSION_TYPES), help="what the role may do")
    _add_range(grant)
    revoke = _action(actions, client_options, "revoke-permission",
                     "Take back the permission granted on exactly KEY and RANGE_END (or --prefix).",
                     _run_role_revoke, _ROLE)
    _add_range(revoke)


def _add_range(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", metavar="KEY", help="the key, or the start of the range")
    parser.add_argument("range_end", metavar="RANGE_END", nargs="?", default=None,
                        help="the end of the range (exclusive)")
    parser.add_argument("--prefix", action="store_true", help="every key starting with KEY")


def _run_role_add(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.role_add(args.role)
    print(f"Role {args.role} created")
    return 0


def _run_role_delete(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        client.role_delete(args.role)
    print(f"Role {args.role} deleted")
    return 0


def _run_role_get(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        role = client.role_get(args.role)
    if args.write_out == JSON:
        print(json.dumps({"name": role["name"], "permissions": [
            {"perm": p["perm"], "key": b64(p["key"]), "range_end": b64(p["range_end"])} for p in role["permissions"]]}))
    elif args.write_out == TABLE:
        print_table(("PERMISSION", "RANGE"),
                    [(p["perm"], _describe_range(p["key"], p["range_end"])) for p in role["permissions"]])
    else:
        _print_role_lines(role)
    return 0


def _print_role_lines(role: dict[str, Any]) -> None:
    """etcdctl's `role get` lines."""
    print(f"Role {role['name']}")
    for title, kinds in (("KV Read:", ("read", "readwrite")), ("KV Write:", ("write", "readwrite"))):
        print(title)
        for perm in role["permissions"]:
            if perm["perm"] in kinds:
                print(f"\t{_describe_range(perm['key'], perm['range_end'])}")


def _describe_range(key: bytes, range_end: bytes) -> str:
    shown = key.decode("utf-8", "backslashreplace")
    if not range_end:
        return shown
    if range_end == b"\0":
        return f"[{shown}, <open ended>"
    return f"[{shown}, {range_end.decode('utf-8', 'backslashreplace')})"


def _run_role_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        _print_names(args.write_out, "role", client.role_list())
    return 0


def _checked_range(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.prefix and args.range_end is not None:
        parser.error("give RANGE_END or --prefix, not both")


def _run_role_grant(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _checked_range(args, parser)
    with client_of(args) as client:
        client.role_grant_permission(args.role, args.key, args.range_end, prefix=args.prefix, perm=args.perm)
    print(f"Role {args.role} updated")
    return 0


def _run_role_revoke(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _checked_range(args, parser)
    with client_of(args) as client:
        client.role_revoke_permission(args.role, args.key, args.range_end, prefix=args.prefix)
    where = f"[{args.key}, {args.range_end})" if args.range_end else args.key + (" (prefix)" if args.prefix else "")
    print(f"Permission of key {where} is revoked from role {args.role}")
    return 0

