"""The command line of a run: one `--flag` per Config field (its help and choices from the field), the presets and
`--config` as starting points, `--print-config` and `--plan`, and the messages that quote what the user typed.

    cfg = parse_config(["--preset", "grpo-1.5b", "--lr", "2e-6"])   # train.py's flags; eval.py takes a subset
"""

import argparse
import contextlib
import json
import os
import sys
import textwrap
from dataclasses import asdict, fields, replace

from config import PRESETS, Config, ConfigError, idle_flags, method_knobs, preset, reading_order
from runtime.plan import print_plan
from strategies.base import is_text, shown

# First field of each section of --help -> the section's title.
SECTIONS = {"model": "model and data", "prompts_per_step": "rollouts",
            "explore": "exploration (docs/algorithm.md)", "grader": "reward",
            "loss": "the GRPO update", "adv_estimator": "the GRPO family (NGRPO, DAPO, Dr. GRPO)", "lr": "optimizer",
            "lora_rank": "low-rank adapters (LoRA)",
            "sft_steps": "supervised warm start", "preset": "the run", "val_data": "validation during training"}


def add_config_flags(parser: argparse.ArgumentParser, names=None, defaults: dict | None = None,
                     helps: dict | None = None) -> None:
    """One flag per Config field (or per field in `names`), in the sections of SECTIONS, each showing its
    default (from `defaults` where given), its help (from `helps` where given: another program's words;
    one that says its default itself is shown as it is) and, for a method's knob, the methods that read it.
    Flags not given stay out of the namespace (SUPPRESS), so a caller can tell an explicit value from a default."""
    defaults, helps = defaults or {}, helps or {}
    group = parser
    for f in reading_order():
        if f.name in SECTIONS:
            group = parser.add_argument_group(helps.get(SECTIONS[f.name], SECTIONS[f.name]))
        if (names is not None and f.name not in names) or f.name == "preset":  # preset: --preset's own
            continue
        flags = ["--" + f.name.replace("_", "-"), *f.metadata["aliases"]]
        default = defaults.get(f.name, f.default)
        help_text = helps.get(f.name, f.metadata["help"]) + readers_note(f.name)
        help_text = (help_text if "(default:" in help_text or "(required" in help_text
                     else f"{help_text} (default: {default!r})").replace("%", "%%")
        if f.type is bool:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=help_text)
        else:
            group.add_argument(*flags, type=f.type, choices=f.metadata["choices"], default=argparse.SUPPRESS,
                               metavar=f.name.upper() if not f.metadata["choices"] else None, help=help_text)


def readers_note(name: str) -> str:
    """' [--explore a, b]': the methods that read a method's knob, where not (nearly) all of them do."""
    for chooser, methods in method_knobs().items():
        readers = [method for method, knobs in methods.items() if name in knobs]
        if readers and len(readers) < len(methods) - 1:
            return f" [--{chooser.replace('_', '-')} {', '.join(readers)}]"
    return ""


def starting_point(argv: list[str]) -> tuple[str, Config]:
    """(what it is, the Config) a run of argv starts from: its --config or --preset, else paper-1.5b. --help
    shows this Config's values as the defaults, the values a run of these flags uses; a starting point that does
    not load shows paper-1.5b's (the full parse then says what is wrong with it)."""
    given = {}
    for index, token in enumerate(argv):
        name, equals, value = token.partition("=")
        if name in ("--preset", "--config") and (equals or index + 1 < len(argv)):
            given[name] = value if equals else argv[index + 1]
    try:
        if "--config" in given:
            return f"--config {given['--config']}", Config.load_json(given["--config"])
        if "--preset" in given:
            return f"--preset {given['--preset']}", preset(given["--preset"])
    except (ValueError, OSError):
        pass
    return "--preset paper-1.5b, what a run without --preset or --config uses", preset("paper-1.5b")


