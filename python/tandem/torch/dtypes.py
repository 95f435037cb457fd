"""torch dtypes and Tandem's dtype codes, both ways: ops.py passes a
tensor's code to C, join_protocol.py makes a joined rank's zeros from the
code in a descriptor. Below both."""
import torch

import tandem

CODES = {torch.float32: tandem.F32, torch.float64: tandem.F64, torch.float16: tandem.F16,
         torch.bfloat16: tandem.BF16, torch.int32: tandem.I32, torch.int64: tandem.I64,
         torch.uint8: tandem.U8}
TORCH_OF_CODE = {v: k for k, v in CODES.items()}
