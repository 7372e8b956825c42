"""A CPU stand-in for a worker of tests/gpu/soak_world.py (test_soak_orchestration.py starts it
in place of the real one): the same command line and store protocol (a standby's wait, results,
the faulty rank noting its kill and SIGKILLing itself), with no CUDA and no NCCL."""

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import soak_world as soak
import torch.distributed as dist

args = soak.parse_args(sys.argv[1:])
soak.die_with_parent(args.parent_pid)
# What the test checks afterwards, one file per process (STAND_IN_RECORDS, a folder).
record = {"standby": args.standby is not None}
record_path = Path(os.environ["STAND_IN_RECORDS"]) / f"{os.getpid()}.json"
record_path.write_text(json.dumps(record))  # a standby killed while waiting leaves this one
store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=60))
if args.standby is not None:
    args.first_cycle = soak.await_turn(store, args.standby)
    record["took_over"] = time.monotonic()
rank = args.worker_rank
for cycle in range(args.first_cycle, args.cycles):
    plan = soak.plan_cycle(args.seed, cycle, args.warmup, args.world)
    time.sleep(0.2)  # the cycle's work: a kill comes after the orchestrator's next standby
    if plan.fault.kind == "kill" and rank == soak.faulty_rank(args.world):
        record["killed"] = time.monotonic()
        record_path.write_text(json.dumps(record))
        store.set(soak.killed_key(cycle), str(record["killed"]))
        os.kill(os.getpid(), signal.SIGKILL)
    wanted = soak.expected_detections(plan, args.world).get(rank)
    result = {
        "failures": [],
        "detections": {wanted: 0.1} if wanted else {},
        "errors": {},
        "checks": 1,
        "seconds": 0.01,
        "destroy_s": 0.01,
    }
    if rank == 0:
        result["resources"] = {"device_used_mib": 0.0, "allocated_bytes": 0, "fds": 0, "threads": 0}
        if cycle == args.cycles - 1:
            result["baseline"] = result["resources"]
    store.set(soak.result_key(cycle, rank), json.dumps(result))
record_path.write_text(json.dumps(record))
