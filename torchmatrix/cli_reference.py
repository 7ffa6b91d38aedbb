"""The command line as the documentation shows it, rendered from cli.build_parser so that the
reference page lists exactly the commands and options the parser accepts."""

from __future__ import annotations

import argparse

from torchmatrix.cli import build_parser


def markdown_reference() -> str:
    """One section per command: what it does, its usage line and a table of its arguments."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    sections = []
    for name, command in commands.choices.items():
        usage = " ".join(command.format_usage().split()).removeprefix("usage: ")
        rows = ["| argument | meaning |", "|---|---|"]
        rows += [_row(action) for action in command._actions if _shown(action)]
        what = helps[name][0].upper() + helps[name][1:]
        sections.append(f"### {name}\n\n{what}.\n\n```text\n{usage}\n```\n\n" + "\n".join(rows))
    return "\n\n".join(sections)


def _shown(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)


def _row(action: argparse.Action) -> str:
    if action.option_strings:
        value = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        spelled = ", ".join(f"`{option}{value}`" for option in action.option_strings)
    else:
        spelled = f"`{action.metavar or action.dest}`"
    needed = " (required)" if action.required and action.option_strings else ""
    meaning = action.help.replace("|", "\\|")
    return f"| {spelled}{needed} | {meaning} |"
