"""`raftkv member list|add|remove|promote|update` and `raftkv leader transfer`: the cluster's members
and its leadership, through etcd's Cluster service and MoveLeader (kv/client/members.py), as
etcdctl's `member` and `move-leader` commands."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from kv.client.client import Client
from kv.client.router import parse_endpoints
from kv.tools.arguments import Formatter
from kv.tools.client_options import client_of
from kv.tools.write_out import JSON, SIMPLE, TABLE, add_write_out, print_table

MEMBER_EPILOG = """\
examples:
  raftkv member list -w table
  raftkv member add n4 --peer-address 10.0.0.4:7101 --learner
  raftkv member promote n4                  once n4 has caught up
  raftkv member remove n2
  raftkv member update n2 --peer-address 10.0.0.2:7102   then restart n2 with --listen-peer there

replace a dead member (n3 is gone for good; n4 on a new machine takes its place):
  1. raftkv member add n4 --peer-address 10.0.0.4:7101 --learner
       a learner takes no part in elections or commits: adding it never weakens
       the cluster, however long it takes to catch up
  2. on the new machine, with an empty data directory:
     raftkv serve --id n4 --listen 10.0.0.4:7001 --listen-peer 10.0.0.4:7101 \\
         --data-dir /var/lib/raftkv --join 10.0.0.1:7001,10.0.0.2:7001
       it asks those members for the cluster and catches up from the leader
  3. raftkv member promote n4
       refused ("...which is in sync with leader") until n4 holds 90% of the
       leader's log: wait (raftkv status shows its match index) and run it again
  4. raftkv member remove n3
  5. raftkv member list -w table            n4 is a voter; n3 is gone"""


def add_member_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    member = commands.add_parser(
        "member", formatter_class=Formatter, help="list, add, remove, promote and update the cluster's members",
        description="The cluster's members (etcdctl member): voters, which elect the leader and make up\n"
                    "the quorum, and learners, which receive the log and vote on nothing until promoted.\n"
                    "Changes go to the leader, one at a time, and return once applied. A change is refused\n"
                    "when the voters after it would have no reachable majority (etcd's strict check: a\n"
                    "voter is reachable when the leader heard from it within an election timeout).",
        epilog=MEMBER_EPILOG)
    actions = member.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = _action(actions, client_options, "list", "list the members",
                      "List every member of the cluster's latest configuration, voters then learners:\n"
                      "its id, role, peer address (where its peers reach it) and client address (where\n"
                      "it takes clients; empty until the member has been heard from), as the member\n"
                      "asked has them in its log: a change just made reaches a follower a heartbeat later.")
    add_write_out(listing, SIMPLE, simple="one line per member: ID, ROLE, PEER ADDRESS, CLIENT ADDRESS",
                  table="ID, ROLE, PEER ADDRESS, CLIENT ADDRESS and ETCD ID (hex, as etcdctl prints it)",
                  json="a list of objects: id, member_id (etcd's, decimal), learner, peer_address, "
                       "client_address, peer_urls, client_urls")

    add = _action(actions, client_options, "add", "add a member (then start it with serve --join)",
                  "Add the member NAME, which its peers will reach at --peer-address, as a learner\n"
                  "(--learner: it catches up first and is promoted later; recommended) or as a voter.\n"
                  "Then start it on an empty data directory with `raftkv serve --id NAME --join\n"
                  "ENDPOINTS`. Refused for a name or a peer address that a member has, and for a voter\n"
                  "when a majority of the voters after it would not be reachable.")
    add.add_argument("name", metavar="NAME", help="the new member's id, as it will be started (--id)")
    add.add_argument("--peer-address", required=True, metavar="HOST:PORT",
                     help="where the other members reach its peer port")
    add.add_argument("--learner", action="store_true", help="add it as a learner (promote it once it caught up)")
    add_write_out(add, SIMPLE, simple="what was added, and the command that starts it", table=None,
                  json="the new member, as one object of `member list -w json`")

    remove = _action(actions, client_options, "remove", "remove a member",
                     "Remove the member NAME. A voter is removed only if the voters left keep a\n"
                     "reachable majority. The removed member stops serving once it learns of it; its\n"
                     "data directory cannot serve this cluster again.")
    remove.add_argument("name", metavar="NAME", help="the member's id")
    add_write_out(remove, SIMPLE, simple="Member NAME removed from the cluster", table=None,
                  json='{"removed": NAME, "members": [the members after, as member list -w json]}')

    promote = _action(actions, client_options, "promote", "make a learner a voter",
                      "Make the learner NAME a voter. Refused, with etcd's \"can only promote a learner\n"
                      "member which is in sync with leader\", while it holds less than 90% of the\n"
                      "leader's log: wait and try again.")
    promote.add_argument("name", metavar="NAME", help="the learner's id")
    add_write_out(promote, SIMPLE, simple="Member NAME promoted to a voter", table=None,
                  json='{"promoted": NAME, "members": [the members after, as member list -w json]}')

    update = _action(actions, client_options, "update", "move a member to another peer address",
                     "Change the peer address of the member NAME (etcdctl member update): through the\n"
                     "log, the voters unchanged; the other members dial it at --peer-address once the\n"
                     "change is applied. Then restart NAME taking peers there (serve --listen-peer).\n"
                     "Refused for an address another member has.")
    update.add_argument("name", metavar="NAME", help="the member's id")
    update.add_argument("--peer-address", required=True, metavar="HOST:PORT",
                        help="where the other members reach its peer port from now on")
    add_write_out(update, SIMPLE, simple="Member NAME updated", table=None,
                  json='{"updated": NAME, "members": [the members after, as member list -w json]}')

    for parser, run in ((listing, _run_list), (add, _run_add), (remove, _run_remove), (promote, _run_promote),
                        (update, _run_update)):
        parser.set_defaults(run=run, command_parser=parser)

    leader = commands.add_parser("leader", formatter_class=Formatter, help="move the leadership (etcdctl move-leader)",
                                 description="The cluster's leadership.")
    leader_actions = leader.add_subparsers(dest="action", metavar="ACTION", required=True)
    transfer = _action(leader_actions, client_options, "transfer", "hand the leadership to another voter",
                       "Hand the leadership to the voter --to (default: the voter furthest along in the\n"
                       "log), and return once it leads: the leader stops taking writes, brings the target's\n"
                       "log up to its own and tells it to stand at once. Writes pause for a few round trips.\n"
                       "Use it before taking the leader's machine down. Refused for a learner or a\n"
                       "non-member (\"etcdserver: bad leader transferee\"); fails when the target did not\n"
                       "win within two election timeouts (the old leader then leads on).")
    transfer.add_argument("--to", metavar="ID", default=None, help="the voter to lead next (default: the one "
                                                                   "furthest along)")
    add_write_out(transfer, SIMPLE, simple="Leadership transferred to ID", table=None, json='{"leader": ID}')
    transfer.set_defaults(run=_run_transfer, command_parser=transfer)


def _action(actions: Any, client_options: argparse.ArgumentParser, name: str, help: str,
            description: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = actions.add_parser(name, parents=[client_options], formatter_class=Formatter,
                                                         help=help, description=description)
    return parser


def role(member: dict[str, Any]) -> str:
    return "learner" if member["learner"] else "voter"


def member_rows(members: list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    return [(m["id"], role(m), m["peer_address"] or "", m["client_address"] or "", f"{m['member_id']:x}")
            for m in members]


def _print_members(members: list[dict[str, Any]], write_out: str) -> None:
    if write_out == JSON:
        print(json.dumps(members, indent=2))
    elif write_out == TABLE:
        print_table(("ID", "ROLE", "PEER ADDRESS", "CLIENT ADDRESS", "ETCD ID"), member_rows(members))
    else:
        for row in member_rows(members):
            print(", ".join(row[:4]))


def _run_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        members = client.member_list()
    _print_members(members, args.write_out)
    return 0


def _run_add(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        added = client.member_add(args.name, args.peer_address, learner=args.learner)
    if args.write_out == JSON:
        print(json.dumps(added, indent=2))
        return 0
    print(f"Member {added['id']} added to the cluster as a {role(added)} (peer address {added['peer_address']}, "
          f"etcd ID {added['member_id']:x})")
    print("Start it on an empty data directory with:")
    print(f"  raftkv serve --id {added['id']} --listen HOST:PORT --data-dir DIR "
          f"--join {','.join(parse_endpoints(args.endpoints))}")
    if added["learner"]:
        print(f"then, once it has caught up: raftkv member promote {added['id']}")
    return 0


def _run_remove(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return _change(args, "removed", "removed from the cluster", lambda client: client.member_remove(args.name))


def _run_promote(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return _change(args, "promoted", "promoted to a voter", lambda client: client.member_promote(args.name))


def _run_update(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return _change(args, "updated", "updated", lambda client: client.member_update(args.name, args.peer_address))


def _change(args: argparse.Namespace, done: str, says: str, call: Callable[[Client], list[dict[str, Any]]]) -> int:
    """Run a change of args.name and print it: `{done: name, members}` as JSON, else `says`."""
    with client_of(args) as client:
        members = call(client)
    if args.write_out == JSON:
        print(json.dumps({done: args.name, "members": members}, indent=2))
    else:
        print(f"Member {args.name} {says}")
    return 0


def _run_transfer(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        leader = client.move_leader(args.to)
    if args.write_out == JSON:
        print(json.dumps({"leader": leader}))
    else:
        print(f"Leadership transferred to {leader}")
    return 0
