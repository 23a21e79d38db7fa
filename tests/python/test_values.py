"""Addresses and descriptors: strings, pickling, equality; ScatterDst arguments."""

from __future__ import annotations

import json
import pickle

import pytest

import accord


def test_address_roundtrips_through_str_and_pickle(engine: accord.Engine) -> None:
    address = engine.address
    assert address.id == engine.id
    assert accord.Address.parse(str(address)) == address
    copy = pickle.loads(pickle.dumps(address))
    assert copy == address and hash(copy) == hash(address)
    assert isinstance(json.loads(str(address)), dict)
    assert "Address(id=0x" in repr(address)


def test_descriptor_roundtrips_through_str_and_pickle(engine: accord.Engine) -> None:
    region = engine.alloc(4096)
    d = region.descriptor
    assert d.nbytes == 4096 and d.engine_id == engine.id
    assert accord.Descriptor.parse(str(d)) == d
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(d, protocol)) == d
    assert len({d, pickle.loads(pickle.dumps(d))}) == 1
    assert d != engine.alloc(4096).descriptor


def test_malformed_strings_raise_value_errors() -> None:
    with pytest.raises(accord.InvalidRequestError, match="pass the exact string"):
        accord.Descriptor.parse("{not json")
    with pytest.raises(ValueError):
        accord.Address.parse('{"id": 1}')


def test_scatter_dst_is_keyword_only(engine: accord.Engine) -> None:
    d = engine.alloc(64).descriptor
    s = accord.ScatterDst(d, nbytes=8, dst_offset=16, src_offset=4)
    assert (s.nbytes, s.dst_offset, s.src_offset, s.dst) == (8, 16, 4, d)
    with pytest.raises(TypeError):
        accord.ScatterDst(d, 8, 16)  # type: ignore[misc]


def test_error_hierarchy() -> None:
    assert issubclass(accord.TimeoutError, TimeoutError)
    assert issubclass(accord.InvalidBufferError, accord.InvalidRequestError)
    assert issubclass(accord.InvalidBufferError, ValueError)
    assert issubclass(accord.PeerError, ConnectionError)
    for cls in (accord.ConfigError, accord.RemoteAccessError, accord.ShutdownError, accord.TimeoutError):
        assert issubclass(cls, accord.AccordError)


def test_communicator_and_run_are_exported() -> None:
    assert "Communicator" in accord.__all__ and "run" in accord.__all__
    assert accord.Communicator.__module__ == "accord"


def test_bad_configuration_says_what_to_fix() -> None:
    with pytest.raises(accord.ConfigError, match="not an IP address"):
        accord.Engine(nics=["not-an-ip"], ignore_env=True)
    with pytest.raises(accord.ConfigError, match="unknown congestion control.*cubic, swift, eqds, fixed"):
        accord.Engine(congestion_control="warp-drive", ignore_env=True)
    with pytest.raises(accord.ConfigError, match="workers_per_nic"):
        accord.Engine(workers_per_nic=0, ignore_env=True)
