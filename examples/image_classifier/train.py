"""Train a small CNN on a generated PNG image dataset.

A realistic, self-contained PyTorch training script of the kind autotune is
meant to tune without changes: every sample is a 256x256 PNG that is decoded
with PIL, augmented (random crop, horizontal flip) and resized in the Dataset,
so the input pipeline costs what a real one does and DataLoader workers matter.

The dataset is generated on first use (seeded, 10 classes) into
``--data-dir``, else ``$AUTOTUNE_EXAMPLE_DATA``, else
``~/.cache/autotune-examples/images-v1-N<count>``. It is written into a
temporary sibling directory and renamed into place, so DDP ranks (or two runs)
that start at once never see a half-written dataset.

Runs plain with ``python train.py`` and data-parallel (gloo) under
``torchrun --nproc-per-node 2 train.py``.

Log lines (rank 0 only unless ``--log-all-ranks``)::

    epoch 1 step 40 loss 2.1034 samples/s 153.2
    done: 64 steps, mean samples/s 150.8

samples/s is measured by the script itself: samples trained on by the whole
job (this rank's batch sizes times WORLD_SIZE) over the ``time.perf_counter``
time since the previous log line.
"""

import argparse
import csv
import gc
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

NUM_CLASSES = 10
IMAGE_SIZE = 256
INPUT_SIZE = 64
GENERATION_SEED = 1234
LABELS_FILE = "labels.csv"
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
# Foreground colour of each class; drawn shapes get a small random jitter.
CLASS_COLOURS = np.array(
    [
        [220, 40, 40], [40, 200, 60], [40, 80, 220], [230, 200, 40], [200, 50, 200],
        [40, 210, 210], [250, 140, 30], [120, 60, 20], [250, 250, 250], [20, 20, 20],
    ],
    dtype=np.float32,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=None,
                        help="dataset directory (default: $AUTOTUNE_EXAMPLE_DATA or "
                             "~/.cache/autotune-examples/images-v1-N<num-images>)")
    parser.add_argument("--num-images", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many optimizer steps (default: no limit)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-interval", type=int, default=20, help="steps between log lines")
    parser.add_argument("--log-all-ranks", action="store_true")
    args = parser.parse_args(argv)
    for name in ("num_images", "batch_size", "epochs", "log_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, but got {getattr(args, name)}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, but got {args.workers}")
    return args


# ---------------------------------------------------------------- dataset on disk

def default_data_dir(num_images):
    env_dir = os.environ.get("AUTOTUNE_EXAMPLE_DATA")
    if env_dir:
        return env_dir
    return os.path.join(os.path.expanduser("~"), ".cache", "autotune-examples",
                        f"images-v1-N{num_images}")


def draw_image(rng, label, grid):
    """Return a (256, 256, 3) uint8 image whose shape and colour depend on `label`."""
    yy, xx = grid
    angle = float(rng.uniform(0, 2 * np.pi))
    ramp = np.cos(angle) * xx + np.sin(angle) * yy
    ramp = (ramp - ramp.min()) / (ramp.max() - ramp.min())
    # Channel-first while drawing: numpy is slow on a trailing axis of length 3.
    bg0, bg1 = rng.uniform(60, 190, (2, 3, 1, 1)).astype(np.float32)
    background = bg0 + (bg1 - bg0) * ramp

    cx, cy, r, freq = (float(v) for v in rng.uniform((0.3, 0.3, 0.15, 5), (0.7, 0.7, 0.3, 9)))
    dx, dy = xx - cx, yy - cy
    dist_c = np.sqrt(dx * dx + dy * dy)
    if label == 0:
        alpha = dist_c < r                                           # disc
    elif label == 1:
        alpha = (np.abs(dx) < r) & (np.abs(dy) < r)                  # square
    elif label == 2:
        alpha = np.sin(yy * 2 * np.pi * freq) > 0                    # horizontal stripes
    elif label == 3:
        alpha = np.sin(xx * 2 * np.pi * freq) > 0                    # vertical stripes
    elif label == 4:
        alpha = np.sin((xx + yy) * 2 * np.pi * freq) > 0             # diagonal stripes
    elif label == 5:
        alpha = (dist_c < r) & (dist_c > 0.6 * r)                    # ring
    elif label == 6:
        bar = 0.25 * r                                               # cross
        alpha = ((np.abs(dx) < bar) & (np.abs(dy) < r)) | ((np.abs(dy) < bar) & (np.abs(dx) < r))
    elif label == 7:
        alpha = (np.floor(xx * freq) + np.floor(yy * freq)) % 2 == 0  # checkerboard
    elif label == 8:
        alpha = (np.abs(dy) < r) & (np.abs(dx) < 0.6 * (dy + r))      # triangle
    else:
        alpha = np.clip(1 - dist_c / (1.5 * r), 0, 1)                # soft radial blob
    colour = (CLASS_COLOURS[label] + rng.uniform(-25, 25, 3).astype(np.float32))[:, None, None]
    image = background + (colour - background) * alpha.astype(np.float32)
    image += rng.integers(-6, 7, image.shape, dtype=np.int16)           # mild sensor-like noise
    return np.ascontiguousarray(np.clip(image, 0, 255).astype(np.uint8).transpose(1, 2, 0))


def generate_dataset(root, num_images):
    """Write `num_images` seeded PNGs and labels.csv into `root`, atomically."""
    root = os.path.abspath(root)
    parent = os.path.dirname(root)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.tmp-", dir=parent)
    try:
        grid = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float32) / IMAGE_SIZE
        rows = []
        for index in range(num_images):
            label = index % NUM_CLASSES
            rng = np.random.default_rng([GENERATION_SEED, index])
            name = f"{index:06d}_c{label}.png"
            Image.fromarray(draw_image(rng, label, grid)).save(os.path.join(tmp, name),
                                                               compress_level=1)
            rows.append((name, label))
        with open(os.path.join(tmp, LABELS_FILE), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(("file", "label"))
            writer.writerows(rows)
        try:
            os.rename(tmp, root)
        except OSError:
            if not os.path.exists(os.path.join(root, LABELS_FILE)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_dataset(root, num_images, wait_for_peer_s=0.0):
    """Make sure a complete dataset is at `root`, generating it if needed.

    A non-zero local rank first waits up to `wait_for_peer_s` for local rank 0
    to finish generating, so two ranks on one host don't both do the work.
    """
    labels = os.path.join(root, LABELS_FILE)
    deadline = time.monotonic() + wait_for_peer_s
    while not os.path.exists(labels) and time.monotonic() < deadline:
        time.sleep(0.5)
    if os.path.exists(labels):
        return
    print(f"data: generating {num_images} images in {root}", flush=True)
    t0 = time.perf_counter()
    generate_dataset(root, num_images)
    print(f"data: generated in {time.perf_counter() - t0:.1f} s", flush=True)


class PngImageDataset(Dataset):
    """Decode a PNG, random-crop, flip, resize to 64x64, normalize; return (CHW tensor, label)."""

    def __init__(self, root):
        self.root = root
        with open(os.path.join(root, LABELS_FILE), newline="") as f:
            reader = csv.reader(f)
            next(reader)
            self.samples = [(name, int(label)) for name, label in reader]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        name, label = self.samples[index]
        with Image.open(os.path.join(self.root, name)) as img:
            img = img.convert("RGB")
        width, height = img.size
        side = int(min(width, height) * (0.6 + 0.4 * torch.rand(1).item()))
        left = int(torch.randint(0, width - side + 1, (1,)))
        top = int(torch.randint(0, height - side + 1, (1,)))
        img = img.crop((left, top, left + side, top + side))
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        img = img.resize((INPUT_SIZE, INPUT_SIZE), Image.Resampling.BILINEAR)
        array = (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(array.transpose(2, 0, 1).copy()), label


# ---------------------------------------------------------------- model and training

class SmallCNN(nn.Module):
    def __init__(self, num_classes=NUM_CLASSES):
        super().__init__()

        def block(c_in, c_out):
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

        self.features = nn.Sequential(
            block(3, 16), nn.MaxPool2d(2),    # 32x32
            block(16, 32), nn.MaxPool2d(2),   # 16x16
            block(32, 64), nn.MaxPool2d(2),   # 8x8
            block(64, 64), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def init_distributed():
    """Join the torchrun-style process group when WORLD_SIZE > 1; return (rank, local_rank, world_size)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 0, 1
    dist.init_process_group(backend="gloo", init_method="env://")
    return dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0")), dist.get_world_size()


def train(args):
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    data_dir = args.data_dir or default_data_dir(args.num_images)
    ensure_dataset(data_dir, args.num_images, wait_for_peer_s=600.0 if local_rank > 0 else 0.0)

    rank, local_rank, world_size = init_distributed()
    run_training(args, data_dir, rank, local_rank, world_size)
    if world_size > 1:
        # DDP's model sits in reference cycles that keep the process group alive until the
        # interpreter shuts down, where tearing down gloo's threads can abort the process: free
        # it now, then leave together.
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def run_training(args, data_dir, rank, local_rank, world_size):
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    torch.manual_seed(0)

    dataset = PngImageDataset(data_dir)
    if len(dataset) != args.num_images and rank == 0:
        print(f"WARNING: {data_dir} holds {len(dataset)} images, not --num-images "
              f"{args.num_images}; training on what is there", file=sys.stderr, flush=True)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0) if world_size > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None,
                        sampler=sampler, num_workers=args.workers, pin_memory=use_cuda)

    model = SmallCNN().to(device)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()

    should_log = rank == 0 or args.log_all_ranks
    prefix = f"[rank {rank}] " if args.log_all_ranks and world_size > 1 else ""
    step = total_samples = interval_samples = interval_steps = 0
    interval_loss = 0.0
    t_start = t_last = time.perf_counter()
    model.train()
    for epoch in range(1, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()

            step += 1
            samples = images.shape[0] * world_size
            total_samples += samples
            interval_samples += samples
            interval_steps += 1
            interval_loss += loss.item()
            if step % args.log_interval == 0:
                now = time.perf_counter()
                if should_log:
                    print(f"{prefix}epoch {epoch} step {step} loss {interval_loss / interval_steps:.4f} "
                          f"samples/s {interval_samples / (now - t_last):.1f}", flush=True)
                t_last, interval_samples, interval_steps, interval_loss = now, 0, 0, 0.0
            if args.max_steps is not None and step >= args.max_steps:
                break
        if args.max_steps is not None and step >= args.max_steps:
            break
    elapsed = time.perf_counter() - t_start
    if should_log:
        print(f"{prefix}done: {step} steps, mean samples/s {total_samples / max(elapsed, 1e-9):.1f}",
              flush=True)


def main(argv=None):
    train(parse_args(argv))


if __name__ == "__main__":
    main()
