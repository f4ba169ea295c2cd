"""How a channel norm's sets split over a sm_90 thread-block cluster: the settings of the
cluster kernel, each block's share of a set, and the steps its threads take over the share."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.runtime.cuda import MAX_DYNAMIC_SHARED
from generators.channel_site import ChannelNorm, channel_norm
from generators.compiler.registers import fewest_register_threads
from generators.site_graph import SiteGraph

# The most dynamic shared memory a block may opt into on sm_90, less the static part.
SHARED_LIMIT = MAX_DYNAMIC_SHARED - 1024
# The norms the cluster kernel takes (instance norm as group norm with a group a channel).
CLUSTER_NORMS = ("group_norm", "instance_norm", "batch_norm")



def share_of(set_size: int, cluster: int, vec: int) -> int:
    """A block's share of a set, in whole vectors."""
    return -(-set_size // (cluster * vec)) * vec


def steps_of(share: int, threads: int, vec: int) -> int:
    """The vector steps a thread takes over a block's share."""
    return -(-share // (threads * vec))


@dataclass(frozen=True)
class ClusterNormConfig:
    # Blocks an SM follow the share a block holds: 8 × 256 at 16×512×64² group norm holds
    # 32 KB a block, six blocks an SM; 2 × 256, one block an SM, ran much slower on an H200
    # (bench/NOTES.md, fourth round). The rules' drafts give the fastest settings per site.
    cluster: int = 8  # blocks sharing one set of values
    threads: int = 256  # per block
    vector: int = 1  # values a thread moves per step: 4 = one 16-byte fp32 load a tensor
    # Where the vector kernel keeps its share between the statistics and the output: "shared"
    # memory, or "registers", every step's loads issued before the first is used.
    held: str = "shared"

    def describe(self) -> str:
        moves = f", {self.vector}-value vectors" if self.vector > 1 else ""
        where = "registers" if self.held == "registers" else "shared memory"
        return (f"each set of values held in the {where} of a {self.cluster}-block "
                f"cluster, {self.threads} threads a block{moves}")


def set_sizes(norm: ChannelNorm) -> tuple[int, int]:
    """(sets, values a set): a sample's group for group norm, a channel for batch norm."""
    n, c, spatial = norm.site.shape[0], norm.site.shape[1], math.prod(norm.site.shape[2:])
    return (n * norm.groups, c // norm.groups * spatial) if norm.groups else (c, n * spatial)


def register_threads(graph: SiteGraph, cluster: int, most: int = 64,
                     vector: int = 4) -> int | None:
    """The fewest threads, in pairs of warps and at least 128, that hold a block's share in
    registers at `most` values a thread or fewer; None where 1024 threads cannot. On an H200
    group norm 16×512×64² ran fastest at 64 values a thread (8 × 128, ahead of 32 at 8 × 256)
    and batch norm 32×256×56² at 40 (8 × 320, ahead of 52 at 8 × 256), so the rules draft
    both 64 and 40 (bench/NOTES.md, eighth round)."""
    _, set_size = set_sizes(channel_norm(graph, CLUSTER_NORMS))
    fewest = fewest_register_threads(share_of(set_size, cluster, vector), most, vector)
    return None if fewest is None else fewest[0]
