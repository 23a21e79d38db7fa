"""Rank bodies of the accord.device tests (a module of its own so `accord.run`'s spawned
children can import it). Every rank uses the host placement (no GPU) and drives its proxy with a
HostProducer, which writes descriptors in the GPU's layout with the GPU producers' protocol."""

from __future__ import annotations

import ctypes

import numpy as np

import accord
import accord.device as ad

WINDOW = 4096
PUTS = 40  # more than SLOTS: the producer is held back by a full ring and must lose nothing
SLOTS = 8
CHUNK = 64
TIMEOUT_S = 20.0


def _device_comm() -> tuple[accord.Communicator, ad.DeviceComm]:
    comm = accord.Communicator(timeout=TIMEOUT_S)
    dc = ad.DeviceComm(comm, None, slot_count=SLOTS, user_signals=2, counters=2, producer_timeout=TIMEOUT_S)
    return comm, dc


def _source(rank: int) -> np.ndarray:
    return ((np.arange(WINDOW) * 7 + rank * 31) % 251 + 1).astype(np.uint8)


def puts_and_signals() -> dict[str, object]:
    """Each rank puts PUTS chunks of its source array into the next rank's receive array, each
    with a signal add and a counter bump, then a put_value with a signal set; checks what
    landed byte for byte and that every signal and counter counted each descriptor once."""
    comm, dc = _device_comm()
    rank, world = dc.rank, dc.world_size
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    out: dict[str, object] = {}
    try:
        comm.barrier()
    except accord.ShutdownError as e:
        out["handed_over"] = str(e)
    comm.close()  # a no-op: the DeviceComm owns the communicator now
    out["comm_state"] = (comm.closed, repr(comm))
    recv = np.zeros(WINDOW, np.uint8)
    send = _source(rank)
    assert dc.register_window(recv) == 0 and dc.register_window(send) == 1
    info = dc.window_info(0)
    assert info == (recv.ctypes.data, WINDOW, "host"), info
    # The table a kernel would receive (host placement: a host address), per device.cuh.
    table = dc.table_ptr
    fields = [ctypes.c_uint32.from_address(table + 4 * i).value for i in range(7)]
    assert fields[0] == ad.DEVICE_LAYOUT_VERSION and fields[1:3] == [rank, world], fields
    assert fields[6] == 2, fields  # window_count

    producer = dc.host_producer(0)
    for i in range(PUTS):
        producer.push(
            op=ad.OP_PUT,
            peer=nxt,
            window=0,
            dst_offset=i * CHUNK,
            src_window=1,
            src_offset=i * CHUNK,
            bytes=CHUNK,
            signal_op=ad.SIGNAL_ADD,
            signal_id=0,
            signal_value=1,
            flags=ad.FLAG_COUNTER,
            counter_id=0,
        )
    value = 0x1122334455667788
    producer.push(
        op=ad.OP_PUT_VALUE,
        peer=nxt,
        window=0,
        dst_offset=WINDOW - 8,
        src_offset=value,
        bytes=8,
        signal_op=ad.SIGNAL_SET,
        signal_id=1,
        signal_value=7,
    )
    assert dc.wait_signal(0, PUTS, timeout=TIMEOUT_S) >= PUTS
    assert dc.wait_signal(1, 7, timeout=TIMEOUT_S) >= 7
    assert dc.wait_completed(0, PUTS + 1, timeout=TIMEOUT_S) == PUTS + 1
    dc.barrier()  # every rank's descriptors completed: nothing more can arrive
    expected = _source(prev)
    landed = PUTS * CHUNK
    assert (recv[:landed] == expected[:landed]).all(), "a put's bytes differ"
    assert not recv[landed : WINDOW - 8].any(), "bytes outside every put were written"
    assert int.from_bytes(recv[WINDOW - 8 :].tobytes(), "little") == value
    out["signals"] = (dc.read_signal(0), dc.read_signal(1))
    out["counter"] = dc.counter(0)
    stats = dc.stats()
    out["executed"] = stats["descriptors_executed"]
    out["bytes_put"] = stats["bytes_put"]
    out["ring_full_events"] = stats["ring_full_events"]
    out["errors"] = dc.errors()
    dc.reset_signal(0)
    out["after_reset"] = dc.read_signal(0)
    dc.close()
    dc.close()  # idempotent
    try:
        dc.read_signal(0)
    except accord.ShutdownError as e:
        out["after_close"] = str(e)
    try:
        producer.push(op=ad.OP_SIGNAL, peer=nxt, signal_op=ad.SIGNAL_ADD, signal_id=0, signal_value=1)
    except accord.ShutdownError as e:
        out["push_after_close"] = str(e)
    return out


