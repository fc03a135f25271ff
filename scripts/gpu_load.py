"""A GPU load for screenshots and probes: matmuls with a real 0.3 s gap each step."""
import torch, time, sys
d = sys.argv[1] if len(sys.argv) > 1 else "bf16"
x = torch.randn(8192, 8192, device="cuda")
w = torch.randn(8192, 8192, device="cuda")
t_end = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 60)
print("ready", flush=True)
while time.time() < t_end:
    if d == "bf16":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(20): y = x @ w
    else:
        for _ in range(5): y = x @ w
    torch.cuda.synchronize()
    time.sleep(0.3)  # a real gap: idle ~ every step
