"""Checkpoint tiers on the CPU: memory-tier stall, peer replication, restore from peer against durable.

Prints, in one run, at each state size (a model of one float32 parameter plus its SGD momentum,
half the bytes each, captured with ``TrainState(model, optimizer).capture()``):

1. **memory-tier stall**: what :meth:`TrainingHook._memory_snapshot` does on the training thread
   (``capture`` + ``plan_layout`` + the target slot of a :class:`SlotPair` on ``/dev/shm`` +
   ``pack`` + ``slot.commit``), p50 and p99 over repeats, against ``Tensor.copy_`` of the same
   number of bytes into a preallocated, already-touched buffer, interleaved with it. The first
   snapshot (which grows and touches the slot) is shown apart and not in the percentiles.
2. **peer replication**: two processes (``torch.multiprocessing`` spawn, gloo on 127.0.0.1, a
   dedicated ``new_group(backend="gloo")``); one snapshot sent with ``send_snapshot`` and received
   with ``recv_snapshot`` into a warm slot, the sender taking the CRC32Cs first as a replication
   round does, in GB/s, against the same bytes over a plain TCP socket between the same two
   processes (``sendall`` / ``recv_into`` a preallocated buffer). Shown beside them, to tell the
   stream's own cost from gloo's: one plain gloo ``send``/``recv`` of the whole buffer, and one
   ``chunk_crcs`` pass over it.
3. **restore**: from peer memory (``recv_snapshot`` into a *new* slot, as on a spare, commit,
   ``unpack``, ``TrainState.apply_view`` into a fresh model and optimizer)
   against the durable tier (``torch.distributed.checkpoint`` saved once to a folder on disk;
   before each load the files are fsynced and evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)``,
   and ``fincore`` says how much of them was still in the page cache; then ``dcp.load`` into a
   template + ``apply``, as ``TrainingHook.resume`` does). A warm load (page cache) is shown too.

Every restore is checked against the state that was sent or saved. Medians, nearest-rank
percentiles; the default run takes about 2-3 minutes and 6 GiB (RAM and /dev/shm) at 1 GiB.

Not measured: the CUDA path (pinned buffers, side-stream copy, NCCL) — no GPU on this machine.

Usage: ``.venv/bin/python benchmarks/bench_checkpoint.py [--quick] [--sizes 64M,256M,1G]
[--durable-dir DIR]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from foreshock.mitigator.tiers.durable import durable_view  # noqa: E402
from foreshock.mitigator.tiers.layout import pack, plan_layout, unpack  # noqa: E402
from foreshock.mitigator.tiers.memory import SlotHeader, SlotPair, chunk_crcs  # noqa: E402
from foreshock.mitigator.tiers.state import TrainState  # noqa: E402
from foreshock.mitigator.tiers.transport import ProcessGroupTransport, recv_snapshot, send_snapshot  # noqa: E402

warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # dcp in one process: meant

MiB = 1 << 20
GB = 1e9
DEFAULT_SIZES = "64M,256M,1G"
QUICK_SIZES = "16M,64M"


# -- state ---------------------------------------------------------------------------------------
class _Model(torch.nn.Module):
    def __init__(self, numel: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(numel))


def _train_state(nbytes: int, seed: int = 0) -> tuple[_Model, torch.optim.Optimizer, TrainState]:
    """A model of ``nbytes / 2`` float32 weights whose SGD momentum is the other half (as after a step)."""
    model = _Model(max(1, nbytes // 8))
    with torch.no_grad():  # constant fills: random ones cost seconds per GiB here, and bytes are bytes
        model.weight.fill_(seed + 0.25)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt.state[model.weight]["momentum_buffer"] = torch.empty_like(model.weight).fill_(seed + 0.5)
    return model, opt, TrainState(model, opt)


def _sums(model: _Model, opt: torch.optim.Optimizer) -> tuple[float, float]:
    """A fingerprint of weights and momentum, to check a restore (no copy of the tensors)."""
    momentum = opt.state[model.weight]["momentum_buffer"]
    return float(model.weight.detach().sum(dtype=torch.float64)), float(momentum.sum(dtype=torch.float64))


def _parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    for suffix, mult in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * mult)
    return int(text)


def _fmt_size(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):g} GiB" if nbytes >= 1 << 30 else f"{nbytes / MiB:g} MiB"


def _pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (with fewer than 100 samples, p99 is the largest)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(-(-q * len(s) // 100)) - 1))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fs_of(path: Path) -> str:
    """The filesystem type ``path`` is on (longest mount prefix in /proc/mounts)."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mnt, fstype, *_ = line.split()
            if str(path.resolve()).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fstype
    except OSError:
        pass
    return kind


