"""`tune_toy` as many scripts are written: it asks torch.distributed whether a process group is
up (to log from rank 0 only) and never starts one. Its source names torch.distributed, so the
tuner cannot rule ranks out by reading it and learns from a probe of two ranks that they train
alone."""

import torch.distributed as dist

import tune_toy


def is_main() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


if __name__ == "__main__":
    if is_main():
        print("tune_toy_logs_rank: logging from this process", flush=True)
    tune_toy.main()
