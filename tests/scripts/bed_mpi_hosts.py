"""One rank of an mpi4py program on the cluster bed: an allreduce, then one JSON line with the
rank, its host and a variable the launcher was given (to show what Hydra forwards)."""

import json
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
print(json.dumps({"rank": comm.rank, "size": comm.size, "host": socket.gethostname(),
                  "sum": total, "marker": os.environ.get("BED_MARKER")}), flush=True)