# -- 1. memory-tier stall ------------------------------------------------------------------------
def bench_stall(nbytes: int, repeats: int, shm: Path) -> dict[str, Any]:
    model, opt, ts = _train_state(nbytes)
    pair = SlotPair(shm, f"stall-{nbytes}")
    step = 0

    def snapshot() -> tuple[float, float, float, float]:
        nonlocal step
        step += 1
        t0 = time.perf_counter()
        layout, tensors = plan_layout(ts.capture())
        t1 = time.perf_counter()
        slot = pair.target()
        slot.invalidate()
        buf = slot.buffer(layout.nbytes)
        header = SlotHeader(0, 1, step, layout)
        t2 = time.perf_counter()
        pack(layout, tensors, buf)
        t3 = time.perf_counter()
        slot.commit(header)
        t4 = time.perf_counter()
        return t4 - t0, t1 - t0, t3 - t2, t4 - t3

    first = snapshot()[0]  # grows and touches slot 0
    snapshot()  # and slot 1
    layout_bytes = pair.newest()[1].nbytes
    src = torch.empty(layout_bytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty(layout_bytes, dtype=torch.uint8).fill_(0)  # touched: no page faults in the copy
    dst.copy_(src)
    stalls, copies = [], []
    for _ in range(repeats):
        stalls.append(snapshot())
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    slot, header = pair.newest()
    buf = slot.buffer(header.nbytes)
    crc = []
    for _ in range(3):
        t0 = time.perf_counter()
        chunk_crcs(buf, header.nbytes)
        crc.append(time.perf_counter() - t0)
    got = unpack(header.layout, buf)
    assert torch.equal(got["model"]["weight"], model.weight.detach()), "the snapshot differs from the model"
    del src, dst, got, slot, buf
    pair = None
    shutil.rmtree(shm / f"stall-{nbytes}", ignore_errors=True)
    total = [s[0] for s in stalls]
    return {
        "bytes": layout_bytes, "n": repeats, "first": first,
        "stall_p50": _pct(total, 50), "stall_p99": _pct(total, 99),
        "copy_p50": _pct(copies, 50), "copy_p99": _pct(copies, 99),
        "capture_p50": _pct([s[1] for s in stalls], 50), "pack_p50": _pct([s[2] for s in stalls], 50),
        "commit_p50": _pct([s[3] for s in stalls], 50), "crc_s": min(crc),
    }


# -- 2 and 3 (peer): two processes ---------------------------------------------------------------
def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("raw socket closed early")
        got += k


def _pair_worker(rank: int, port: int, sizes: list[int], repeats: int, shm: str, out: str) -> None:
    """Rank 0 holds the snapshot and sends; rank 1 receives and writes the figures to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results: list[dict[str, Any]] = []
    try:
        group = dist.new_group(backend="gloo")
        t = ProcessGroupTransport(group)
        # the raw-socket baseline: one TCP connection between the same two processes
        if rank == 1:
            listener = socket.create_server(("127.0.0.1", 0))
            addr = [listener.getsockname()[1]]
        else:
            addr = [None]
        dist.broadcast_object_list(addr, src=1)
        if rank == 0:
            sock = socket.create_connection(("127.0.0.1", addr[0]))
        else:
            sock, _ = listener.accept()
            listener.close()
        root = Path(shm) / f"peer-rank{rank}"
        for nbytes in sizes:
            results.append(_pair_size(rank, t, group, sock, root, nbytes, repeats))
            gc.collect()
        sock.close()
        if rank == 1:
            Path(out).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _pair_size(rank: int, t: ProcessGroupTransport, group: dist.ProcessGroup, sock: socket.socket,
               root: Path, nbytes: int, repeats: int) -> dict[str, Any]:
    pair = SlotPair(root, f"s{nbytes}")
    slot = pair.slots[0]
    r: dict[str, Any] = {}
    if rank == 0:
        model, opt, ts = _train_state(nbytes, seed=1)
        layout, tensors = plan_layout(ts.capture())
        buf = slot.buffer(layout.nbytes)
        pack(layout, tensors, buf)
        header = SlotHeader(0, 2, 1, layout)  # no CRCs yet: a round takes them, as PeerReplicator does
        slot.commit(header)
        fingerprint = [_sums(model, opt)]
        del model, opt, ts, tensors
        gc.collect()
    else:
        header, buf, fingerprint = None, None, [None]  # rank 1 learns the header from the stream
    dist.broadcast_object_list(fingerprint, src=0, group=group)

    def stream(h: SlotHeader | None) -> float:
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if rank == 0:
            for p in send_snapshot(t, 1, h, buf):
                p.wait()
        else:
            got = recv_snapshot(t, 0, slot)
            slot.commit(got)
            r["bytes"] = got.nbytes
        return time.perf_counter() - t0

    # 2. peer replication against a raw socket (first stream of each: warm-up, grows the receiving slot)
    stream(header)
    peer_s = [stream(header) for _ in range(repeats)]
    n = torch.tensor([header.nbytes if rank == 0 else 0])
    dist.broadcast(n, src=0, group=group)
    n = int(n)
    raw = buf.numpy()[:n] if rank == 0 else torch.empty(n, dtype=torch.uint8).fill_(0).numpy()
    raw_s = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if rank == 0:
            sock.sendall(memoryview(raw))
            sock.recv(1)  # the receiver's ack: the sender's time covers the whole transfer too
        else:
            _recv_exact(sock, memoryview(raw))
            sock.sendall(b"k")
        if i:
            raw_s.append(time.perf_counter() - t0)
    del raw
    gc.collect()
    # and one plain gloo send of the whole buffer: the stream's framing and CRCs left out
    whole = buf[:n] if rank == 0 else torch.empty(n, dtype=torch.uint8).fill_(0)
    gloo_s = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(whole, 1, group=group)
        else:
            dist.recv(whole, 0, group=group)
        if i:
            gloo_s.append(time.perf_counter() - t0)
    del whole
    if rank == 1:  # the receiver's warm slot goes: a spare restores into a new one
        slot = pair = None
        gc.collect()
        shutil.rmtree(root / f"s{nbytes}", ignore_errors=True)
    gc.collect()
    # 3. restore from peer memory: the holder's slot has its CRCs (as a received replica does)
    if rank == 0:
        header = SlotHeader(0, 2, 1, layout, tuple(chunk_crcs(buf, layout.nbytes)))
        slot.commit(header)
    else:
        model, opt, ts = _train_state(nbytes, seed=2)  # the spare's own model and optimizer
    restore = []
    for _ in range(repeats):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if rank == 0:
            for p in send_snapshot(t, 1, header, buf):
                p.wait()
            continue
        spare = SlotPair(root, f"spare-{nbytes}")  # a spare's node: no slot file yet
        target = spare.target()
        got = recv_snapshot(t, 0, target)
        target.commit(got)
        t1 = time.perf_counter()
        ts.apply_view(unpack(got.layout, target.buffer(got.nbytes)))
        t2 = time.perf_counter()
        restore.append((t2 - t0, t1 - t0, t2 - t1))
        assert _sums(model, opt) == tuple(fingerprint[0]), "peer restore differs from the sent state"
        target = spare = None
        gc.collect()
        shutil.rmtree(root / f"spare-{nbytes}", ignore_errors=True)
    if rank == 1:
        r.update(size=nbytes, peer_s=peer_s, raw_s=raw_s, gloo_s=gloo_s, restore=restore)
        del model, opt, ts
    slot = None
    pair = None
    gc.collect()
    shutil.rmtree(root / f"s{nbytes}", ignore_errors=True)
    return r


def bench_pair(sizes: list[int], repeats: int, shm: Path) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "pair.json"
        mp.start_processes(_pair_worker, args=(_free_port(), sizes, repeats, str(shm), str(out)),
                           nprocs=2, start_method="spawn")
        return json.loads(out.read_text())


# -- 3 (durable) ---------------------------------------------------------------------------------
def _evict(folder: Path) -> None:
    """fsync then drop every file of ``folder`` from the page cache (clean pages only: hence the fsync)."""
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _resident(folder: Path) -> float | None:
    """Fraction of ``folder``'s bytes in the page cache, from util-linux ``fincore`` (None without it)."""
    files = [str(p) for p in folder.rglob("*") if p.is_file()]
    total = sum(os.path.getsize(f) for f in files)
    if not files or not total or shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *files],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        return None
    return sum(int(x) for x in out.stdout.split()) / total