def malformed() -> dict[str, object]:
    """Rank 0 pushes malformed descriptors (and one good put) at rank 1, in communicator-owned
    windows; rank 1 reports its window's bytes and its signal, rank 0 the errors."""
    _, dc = _device_comm()
    rank, world = dc.rank, dc.world_size
    dst, src = dc.alloc_window(WINDOW), dc.alloc_window(WINDOW)
    dc.write_window(src, 0, bytes([0xEE]) * WINDOW)
    dc.barrier()
    out: dict[str, object] = {}
    if rank == 0:
        good = dict(
            op=ad.OP_PUT,
            peer=1,
            window=dst,
            dst_offset=0,
            src_window=src,
            src_offset=0,
            bytes=16,
            signal_op=ad.SIGNAL_ADD,
            signal_id=0,
            signal_value=1,
        )
        bad = [
            dict(good, peer=world),
            dict(good, window=5),
            dict(good, src_window=9),
            dict(good, dst_offset=WINDOW - 10, bytes=11),
            dict(good, dst_offset=2**64 - 3, bytes=8),
            dict(good, src_offset=WINDOW, bytes=1),
            dict(good, bytes=0),
            dict(good, op=9),
            dict(good, signal_op=7),
            dict(good, signal_id=99),
            dict(good, flags=ad.FLAG_COUNTER, counter_id=5),
            dict(good, op=ad.OP_PUT_VALUE, bytes=9),
        ]
        producer = dc.host_producer(0)
        for d in bad:
            producer.push(**d)
        producer.push(**dict(good, dst_offset=100))
        dc.wait_completed(0, len(bad) + 1, timeout=TIMEOUT_S)
        out["errors"] = dc.errors()
        out["ring_error_word"] = dc.ring_control(0)[2]
        out["stats_errors"] = dc.stats()["descriptor_errors"]
    else:
        dc.wait_signal(0, 1, timeout=TIMEOUT_S)
    dc.barrier()
    if rank == 1:
        out["window"] = dc.read_window(dst, 0, WINDOW)
        out["signal"] = dc.read_signal(0)
        try:
            dc.wait_signal(1, 1, timeout=0.2)
        except accord.TimeoutError as e:
            out["timeout"] = str(e)
    bad_calls = (
        lambda: dc.read_signal(99),
        lambda: dc.counter(2),
        lambda: dc.host_producer(3),
        lambda: dc.read_window(dst, WINDOW - 4, 2**62),
    )
    for call in bad_calls:
        try:
            call()
        except accord.InvalidRequestError as e:
            out.setdefault("bad_ids", []).append(str(e))  # type: ignore[union-attr]
    try:
        dc.register_window(np.zeros(8, np.uint8)[::2])
    except accord.InvalidBufferError as e:
        out["strided"] = str(e)
    dc.close()
    return out


class FakeCudaTensor:
    """Says it is CUDA memory of GPU 1 (DLPack device type 2); exporting it fails, so a refusal
    must come from the device alone, before any export."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 1)

    def __dlpack__(self, **kwargs: object) -> object:
        raise AssertionError("the device check must refuse this object before exporting it")


def refused_before_hand_over() -> list[str]:
    """Arguments refused before the hand-over (a bad configuration, a GPU that cannot be
    opened) leave the Communicator usable; a CUDA object on the host placement is refused
    without being exported. Returns the messages in that order."""
    comm = accord.Communicator(timeout=TIMEOUT_S)
    messages = []
    for kwargs in ({"rings": 0}, {"slot_count": 12}, {"counters": 0}, {"descriptors_per_turn": 0}):
        try:
            ad.DeviceComm(comm, None, **kwargs).close()  # type: ignore[arg-type]
        except accord.InvalidRequestError as e:
            messages.append(str(e))
    try:
        ad.DeviceComm(comm, gpu=4095).close()
    except accord.ConfigError as e:
        messages.append(str(e))
    comm.barrier()
    with ad.DeviceComm(comm, None) as dc:
        try:
            dc.register_window(FakeCudaTensor())
        except accord.InvalidBufferError as e:
            messages.append(str(e))
    return messages


def torch_cpu_window() -> tuple[int, str, int]:
    """A torch CPU tensor as a window (DLPack): rank 0 puts an inline value into rank 1's
    tensor; returns (the value read from the tensor, the window's kind, the signal)."""
    import torch

    _, dc = _device_comm()
    tensor = torch.zeros(64, dtype=torch.uint8)
    assert dc.register_window(tensor) == 0
    info = dc.window_info(0)
    if dc.rank == 0:
        dc.host_producer(0).push(
            op=ad.OP_PUT_VALUE, peer=1, dst_offset=8, src_offset=0xA5A5, bytes=2, signal_op=ad.SIGNAL_ADD, signal_value=1
        )
        signal = 0
    else:
        signal = dc.wait_signal(0, 1, timeout=TIMEOUT_S)
    dc.barrier()
    value = int.from_bytes(bytes(tensor[8:10].tolist()), "little")
    assert info[0] == tensor.data_ptr(), (info, tensor.data_ptr())
    dc.close()
    return value, info[2], signal
