"""``python -m gputop.workloads SCENARIO``: run one scenario and print progress lines."""

from __future__ import annotations

import argparse
import sys
import warnings

from . import registry


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
        return v

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gputop.workloads",
        description="Small real PyTorch training jobs, each with one well-known bottleneck.",
    )
    p.add_argument("scenario", nargs="?", help="scenario name (see --list)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when torch sees a GPU, else the CPU variant (default auto)")
    p.add_argument("--duration", type=_positive(float), metavar="SECONDS",
                   help="stop after this many seconds of training (default: run until stopped)")
    p.add_argument("--steps", type=_positive(int), metavar="N", help="stop after N steps")
    p.add_argument("--tmpdir", metavar="DIR",
                   help="where io-bound and checkpoint-stall write their files (default: a disk-backed temp dir)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the process that started this one exits (used by gputop demo)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        try:
            print(registry.table())
        except BrokenPipeError:
            pass
        return 0
    if not args.scenario:
        parser.error("a scenario is required (see --list)")
    try:
        scenario = registry.get(args.scenario)
    except KeyError as exc:
        parser.error(str(exc.args[0]))

    # The CPU wheels of torch do not depend on numpy, and without it importing torch warns
    # "Failed to initialize NumPy". The workloads never touch numpy: the warning would only
    # push the workload's own one-line error (or its progress) out of sight.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("gputop-workload: error: the workloads need PyTorch (pip install torch)", file=sys.stderr)
        return 2
    from .runtime import resolve_device, execute

    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        print(f"gputop-workload: error: {exc}", file=sys.stderr)
        return 2
    if device.type == "cpu" and not scenario.cpu:
        why = "torch sees no CUDA GPU" if args.device == "auto" else "--device cpu"
        print(
            f"gputop-workload: error: {scenario.name} needs a CUDA GPU ({why}); "
            f"CPU scenarios: {', '.join(s.name for s in registry.SCENARIOS if s.cpu)}",
            file=sys.stderr,
        )
        return 2
    return execute(
        scenario,
        device,
        duration=args.duration,
        steps=args.steps,
        tmpdir=args.tmpdir,
        exit_with_parent=args.exit_with_parent,
    )


if __name__ == "__main__":
    raise SystemExit(main())
