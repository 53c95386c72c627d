"""Make the image example's dataset now, before it is trained or tuned.

``train.py`` makes its PNG files on first use (2,048 of them by default, about 40 s on two
cores). Under ``autotune tune`` or ``wrap`` that first use is the baseline probe, whose time and
budget would go to writing files instead of training: run this once first, as a real job
downloads its data before it trains. It takes ``train.py``'s own ``--data-dir`` and
``--num-images`` and does nothing when the dataset is already there.

    python examples/image_classifier/prepare_data.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train import LABELS_FILE, default_data_dir, ensure_dataset, parse_args  # noqa: E402


def main(argv=None):
    args = parse_args(argv)
    root = args.data_dir or default_data_dir(args.num_images)
    if os.path.exists(os.path.join(root, LABELS_FILE)):
        print(f"data: {args.num_images} images already in {root}", flush=True)
        return
    ensure_dataset(root, args.num_images)  # says what it makes and how long it took
    print(f"data: ready in {root}", flush=True)


if __name__ == "__main__":
    main()