def bench_durable(nbytes: int, repeats: int, ckpt_root: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=ckpt_root, prefix="bench-checkpoint-") as d:
        folder = Path(d) / "step-00000001"
        model, opt, ts = _train_state(nbytes, seed=3)
        expected = _sums(model, opt)
        t0 = time.perf_counter()
        dcp.save(durable_view(ts.capture(), 0), checkpoint_id=str(folder))
        save_s = time.perf_counter() - t0
        del model, opt, ts
        gc.collect()
        model, opt, ts = _train_state(nbytes, seed=4)  # the restarted worker's fresh model and optimizer

        def load() -> float:
            t0 = time.perf_counter()
            template = ts.capture()
            dcp.load(durable_view(template, 0), checkpoint_id=str(folder))
            ts.apply(template)
            took = time.perf_counter() - t0
            assert _sums(model, opt) == expected, "durable restore differs from the saved state"
            return took

        cold, resident = [], []
        for _ in range(repeats):
            _evict(folder)
            resident.append(_resident(folder))
            cold.append(load())
        warm = [load() for _ in range(repeats)]
        on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {"save_s": save_s, "cold": cold, "warm": warm, "resident": resident, "on_disk": on_disk}


# -- report --------------------------------------------------------------------------------------
def _table(head: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(" --- " for _ in head) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def _ms(s: float) -> str:
    return f"{s * 1000:,.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes ({QUICK_SIZES}), fewer repeats")
    parser.add_argument("--sizes", help=f"state sizes, comma-separated (default {DEFAULT_SIZES})")
    parser.add_argument("--durable-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the durable tier writes (on disk, not tmpfs; default the temp dir)")
    args = parser.parse_args()
    spec = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    sizes = [_parse_size(s) for s in spec.split(",")]
    shm_parent = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    shm = Path(tempfile.mkdtemp(prefix="foreshock-bench-", dir=shm_parent))
    durable_fs = _fs_of(args.durable_dir)
    started = time.perf_counter()
    print(f"checkpoint tiers benchmark{' [quick]' * args.quick} — "
          f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    print(f"machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} cores "
          f"({len(os.sched_getaffinity(0))} usable), torch {torch.__version__} "
          f"({torch.get_num_threads()} intra-op threads), load average {os.getloadavg()[0]:.1f} at start")
    print(f"memory tier in {shm} ({_fs_of(shm)}); durable tier in {args.durable_dir} ({durable_fs})"
          + ("  [WARNING: tmpfs, not disk]" if durable_fs == "tmpfs" else ""))
    print("state: one float32 parameter + its SGD momentum (half the bytes each) + RNG states")
    print("NOT measured: the CUDA path (pinned memory, side-stream copy, NCCL) — no GPU on this machine")
    print()
    try:
        stall_rows, crc_s = [], []
        for nbytes in sizes:
            repeats = 5 if args.quick else max(8, min(64, (4 << 30) // nbytes))
            r = bench_stall(nbytes, repeats, shm)
            crc_s.append(r["bytes"] / r["crc_s"] / GB)
            gc.collect()
            stall_rows.append([
                _fmt_size(nbytes), str(r["n"]), _ms(r["first"]), _ms(r["stall_p50"]), _ms(r["stall_p99"]),
                f"{_ms(r['capture_p50'])} / {_ms(r['pack_p50'])} / {_ms(r['commit_p50'])}",
                f"{_ms(r['copy_p50'])} ({r['bytes'] / r['copy_p50'] / GB:.2f} GB/s)", _ms(r["copy_p99"]),
                f"{r['stall_p50'] / r['copy_p50']:.2f}", f"{r['stall_p99'] / r['copy_p99']:.2f}",
            ])
        print("1. memory-tier stall (capture + plan_layout + slot + pack + commit) against a plain copy_")
        _table(["state", "n", "first snapshot", "stall p50", "stall p99",
                "p50 capture+plan / pack / commit", "copy_ p50", "copy_ p99", "ratio p50", "ratio p99"],
               stall_rows)

        print(f"(section took {time.perf_counter() - started:.0f} s)\n")
        repeats = 2 if args.quick else 3
        mark = time.perf_counter()
        pair = bench_pair(sizes, repeats, shm)
        pair_s, mark = time.perf_counter() - mark, time.perf_counter()
        durable = [bench_durable(nbytes, 2 if args.quick else 3, args.durable_dir) for nbytes in sizes]
        durable_s = time.perf_counter() - mark

        rows = []
        for p, crc in zip(pair, crc_s, strict=True):
            peer, raw = statistics.median(p["peer_s"]), statistics.median(p["raw_s"])
            rows.append([_fmt_size(p["size"]), str(len(p["peer_s"])),
                         f"{p['bytes'] / peer / GB:.2f} GB/s ({_ms(peer)})",
                         f"{p['bytes'] / min(p['peer_s']) / GB:.2f} GB/s",
                         f"{p['bytes'] / raw / GB:.2f} GB/s ({_ms(raw)})",
                         f"{p['bytes'] / min(p['raw_s']) / GB:.2f} GB/s",
                         f"{p['bytes'] / statistics.median(p['gloo_s']) / GB:.2f} GB/s", f"{crc:.2f} GB/s",
                         f"{raw / peer:.2f}"])
        print("2. peer replication (send_snapshot/recv_snapshot over gloo into a warm slot, sender CRCs "
              "included) against a raw TCP socket, 127.0.0.1")
        _table(["state", "n", "peer median", "peer best", "raw socket median", "raw socket best",
                "gloo, one send/recv of the buffer, median", "chunk_crcs alone (one pass)",
                "ratio peer / raw"], rows)
        print(f"(figures 2 and 3 from peer memory: two processes, {pair_s:.0f} s)\n")

        rows = []
        for p, d in zip(pair, durable, strict=True):
            total, recv, load = sorted(p["restore"])[(len(p["restore"]) - 1) // 2]  # the median run
            cold, warm = statistics.median(d["cold"]), statistics.median(d["warm"])
            res = [x for x in d["resident"] if x is not None]
            res_txt = f"{max(res) * 100:.0f}%" if res else "unknown (no fincore)"
            rows.append([_fmt_size(p["size"]), str(len(p["restore"])),
                         f"{total:.3f} s ({recv:.3f} receive + {load:.3f} load)",
                         f"{cold:.3f} s", res_txt, f"{warm:.3f} s", f"{d['save_s']:.2f} s",
                         f"{cold / total:.2f}", f"{warm / total:.2f}"])
        print("3. restore: from peer memory (receive into a new slot, as on a spare, + unpack + clone "
              f"+ apply) against the durable tier (dcp.load + apply, {durable_fs})")
        _table(["state", "n", "peer median", "durable, evicted, median", "in page cache after evict (max)",
                "durable, page cache, median", "dcp.save (once)", "ratio durable evicted / peer",
                "ratio durable cached / peer"], rows)
        print("durable 'evicted': files fsynced then posix_fadvise(DONTNEED) before each load; the disk "
              f"is a VM's virtual disk, so the host may still cache it (durable part {durable_s:.0f} s)")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
