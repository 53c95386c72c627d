"""One rank of an mpi4py program on the cluster bed: an allreduce, then rank 0 prints one JSON
list of every rank's rank, host and a variable the launcher was given (to show what Hydra
forwards). One print from one rank: Hydra forwards each rank's stdout in chunks, so the lines of
two ranks printing at once can be glued or split."""

import json
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
records = comm.gather({"rank": comm.rank, "size": comm.size, "host": socket.gethostname(),
                       "sum": total, "marker": os.environ.get("BED_MARKER")})
if comm.rank == 0:
    print(json.dumps(records), flush=True)
