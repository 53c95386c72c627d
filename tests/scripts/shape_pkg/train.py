"""``python -m shape_pkg.train``: a DataLoader with its batch size and workers hard-coded.

    loader batch_size=32 num_workers=0
    step samples/s 1404.6 train_samples 1280 train_s 0.912 at 5123.456

(``at``: the system's monotonic clock, to compare with a probe's window.)
"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=32, num_workers=0, shuffle=True)
    print(f"loader batch_size={loader.batch_size} num_workers={loader.num_workers}", flush=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    samples, logged = 0, 0
    start = last = time.perf_counter()
    while True:
        for x, y in loader:
            time.sleep(0.02)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            samples += len(x)
            now = time.perf_counter()
            if now - last >= 0.5:
                print(f"step samples/s {(samples - logged) / (now - last):.1f}"
                      f" train_samples {samples} train_s {now - start:.3f}"
                      f" at {time.monotonic():.3f}")
                last, logged = now, samples


if __name__ == "__main__":
    main()
