"""gpt.run.nodes on a job of two ranks whose second differs only in its clock (the network tests, in
tests/run/test_two_nodes.py, cannot give a namespace its own time), and the lost ranks a peer's address names."""

import os
import socket
from dataclasses import dataclass

from gpt.config import load_config
from gpt.run.distributed import Dist, Peer
from gpt.run.nodes import check_nodes


@dataclass
class TwoRanks(Dist):
    """Rank 0 of two; rank 1 gathers what rank 0 does, its clock ``skew`` seconds off."""

    skew: float = 0.0

    def gather_objects(self, obj) -> list:
        if isinstance(obj, tuple):  # the facts: (code, config, time, probe)
            return [obj, (*obj[:2], obj[2] + self.skew, obj[3])]
        return [obj, obj]


def two_ranks(skew):
    return TwoRanks(world_size=2, peers=[Peer("node0", 10), Peer("node1", 10)], skew=skew)


def test_clocks_apart_are_said_not_refused(train_yaml, tmp_path):
    cfg = load_config(train_yaml())
    assert check_nodes(two_ranks(5.0), cfg, tmp_path) == []  # within the tolerance
    (note,) = check_nodes(two_ranks(-95.0), cfg, tmp_path)
    assert note == (
        "warning: the clock of node1 (rank 1) is 95 s behind rank 0's on node0; the run's records carry rank 0's "
        "time, but logs across nodes will not line up: sync the clocks (NTP)"
    )
    assert list(tmp_path.glob(".nodes-probe-*")) == []  # the probe is removed


def test_a_failed_collective_names_the_machine_whose_address_gloo_lost():
    here = Peer(socket.gethostname(), os.getpid(), ("10.0.0.1",))
    d = Dist(world_size=3, peers=[here, Peer("far", 5, ("10.0.0.2",)), Peer("far", 6, ("10.0.0.2",))])
    lost = d.lost_ranks(RuntimeError("[pair.cc:537] Read error [10.0.0.2]:41704: Connection reset by peer. This"))
    assert lost == [1, 2] and d.speaks_for(lost)
    assert d.lost_ranks(RuntimeError("Read error [10.9.9.9]:41704: Connection closed by peer")) == []  # unknown
    assert d.lost_ranks(RuntimeError("CUDA out of memory")) is None  # not a lost peer
