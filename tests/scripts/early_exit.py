"""Ends on its own after a few steps, long before a probe could measure it."""

from _tiny import loader, parser, train

if __name__ == "__main__":
    args = parser(steps=8).parse_args()
    train(args, loader(args))
