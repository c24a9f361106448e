"""`raftkv alarm list|disarm`: the cluster's alarms, as etcdctl's (docs/operations.md, "Alarms")."""
from __future__ import annotations

import argparse
import json
from typing import Any

from kv.tools.arguments import Formatter
from kv.tools.client_options import client_of


def add_alarm_commands(commands: Any, client_options: argparse.ArgumentParser) -> None:
    alarm = commands.add_parser("alarm", formatter_class=Formatter, help="list or disarm the cluster's alarms",
                                description="NOSPACE (a member's disk, or --quota-backend-bytes, is full: puts are "
                                            "refused, reads and deletes go on) and CORRUPT (a member's state "
                                            "differs from the majority's), raised through the log: every member "
                                            "lists the same.")
    actions = alarm.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[client_options], formatter_class=Formatter,
                                 help="print each raised alarm as etcdctl does: memberID:ID alarm:TYPE")
    disarm = actions.add_parser("disarm", parents=[client_options], formatter_class=Formatter,
                                help="clear every alarm (root only while auth is on); one whose cause lasts "
                                     "is raised again within a second")
    for parser in (listing, disarm):
        parser.add_argument("--json", action="store_true", help='print [{"member_id": ..., "alarm": ...}, ...]')
    listing.set_defaults(run=_run_list, command_parser=listing)
    disarm.set_defaults(run=_run_disarm, command_parser=disarm)


def _print(alarms: list[dict[str, str]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(alarms))
        return
    for alarm in alarms:
        print(f"memberID:{alarm['member_id']} alarm:{alarm['alarm']}")


def _run_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with client_of(args) as client:
        _print(client.alarm_list(), args.json)
    return 0


def _run_disarm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Prints the alarms disarmed (etcdctl's output), i.e. those raised before and gone after."""
    with client_of(args) as client:
        before = client.alarm_list()
        after = client.alarm_disarm()
    _print([a for a in before if a not in after], args.json)
    return 0
