# gloo-rank.py RANK INIT_METHOD: one rank of a 2-process gloo job: init, all_reduce, barrier.
# Used by scripts/netns-e2e.sh and scripts/image-test.sh.
import datetime, sys
import torch, torch.distributed as dist
rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=init, world_size=2, rank=rank, timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == 3.0, t
dist.barrier()
print("rank %d all_reduce ok: %s" % (rank, t.item()), flush=True)
dist.destroy_process_group()