def build_parser(description: str, argv: list[str] = ()) -> argparse.ArgumentParser:
    """`--preset`, `--config`, `--print-config` and one flag per Config field, each showing as its default
    the value a run of `argv` uses (see starting_point)."""
    label, base = starting_point(list(argv))
    presets = "\n".join(textwrap.fill(", ".join(f"{k}={v}" for k, v in overrides.items()), 116,
                                       initial_indent=f"  {name}: ", subsequent_indent="      ")
                         for name, overrides in PRESETS.items())
    parser = argparse.ArgumentParser(
        description=f"{description}\n\nDefaults shown: {label}.",
        usage="%(prog)s [--preset NAME | --config JSON] [--FLAG VALUE ...]",
        epilog="presets (a flag given on the command line overrides its preset):\n" + presets,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=list(PRESETS),
                        help="named starting point (default: paper-1.5b); flags given override it (see below)")
    parser.add_argument("--config", metavar="JSON", help="start from a run's saved config.json instead of a preset")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (preset + --config + flags) as JSON and exit")
    parser.add_argument("--plan", action="store_true",
                        help="print each GPU's memory for this run from the model's config.json alone (no weights "
                             "loaded) and exit: 0 when it fits, 1 with the settings that would fit when not")
    parser.add_argument("--plan-gpus", type=int, default=None, metavar="N",
                        help="--plan: processes (GPUs) of the run (default: $WORLD_SIZE or 1)")
    parser.add_argument("--plan-gpu-gb", type=float, default=None, metavar="G",
                        help="--plan: memory of each GPU in GiB (default: the visible GPU's, else 80; with "
                             "--device cpu the machine's RAM)")
    add_config_flags(parser, defaults=asdict(base))
    return parser


# Another library's flag -> the field it sets (--advantage -> adv_estimator).
ALIASES = {alias: f.name for f in fields(Config) for alias in f.metadata["aliases"]}


def typed_values(argv: list[str]) -> dict[str, str]:
    """{field: the value as typed} of the `--flag value` and `--flag=value` pairs in argv (the last one wins,
    as for argparse), so that a message quotes the user's `1e-6`, not Python's `1e-06`."""
    typed = {}
    for index, token in enumerate(argv):
        name, equals, value = token.partition("=")
        if not name.startswith("--"):
            continue
        if not equals:
            if index + 1 >= len(argv):
                continue
            value = argv[index + 1]
        key = ALIASES.get(name, name[2:].replace("-", "_"))
        typed[key] = shown(value) if value == "" or " " in value or not is_text(value) else value
    return typed


def parse_config(argv=None, description: str = "N-GRPO training") -> Config:
    parser = build_parser(description, sys.argv[1:] if argv is None else argv)
    with quiet_on_broken_pipe():  # --help | head
        args = vars(parser.parse_args(argv))
    config_path, preset_name, show = args.pop("config"), args.pop("preset"), args.pop("print_config")
    plan_args = args.pop("plan"), args.pop("plan_gpus"), args.pop("plan_gpu_gb")
    if config_path and preset_name:
        parser.error("--config and --preset both name a starting point: give one of them")
    if show and plan_args[0]:
        parser.error("--print-config and --plan each print and exit: give one of them")
    if plan_args[1] is not None and plan_args[1] < 1:
        parser.error(f"--plan-gpus {plan_args[1]}: must be at least 1")
    if plan_args[2] is not None and not plan_args[2] > 0:  # NaN too
        parser.error(f"--plan-gpu-gb {plan_args[2]}: must be above 0")
    try:
        base = Config.load_json(config_path) if config_path else preset(preset_name or "paper-1.5b")
        if config_path and not args.get("resume", base.resume):  # a new run from saved settings did not start
            base = replace(base, preset="")  # from a preset, whatever they say: "replace my own output" is not its
        if args.get("loss") == "gspo" and base.loss != "gspo" and "loss_agg" not in args:
            args["loss_agg"] = "seq-mean-token-mean"  # GSPO's own sequence-level mean (the release's N-GSPO)
        cfg = replace(base, **args)
        idle_flags(cfg, args)
    except ConfigError as error:
        parser.error(error.describe(typed_values(sys.argv[1:] if argv is None else argv)))
    except (ValueError, OSError) as error:
        parser.error(str(error))
    if show:
        with quiet_on_broken_pipe():  # --print-config | head
            print(json.dumps(cfg.to_dict(), indent=2), flush=True)
        parser.exit()
    if plan_args[0]:
        with quiet_on_broken_pipe():
            parser.exit(print_plan(cfg, gpus=plan_args[1], gpu_gb=plan_args[2]))
    # The run's folder is the command's to name: a saved config's own out_dir may hold the run it came from.
    if config_path and "out_dir" not in args and not cfg.resume:
        parser.error(f"--config {config_path} starts a new run from saved settings: give it an --out-dir of its own "
                     "(the saved one may hold the run it came from), or add --resume to continue that run")
    return cfg


@contextlib.contextmanager
def quiet_on_broken_pipe():
    """A reader that stops early (`| head`) ends the program quietly, with status 0, as it ends `cat`."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush goes nowhere
        raise SystemExit(0) from None
