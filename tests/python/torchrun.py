"""torchrun for Debian's torch 1.13 under Python 3.11: torch.distributed.run
with one fix, then its main() (the real agent: it serves torch's TCPStore on
MASTER_PORT, starts and watches the workers).

The bug: Std.from_str("0") (the default of --redirects and --tee) looks the
value up by iterating the IntFlag, and Python 3.11 no longer yields the zero
member NONE when iterating a flag, so it returns None and the agent dies in
to_map ("'NoneType' object has no attribute 'get'") before starting a worker.
Here from_str builds the member from its value, which every Python does.

    python3 tests/python/torchrun.py --nproc_per_node=2 script.py"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


if api.Std.from_str("0") is None:  # the bug is there: fix it (a fixed torch is left alone)
    api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main
    sys.exit(main())
