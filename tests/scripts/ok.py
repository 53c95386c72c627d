"""A well-behaved training script: a small MLP on in-memory data through a DataLoader."""

from _tiny import loader, parser, train

if __name__ == "__main__":
    args = parser().parse_args()
    train(args, loader(args))
