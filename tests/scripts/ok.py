"""A well-behaved training script: a small MLP on in-memory data through a DataLoader.

``--print-loader`` prints the DataLoader's input-pipeline settings as torch holds them
(``loader: workers N prefetch_factor P persistent_workers B pin_memory B``); ``--exit-sleep-s``
sleeps that long after the last step (a script that takes its time to leave)."""

import time

from _tiny import loader, parser, train

if __name__ == "__main__":
    p = parser()
    p.add_argument("--print-loader", action="store_true")
    p.add_argument("--exit-sleep-s", type=float, default=0.0)
    args = p.parse_args()
    dl = loader(args)
    if args.print_loader:
        print(f"loader: workers {dl.num_workers} prefetch_factor {dl.prefetch_factor} "
              f"persistent_workers {dl.persistent_workers} pin_memory {dl.pin_memory}",
              flush=True)
    train(args, dl)
    time.sleep(args.exit_sleep_s)
