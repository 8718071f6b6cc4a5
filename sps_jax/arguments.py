"""What commands and functions take: :class:`ArgumentParser`, whose errors are one sentence and which answers
``--version``, the argparse types every command shares (numbers, comma lists, input and output paths, run folders),
and the checks of a Python function's arguments (:func:`integer`, :func:`true_or_false`, :func:`at_least`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import operator
import os
import platform
import re
import sys
from importlib import metadata

from sps_jax.cli import UserError
from sps_jax.names import close_name, did_you_mean
from sps_jax.path_checks import LEADS_NOWHERE, NOT_REGULAR, leads_nowhere, standard_input, unexpanded_home


def distribution_version(name: str) -> str:
    """The installed version of package ``name``, or "not installed"."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version() -> str:
    """This package's version and what it runs on: the line a bug report starts with (``--version``)."""
    v = distribution_version
    return f"sps-jax {v('sps-jax')} (jax {v('jax')}, jaxlib {v('jaxlib')}, Python {platform.python_version()})"


class _ShowDefaults:
    """Help formatter mixin: an option's default follows its description, unless the description
    already says it or there is none to state (None, a flag's False, an empty string)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is False or default == "" or
                default == argparse.SUPPRESS or action.const is not None or "default" in text.lower()):
            return text
        if isinstance(default, (list, tuple)):  # a list flag's default, in the syntax it is given in
            default = ",".join(map(str, default))
        shown = str(default).replace("%", "%%")  # the help string is %-formatted next
        return f"{text} (default: {shown})".lstrip()


def _showing_defaults(formatter_class):
    return type(f"Defaults{formatter_class.__name__}", (_ShowDefaults, formatter_class), {})


def _write_message(parser, message, file=None):
    """argparse's writer of help and version without its ``except OSError: pass``, which would end a command whose
    help went into a full disk or a closed pipe with 0: the boundary (:func:`sps_jax.cli.main`) says it as for any other
    output, in one sentence, or quietly with 141 for a pipe whose reader went away."""
    if message:
        file = file or sys.stderr
        file.write(message)
        file.flush()


@contextlib.contextmanager
def help_write_errors():
    """Around another package's argparse command line that a command hands over to (lm-eval's): its help and
    usage are written as :class:`ArgumentParser` writes them (:func:`_write_message`)."""
    before = argparse.ArgumentParser._print_message
    argparse.ArgumentParser._print_message = _write_message
    try:
        yield
    finally:
        argparse.ArgumentParser._print_message = before


# An override's word that argparse gets: no dashes or one (config.a.b=v), a capital (--Config.a.b=v), or the en or em
# dash a document's typesetting makes of '--' (a correct --config.a.b=v is split off before argparse reads the rest).
_OVERRIDE_MISSPELT = re.compile(r"[-\u2013\u2014]*config\.(\w+(?:\.\w+)*=.*)", re.IGNORECASE)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one sentence (no usage block), raised as :class:`UserError`, and
    which answers ``--version``.

    Long flags must be spelled out: argparse's default takes any unique prefix (``--work`` for
    ``--workdir``, ``--dtype`` for bench compile's ``--dtypes``), so a typo ran with another flag's
    meaning, and a script's abbreviation would change meaning or break when a flag is added."""

    def __init__(self, *args, config_fields=None, **kwargs):
        """``config_fields``: for a command that takes ``--config.a.b=v`` overrides, the function that gives each
        field's name and path (``config.field_paths``), so that ``--attention pallas`` is told the override it
        means; called only then."""
        self.config_fields = config_fields or dict
        kwargs.setdefault("allow_abbrev", False)  # subparsers are built through here too
        kwargs["formatter_class"] = _showing_defaults(kwargs.get("formatter_class", argparse.HelpFormatter))
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=version(),
                          help="print the versions of sps-jax, jax, jaxlib and Python, and exit")

    def error(self, message, prog: str | None = None):
        if message.startswith("unrecognized arguments: "):
            message = self._after_separator(message)
        if message.startswith("unrecognized arguments: ") and "'--'" not in message:  # a misspelt flag: the likely one
            # Names compared without their dashes, which every flag shares ('--bogus' was close to '--out').
            flags = [o[2:] for a in self._command_parser(getattr(self, "_args", []))._actions
                     for o in a.option_strings if o.startswith("--")]
            words, fields = message.split(": ", 1)[1].split(), self.config_fields()
            # A word that spells an override is told the override, even right after a config file.
            apart = None if fields and _OVERRIDE_MISSPELT.fullmatch(words[0]) else self._config_argument_apart(words[0])
            if apart:
                message = f"{message.rstrip('.')} (did you mean {apart}?)"
            for i, word in enumerate([] if apart else words):
                override = _OVERRIDE_MISSPELT.fullmatch(word) if fields else None
                if override:  # --config.a.b=v without its two dashes, or with the dash typesetting makes of them
                    message = f"{message.rstrip('.')} (did you mean --config.{override[1]}?)"
                    break
                name, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
                abbreviated = [flag for flag in flags if name and flag.startswith(name)]  # what argparse would take
                close = abbreviated[0] if len(abbreviated) == 1 else close_name(name, flags) if name else None
                field = fields.get(name.replace("-", "_"))
                if close:  # the command's own flag first: bench compile's --dtype is its --dtypes
                    message = f"{message.rstrip('.')} (did you mean --{close}?)"
                    break
                if field:  # a config field given as a flag: the override that sets it
                    if not eq:
                        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else "VALUE"
                    message = f"{message.rstrip('.')} (did you mean --config.{field}={value}?)"
                    break
        if message.endswith(": expected one argument"):  # the value may be there, read as a flag for its '-'
            message = self._value_like_a_flag(message)
        commands = next((list(a.choices) for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        if commands and message.startswith("the following arguments are required: ") and "command" in message:
            message = f"name a command, one of {', '.join(commands)}"  # "required: command" would name none of them
        raise UserError(f"{prog or self.prog}: {message.rstrip('.')} (see --help).")

    _print_message = _write_message

    def _config_argument_apart(self, word: str) -> str | None:
        """``--config FILE.py:WORD`` where ``word``, an unrecognized argument, follows a ``--config FILE.py`` given no
        argument: the config's argument written after a space instead of a ':'."""
        args = getattr(self, "_args", [])
        for i, arg in enumerate(args):
            flag, equals, value = arg.partition("=")
            value, rest = (value, args[i + 1:]) if equals else (args[i + 1] if i + 1 < len(args) else "", args[i + 2:])
            if flag == "--config" and value.endswith(".py") and rest[:1] == [word] and not word.startswith("-"):
                return f"--config {value}:{word}"
        return None

    def _after_separator(self, message: str) -> str:
        """argparse's "unrecognized arguments" where they come from a '--' (every word after it is a value): a flag of
        the command given after it, which the flag suggestion named as itself (--force: did you mean --force?), or
        the '--' itself, left over where the command takes no value after it."""
        args = getattr(self, "_args", [])
        if "--" not in args:
            return message
        words = message.split(": ", 1)[1].split()
        flags = self._command_parser(args)._option_string_actions
        after = args[args.index("--") + 1:]
        flag = next((word for word in words if word in after and word.partition("=")[0] in flags), None)
        if flag is not None:
            return f"{message} ({flag} follows '--', which ends the flags, so it is read as a value: give it before '--')"
        if "--" in words:
            return f"{message} ('--' ends the flags, and this command takes no value after it: remove it)"
        return message

    def _value_like_a_flag(self, message: str) -> str:
        """argparse's "argument --prompt: expected one argument" where the word after the flag starts with '-'
        (--prompt -hello) and is none of the command's flags: that word is the value meant, and '=' gives it."""
        flags = message[len("argument "):-len(": expected one argument")].split("/")
        words = getattr(self, "_args", [])
        for flag, value in zip(words, words[1:]):
            if flag in flags and value.startswith("-") and value.partition("=")[0] not in self._option_string_actions:
                return (f"{message}: {value!r} starts with '-', so it reads as a flag: write {flag}={value} to give it "
                        f"as the value")
        return message

    def parse_known_args(self, args=None, namespace=None):
        self._args = sys.argv[1:] if args is None else list(args)  # a subcommand's parser gets its own words here
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._args = args  # which subcommand a refused flag was given to
        self._check_flags_once(args)
        try:
            return super().parse_args(args, namespace)
        except UserError:
            parsed, stray = self._lifted_parse(args)
            if stray:  # named first: else `evaluate tabel` is told that --workdir is required
                self._check_list_words(args, stray)
                self._check_path_words(args, stray, parsed)
                self.error(f"unrecognized arguments: {' '.join(stray)}", self._command_prog(args))
            raise

    def _flag_uses(self, args, wanted):
        """(flag, position, value, action) for each use in ``args`` of a flag whose ``action`` passes ``wanted``."""
        actions = {o: a for parser in _parsers(self) for a in parser._actions if wanted(a) for o in a.option_strings}
        for i, word in enumerate(args):
            if word == "--":
                break
            flag, eq, value = word.partition("=")
            if flag in actions:
                yield flag, i, value if eq else (args[i + 1] if i + 1 < len(args) else ""), actions[flag]

    def _check_flags_once(self, args) -> None:
        """A flag that takes one value, a comma list included, given twice: argparse kept the last and dropped
        the others without a word. Flags meant to repeat (append) are not among them."""
        seen = {}  # by action: a flag's other name (--batch for --batch-size) is the same flag
        prog = self._command_prog(args)  # the subcommand's: "probes: --max-offset" would name no command
        for flag, _, value, action in self._flag_uses(args, lambda a: type(a) is argparse._StoreAction):
            if action in seen:
                first_flag, first = seen[action]
                named = flag if first_flag == flag else f"{first_flag} (also named {flag})"
                if _is_list(action):
                    self.error(f"{named} is given twice: give one comma-separated list, e.g. {flag} {first},{value}",
                               prog)
                self.error(f"{named} is given twice ({first!r} and {value!r}): give it once", prog)
            seen[action] = flag, value

    def _command_parser(self, args) -> argparse.ArgumentParser:
        """The parser of the (sub)command ``args`` name, at every depth (``figures curves``), else this one."""
        parser = self
        while True:
            commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
            word = next((word for word in args if word in commands), None)
            if word is None:
                return parser
            parser, args = commands[word], args[args.index(word) + 1:]

    def _command_prog(self, args) -> str:
        """The prog of the (sub)command ``args`` name, else this parser's."""
        return self._command_parser(args).prog

    def _check_list_words(self, args, stray) -> None:
        """Words after a list flag's value that are items of its list (``--variants standard sps``): say
        the list's syntax. A word that is no item (``--variants sps stray``) is left to be named as
        unrecognized, since it is more likely a stray word than a misspelt list."""
        for flag, i, value, action in self._flag_uses(args, _is_list):
            words = []
            j = i + (1 if "=" in args[i] else 2)
            while j < len(args) and args[j] in stray and not args[j].startswith("-") and _parses(action.type, args[j]):
                words.append(args[j])
                j += 1
            if words:
                self.error(f"{flag} takes one comma-separated list: write {flag} {','.join([value, *words])}, "
                           f"not {' '.join([value, *words])}", self._command_prog(args))

    def _check_path_words(self, args, stray, parsed) -> None:
        """Words after the value of a flag or a positional argument that takes one path (:func:`input_path`) that name
        files or folders too (``--source data/*.jsonl``, ``data verify data/*``, a pattern the shell expanded to
        several): say what the argument takes. A word that names nothing is left to be named as unrecognized.
        ``parsed``: the namespace of :meth:`_lifted_parse`, which holds the word each positional argument took."""
        uses = [(flag, i + (1 if "=" in args[i] else 2), value, action)
                for flag, i, value, action in self._flag_uses(args, _one_path)]
        uses += [(f"argument {action.metavar or action.dest}", i + 1, value, action)
                 for action in self._command_parser(args)._actions
                 if not action.option_strings and action.nargs in (None, "?") and _one_path(action)
                 for value in [getattr(parsed, action.dest, None)] if value is not None
                 for i, word in enumerate(args) if word == value]
        for flag, j, value, action in uses:
            words = []
            while j < len(args) and args[j] in stray and os.path.lexists(args[j]):
                words.append(args[j])
                j += 1
            if words:
                more = (f"the {len(words)} words after {value} name files or folders too ({words[0]}, ...)"
                        if len(words) > 1 else f"the word after {value} names a file or folder too ({words[0]})")
                fix = (f"give {flag} before each path ({flag} {value} {flag} {words[0]})"
                       if isinstance(action, argparse._AppendAction) else action.type.one_path)
                self.error(f"{flag} takes one path, and {more}, as a pattern the shell expanded to several gives: {fix}",
                           self._command_prog(args))

    def _lifted_parse(self, args) -> tuple[argparse.Namespace | None, list[str]]:
        """The namespace and the words of ``args`` that no argument of this parser or its subcommands takes, found by
        parsing again with every required flag, group and subcommand made optional (None and no words when that parse
        fails too)."""
        lifted = []
        for parser in _parsers(self):
            for item in [*parser._actions, *parser._mutually_exclusive_groups]:
                lifted.append((item, item.required))
                item.required = False
        try:
            return self.parse_known_args(args)
        except UserError:
            return None, []
        finally:
            for item, required in lifted:
                item.required = required

    def _check_value(self, action, value):
        if action.nargs == argparse.PARSER and value not in action.choices:  # argparse would list every choice
            self.error(unknown_subcommand(value, action.choices))
        if action.choices is not None and value not in action.choices:  # argparse would name no likely one
            choices = list(map(str, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice {value!r}{did_you_mean(str(value), choices)}: "
                                                 f"choose from {', '.join(choices)}")
        super()._check_value(action, value)


def _is_list(action) -> bool:
    """Whether an argparse action's type is a :func:`comma_list`."""
    return getattr(action.type, "comma_list", False)


def _parses(parse, word: str) -> bool:
    """Whether the argparse type ``parse`` takes ``word``."""
    try:
        parse(word)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return True


def unknown_subcommand(word: str, names) -> str:
    """What to say of ``word`` given where one of the subcommands ``names`` is expected."""
    if word.startswith("-") and word[1:2].isalpha() or word.startswith("--"):  # a flag, not a number such as -1
        return f"{word} comes before a subcommand: name one first, one of {', '.join(names)}, then its flags"
    close = close_name(word, names)
    return f"unknown subcommand {word!r}: " + (f"did you mean {close!r}?" if close else
                                                f"the subcommands are {', '.join(names)}")


def integer(value, name: str, hint: str = "") -> int:
    """``value`` as an int (a numpy or jax integer too) for a function's argument ``name``; anything else (a
    str, a float, None, a bool) is one TypeError sentence, ``hint`` saying what else the argument takes."""
    try:
        if isinstance(value, bool):  # an int to Python, but never meant as a count or a step
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer{hint}, got {value!r}.") from None


def true_or_false(value, name: str) -> bool:
    """``value`` as a bool (a numpy bool too) for a yes/no argument ``name``, else one TypeError sentence: "no" and 1
    are truthy, so force="no" would replace the folder it guards and trust_pickle="no" would unpickle."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def line_function(log, name: str = "log"):
    """``log`` when it can be called with one line of text, else one TypeError sentence: log=None would fail at the
    first line it is given, after the work before it."""
    if not callable(log):
        raise TypeError(f"{name} must be a function of one line of text (print, say), got {log!r}.")
    return log


def at_least(name: str, value, least: int) -> int:
    """``value`` as an int (:func:`integer`) of at least ``least``, else one sentence naming ``name``: a count or
    size given to a function (0 documents read all of them, a batch of 0 stopped in range())."""
    value = integer(value, name)
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value}.")
    return value


def _integer(text: str, least: int, what: str, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least or (most is not None and value > most):
        raise argparse.ArgumentTypeError(f"{value} must be {what}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _integer(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _integer(text, 0, "0 or more")


def _float(text: str, takes: str = "") -> float:
    try:
        return float(text)
    except ValueError:  # argparse's own words: "invalid float value: ''"
        raise argparse.ArgumentTypeError(f"{text!r} is not a number{': it takes ' + takes if takes else ''}") from None


def number(takes: str):
    """argparse type: a number, where text that is none says the flag takes ``takes`` (its range is the reader's)."""
    def parse(text: str) -> float:
        return _float(text, takes)
    parse.__name__ = "number"
    return parse


def positive_number(text: str) -> float:
    """argparse type: a finite number above 0 (float() takes 'nan', 'inf' and '1e400', which is inf)."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above 0")
    return value


def int_up_to(most: int, least: int = 0, why: str = ""):
    """argparse type: an integer from ``least`` to ``most`` (``why``, when given, says what the bound is)."""
    def parse(text: str) -> int:
        return _integer(text, least, f"from {least} to {most}{', ' + why if why else ''}", most)
    parse.__name__ = f"integer from {least} to {most}"
    return parse


def add_batch_size(parser, default, help: str) -> None:
    """The rows-per-batch flag, named alike by every command: ``--batch-size``, which ``--batch`` (the bench
    commands' and probes' first spelling) names too, so that scripts written with either keep working."""
    parser.add_argument("--batch-size", "--batch", dest="batch_size", metavar="N", type=positive_int, default=default,
                        help=help)


def _one_path(action) -> bool:
    """Whether an argument takes one path (:func:`input_path`), whose type says what to pass instead of several."""
    return hasattr(action.type, "one_path")


def _parsers(parser):
    """``parser`` and its subcommands' parsers, at every depth."""
    yield parser
    for action in parser._actions:
        if action.nargs == argparse.PARSER:
            for sub in action.choices.values():
                yield from _parsers(sub)


def comma_list(kind=str, choices=None, what: str = "item"):
    """argparse type: a comma-separated list of ``kind`` with at least one item, no empty ones and no repeats, each of
    ``choices`` when given (``what`` names one in the sentence: "unknown variant 'x'").

    Every flag of every command that takes a list of names or numbers takes it this way
    (``--variants standard,sps``): :class:`ArgumentParser` answers the space-separated form and a
    list flag given twice with a sentence showing the comma list. Lists of paths are not comma lists,
    since a path may hold a comma: they are positional words or a repeated flag (probes' --workdir)."""
    def parse(text: str) -> list:
        try:
            items = [x.strip() for x in text.split(",")]
            values = [kind(x) for x in items if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}") \
                from None
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing: give at least one item, comma-separated")
        if "" in items:  # 'sps,,standard' or 'h100,': an item lost to a typo, not a list to read around it
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item: remove the extra comma")
        unknown = [v for v in values if choices is not None and v not in choices]
        if unknown:
            # 'sps standard' or 'sps;standard': known items with another separator, not one unknown item
            words = str(unknown[0]).replace(";", " ").split()
            if len(words) > 1 and all(word in map(str, choices) for word in words):
                raise argparse.ArgumentTypeError(f"{text!r} separates its items with something other than commas: "
                                                 f"write {','.join(words)}")
            guess = did_you_mean(str(unknown[0]), list(map(str, choices)))
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r}{guess}: choose from "
                                             f"{', '.join(map(str, choices))}")
        repeated = sorted({item for item, v in zip(items, values) if values.count(v) > 1})  # as written: 4x2
        if repeated:
            raise argparse.ArgumentTypeError(f"{', '.join(repeated)} is listed more than once: list each once")
        return values
    parse.__name__ = f"comma-separated {kind.__name__} list"
    parse.comma_list = True  # what ArgumentParser looks for to say the list syntax
    return parse


FILE, FOLDER, FILE_OR_FOLDER = "file", "folder", "file or folder"  # the kinds of input_path


def input_path(what: str, kind: str, hint: str):
    """argparse type of a ``kind`` (:data:`FILE`, :data:`FOLDER` or :data:`FILE_OR_FOLDER`) a command reads, named
    ``what`` ("prompts file", "token folder") in the sentence that ends with ``hint`` (what to pass). Refused as an
    argument, before the command loads jax: an empty path (the path functions read it as the working directory), an
    unexpanded '~' (:func:`unexpanded_home`), a link that leads nowhere, and an existing path of the other kind (a
    folder for a file, a file for a folder). A missing one is left to the command's reader, which says what makes it
    (its checks of the outputs come first): a link to nothing cannot be made that way."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path names no {what}: {hint}")
        dash = standard_input(text, what, hint)
        if dash is not None:
            raise argparse.ArgumentTypeError(dash)
        home = unexpanded_home(text)
        if home is not None:
            raise argparse.ArgumentTypeError(home)
        if leads_nowhere(text):  # else readers call it missing, or suggest preparing a token folder there
            raise argparse.ArgumentTypeError(f"{what} {text!r} {LEADS_NOWHERE}: {hint}")
        if kind == FILE and os.path.isdir(text):  # as reading.input_file says it
            raise argparse.ArgumentTypeError(f"{what} {text!r} is a folder, not a file: {hint}")
        if os.path.exists(text) and not (os.path.isfile(text) or os.path.isdir(text)):  # /dev/stdin: "does not exist"
            raise argparse.ArgumentTypeError(f"{what} {text!r} {NOT_REGULAR}: {hint}")
        if kind == FOLDER and os.path.exists(text) and not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is a file, not a {what}: {hint}")
        return text
    parse.__name__ = kind  # argparse names the type in errors it makes itself
    parse.one_path = hint  # what ArgumentParser says to pass when the shell gave the flag several paths
    return parse


# argparse type of a run folder or checkpoint argument (an empty one would name the working directory).
run_path = input_path("run folder", FOLDER, "pass a run folder or one of its checkpoints/<step> folders")
RUN_HELP = "a run folder, or one of its checkpoints/<step> folders"  # what run_path takes, said in the help
# The help of --step where it picks the checkpoint a command reads, {} what the command does with it.
STEP_HELP = "the checkpoint {}, by its step (default: the latest)"


def output_path(text: str) -> str:
    """argparse type of a file or folder a command writes. '-' (which reads as stdout, but would make a file
    named '-') and a leading '~' the shell left unexpanded (:func:`unexpanded_home`) are refused; an empty one is
    left to the command's own check, which says what it takes."""
    if text.strip() == "-":
        raise argparse.ArgumentTypeError("'-' is not standard output here but a file named '-': pass a path (a "
                                         "command that prints its results does so without this flag)")
    home = unexpanded_home(text)
    if home is not None:
        raise argparse.ArgumentTypeError(home)
    return text


def check_force(force: bool, outputs: dict, what: str) -> None:
    """One sentence for ``--force`` given with none of ``outputs`` ({flag: value, None when not given}), the optional
    outputs it replaces (``what``): nothing is written then, and the flag would do nothing without a word."""
    if not force or any(value is not None for value in outputs.values()):
        return
    flags = list(outputs)
    given = f"no {flags[0]} is given: pass it" if len(flags) == 1 else \
        f"neither {' nor '.join(flags)} is given: pass one of them"
    raise UserError(f"--force only replaces {what}, and {given}, or drop --force.")


def add_config_flag(parser, help: str, **kwargs) -> None:
    """``--config FILE[:ARG]`` of a command that takes ``--config.a.b=V`` overrides, which its help names, since the
    overrides are no flag of the parser's own."""
    parser.add_argument("--config", metavar="FILE[:ARG]", help=f"{help}; --config.a.b=V after it sets any field",
                        **kwargs)


def add_run_arguments(parser) -> None:
    """``--workdir RUN | --checkpoint RUN/checkpoints/STEP`` (one of them), read back with :func:`run_argument`."""
    where = parser.add_mutually_exclusive_group(required=True)
    # Both take either folder: --checkpoint is the name scripts used first.
    where.add_argument("--workdir", type=run_path, help="a run folder (read at its latest checkpoint, or --step's), "
                       "or one of its checkpoints/<step> folders")
    where.add_argument("--checkpoint", type=run_path, help=f"the same as --workdir: {RUN_HELP}")


def run_argument(args) -> str:
    """The run folder or checkpoint that :func:`add_run_arguments` parsed."""
    return args.workdir or args.checkpoint
