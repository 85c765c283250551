"""The CRI v1 messages as a runtime writes them, built by protobuf, for the lab and the tests
(the reaper reads its own subset of them, reaper/runtime/api.proto)."""
