"""A script that sets its own thread count (and a DataLoader worker that reports its own).

    threads after set_num_threads(3): 3
    worker 0 threads 1
"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(3)
print(f"threads after set_num_threads(3): {torch.get_num_threads()}", flush=True)


def report(worker_id):
    print(f"worker {worker_id} threads {torch.get_num_threads()}", flush=True)


data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
loader = DataLoader(data, batch_size=16, num_workers=1, worker_init_fn=report,
                    persistent_workers=True)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
while True:
    for x, y in loader:
        time.sleep(0.02)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
