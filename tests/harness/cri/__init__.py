"""The CRI v1 messages as protobuf builds them, for the lab and the tests (the reaper itself
reads its few fields with reaper.runtime.wire, checked against these)."""
