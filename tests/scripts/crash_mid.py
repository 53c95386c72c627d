"""Trains, then dies with an exception mid-run (a NaN check, say)."""

from _tiny import loader, parser, train


def check(step):
    if step >= args.after:
        raise RuntimeError(f"loss became NaN at step {step}")


if __name__ == "__main__":
    args = parser().parse_args()
    train(args, loader(args), on_step=check)
