"""What the two source articles claim, and what the course measured.

Article A, "分布式训练中的数据同步策略优化", and article B, "pytorch分布式部署數據怎樣同步"
(in Chinese, in the project's `shared/seeds/`): each technical claim is a row of `CLAIMS`,
checked by one cell of the lesson it names with `check(id, holds, measured)`, so a verdict
that stops being true fails that notebook under nbval.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """One claim of the articles: its `id` (A<n> or B<n>: article A or B), the `quote`, its
    English `translation`, our `verdict`, and the `lesson` whose `claims.check` measures it.
    """
    id: str
    quote: str
    translation: str
    verdict: str
    lesson: int

    def __post_init__(self):
        if not (self.id[:1] in "AB" and self.id[1:].isdigit()):
            raise ValueError(f"id must be 'A<n>' or 'B<n>' (article A or B), got {self.id!r}")
        if not 0 <= self.lesson <= 11:
            raise ValueError(f"lesson must be 0..11, got {self.lesson}")


CLAIMS: tuple[Claim, ...] = (
    Claim("A1", "AllReduce: 最常用的同步方式，通过Reduce-Scatter和AllGather操作实现梯度聚合",
          "AllReduce, the commonest way, sums gradients by a reduce-scatter then an all-gather",
          "true for the ring: its two phases are a reduce-scatter and an all-gather, which "
          "together equal the built-in all_reduce; a tree does not split this way (each of "
          "its messages carries the whole tensor)", 1),
    Claim("A2", "Parameter Server: 异步更新机制，允许部分参数先更新",
          "a parameter server is an asynchronous update mechanism that lets some parameters "
          "update first",
          "false: a parameter server can be synchronous (then it trains exactly like one "
          "process), asynchronous or of bounded staleness; asynchrony is a choice", 4),
    Claim("A3", "Ring AllReduce: 基于环形网络的优化版本",
          "ring AllReduce is an optimized version based on a ring network",
          "false: the ring is a logical order of ranks laid over any network (here a "
          "switch); it is bandwidth-optimal, and not the fastest for small messages", 2),
    Claim("A4", "opt = tf.train.AdamOptimizer(0.001 * hvd.size())",
          "multiply the learning rate by the number of workers",
          "true only below the critical batch and with warm-up (Goyal et al., for SGD): "
          "measured past it (batches 32 to 512, fitted critical batch under 16), the linearly "
          "scaled rate fails where a retuned one trains", 9),
    Claim("A5", "# 应用梯度压缩（可选） # opt = hvd.DistributedOptimizer(opt)",
          "hvd.DistributedOptimizer is optional gradient compression",
          "false: the wrapper is what averages the gradients (without it the ranks train "
          "apart); compression is its compression= argument", 8),
    Claim("A6", "# Horovod梯度压缩示例 hvd.broadcast_parameters(model.state_dict(), root_rank=0)",
          "hvd.broadcast_parameters is gradient compression",
          "false: it copies rank 0's parameters once, at the start; it sends no gradient", 8),
    Claim("A7", "对于大规模模型，可使用梯度压缩减少通信开销",
          "for large models, gradient compression reduces communication overhead",
          "true only when the step is communication-bound and the compressor's own time "
          "and accuracy cost are paid back", 7),
    Claim("A8", "通过梯度累积减少同步频率，适用于显存受限场景",
          "gradient accumulation reduces how often ranks synchronize",
          "true only when the micro-batches skip the allreduce (DDP's no_sync); the "
          "article's loop, under DDP, still synchronizes every micro-batch", 5),
    Claim("A9", "loss = loss / accumulation_steps",
          "dividing the loss by the accumulation steps gives the big batch's gradient",
          "true only for a mean loss over equal micro-batches; with a per-token loss or "
          "uneven micro-batches it weights samples unequally", 5),
    Claim("A10", "根据网络带宽调整同步频率",
          "adjust the synchronization frequency to the network bandwidth",
          "true: on a slow link, synchronizing every H steps (local SGD, DiLoCo) cuts "
          "the traffic H-fold, at a cost in loss per step that the lesson measures", 9),
    Claim("A11", "使用混合精度训练减少通信数据量",
          "mixed-precision training reduces the data communicated",
          "true only when the gradients travel in 16 bits (fp16/bf16 parameters, or a "
          "compression hook); autocast with fp32 parameters sends the same bytes", 7),
    Claim("A12", "合理设置batch size以平衡吞吐量和收敛速度",
          "set the batch size to balance throughput and convergence",
          "true: past the critical batch fitted from the tuned steps, a bigger batch no "
          "longer cuts the steps in proportion", 9),
    Claim("A13", "在高延迟网络中考虑异步更新策略",
          "consider asynchronous updates on high-latency networks",
          "true only where waiting for other workers dominates, and not the first thing to "
          "try: on a 40 ms link a latency-optimal allreduce (recursive doubling, log2 N "
          "latencies) steps faster than async PS, which beats sync PS and the ring (each "
          "worker still waits for its own round trip); async's loss cost per update is within "
          "the seed spread here, and its staleness has no bound", 4),
    Claim("B1", "計算節點會將梯度更新發送回參數服務器，"
          "參數服務器負責將這些梯度聚合并更新到模型參數中",
          "workers push gradients to the parameter server, which sums them and updates "
          "the parameters",
          "true: a synchronous parameter server computes the same update as an "
          "allreduce, with one server's link carrying every worker's gradient", 4),
    Claim("B2", "計算節點之間通過某種機制（如NCCL、Gloo等）進行通信，以同步模型參數的更新",
          "data-parallel nodes communicate (NCCL, Gloo) to synchronize parameter updates",
          "true only in effect: DDP broadcasts the parameters once and then averages "
          "gradients; the parameters stay equal because every rank applies the same update", 3),
    Claim("B3", "PyTorch支持多種集合通信庫，如NCCL、Gloo和MPI",
          "PyTorch supports NCCL, Gloo and MPI",
          "true only for builds that include them: the pip wheel has Gloo (and NCCL on "
          "CUDA), not MPI", 0),
    Claim("B4", "Batch Normalization的統計量（如均值和方差）需要在所有計算節點上保持一致",
          "BatchNorm's statistics must be kept consistent across nodes",
          "true only with SyncBatchNorm: plain BN under DDP normalizes each rank's batch "
          "by its own statistics", 6),
    Claim("B5", "PyTorch提供了torch.nn.parallel.SyncBatchNorm類",
          "PyTorch provides the class torch.nn.parallel.SyncBatchNorm",
          "false as written: the class is torch.nn.SyncBatchNorm", 6),
    Claim("B6", "可以使用梯度累積來模擬大批量訓練",
          "gradient accumulation simulates large-batch training",
          "true for the gradient (equal to the big batch's up to rounding); false for "
          "BatchNorm, which sees only the micro-batch", 5),
    Claim("B7", "這種方法可以減少通信開銷，但會增加訓練時間",
          "accumulation reduces communication overhead but increases training time",
          "false as stated: for the same samples it sends 1/K of the bytes of syncing every "
          "micro-batch and takes less time, not more; it is slower only than one pass over "
          "the same batch where that fits in memory (the allreduce then hides behind only "
          "the last micro-batch's backward)", 5),
    Claim("B8", "DistributedSampler用于確保每個計算節點處理不同的數據子集，從而實現數據同步",
          "DistributedSampler gives each node a different subset, which achieves data "
          "synchronization",
          "false: the sampler only partitions the data (padding so ranks get equal "
          "counts); the synchronization is DDP's gradient allreduce", 3),
    Claim("B9", "sampler.set_epoch(epoch)",
          "call set_epoch every epoch",
          "true: without it every epoch visits the same order; at this scale the held-out "
          "loss difference is within two paired standard errors of zero (5 seeds)", 3),
    Claim("B10", "dist.init_process_group(\"nccl\", rank=rank, world_size=world_size)",
          "initialize the process group with NCCL",
          "true only with one GPU per rank: NCCL has no CPU path, Gloo does", 0),
)

def check(claim_id: str, holds: bool, measured: str) -> None:
    """Assert that a lesson's measurement (`holds`: the cell's own comparison, `measured`:
    its numbers) still supports a claim's verdict, and print it."""
    by_id = {c.id: c for c in CLAIMS}
    if claim_id not in by_id:
        raise ValueError(f"claim_id must be one of {sorted(by_id)}, got {claim_id!r}")
    c = by_id[claim_id]
    if not holds:
        raise AssertionError(f"claim {claim_id}: the measurement ({measured}) no longer "
                             f"supports the verdict '{c.verdict}': fix the verdict or the lesson")
    print(f"claim {claim_id}, \"{c.translation}\": {c.verdict.split(':')[0]}. Measured: {measured}")


def table() -> str:
    """The claims as a Markdown table (lesson 00 and the README show it)."""
    rows = ["| | the article says | verdict | measured in |", "|---|---|---|---|"]
    for c in CLAIMS:
        said = f"{c.quote}<br>*{c.translation}*"
        rows.append(f"| {c.id} | {said} | {c.verdict} | lesson {c.lesson:02d} |")
    return "\n".join(rows)
